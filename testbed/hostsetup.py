"""The Python half of host setup: OVS daemons and the cached guest image. Idempotent."""
from __future__ import annotations

import logging
import sys

from testbed import images
from testbed.errors import TestbedError


def main() -> int:
    logging.basicConfig(level=logging.INFO, format="setup: %(message)s")
    try:
        try:
            from testbed.hostnet import ovsd
        except ImportError:  # pragma: no cover - ovsd arrives with the OVS attachment
            ovsd = None
        if ovsd is not None:
            ovsd.ensure_running()
        img = images.ensure()
        logging.info("guest image %s-%s ready (%s)", img.name, img.digest, img.disk)
    except TestbedError as e:
        print(f"setup: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
