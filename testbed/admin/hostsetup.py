"""The Python half of host setup: OVS daemons and the cached guest image (and the other
recipes named on the command line: the test suite's images). Idempotent."""
from __future__ import annotations

import logging
import sys

from testbed.errors import TestbedError
from testbed.guests import images
from testbed.host.net import ovsd


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="setup: %(message)s")
    try:
        # Started here, before any bridge exists, so userspace TSO can be set at start-up
        # on a host without the OVS kernel module (see testbed/host/net/ovsd.py).
        ovsd.ensure_running()
        for recipe in [None, *(sys.argv[1:] if argv is None else argv)]:
            img = images.ensure(images.load_recipe(recipe) if recipe else None)
            logging.info("guest image %s-%s ready (%s)", img.name, img.digest, img.disk)
    except TestbedError as e:
        print(f"setup: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
