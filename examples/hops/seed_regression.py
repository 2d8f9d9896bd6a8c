"""A regression seeded in one hop, and `compare` naming that hop.

Two runs of the same traced namespace bridge cell (netns-bridge-cell.yaml): A as it is, B
with a netfilter table on the bridge port the requests enter by (a netdev ingress chain of
RULES rules that never match: each packet is checked against all of them, between that
port's receive and the bridge's transmit, which is the hop ``req.2.switch``). The table is
put on that device before each of B's samples, by a per-sample hook of the public API, and
deleted after it (on every way out). Then ``compare A B`` is printed: its notes should name
``req.2.switch``.

Run as root, from the repository (needs netperf, nftables and bpftrace):

    python examples/hops/seed_regression.py [RULES]

It takes a few minutes (two runs of ten samples each, the tracer compiling before each
traced sample).
"""
from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

from testbed import api

HERE = Path(__file__).resolve().parent
TABLE = f"tb-seed-{os.getpid()}"


class NftRules(api.SampleHook):
    """``rules`` never-matching rules on the netdev ingress of the first bridge port."""

    name = "seed"

    def __init__(self, rules: int) -> None:
        self.rules = rules

    @contextlib.contextmanager
    def window(self, window: api.SampleWindow) -> Iterator[None]:
        # the path's devices, client to server: the client's veth end, then the bridge port
        # on the host's side that its requests enter by
        port = next(name for name, netns, way in window.paths[0].devices if netns is None and way == "rx")
        rules = "".join(f"    ip daddr 198.19.{i // 250}.{i % 250 + 1} counter drop\n" for i in range(self.rules))
        text = (f"table netdev {TABLE} {{\n  chain ingress {{\n"
                f"    type filter hook ingress device \"{port}\" priority 0; policy accept;\n{rules}  }}\n}}\n")
        subprocess.run(["nft", "-f", "-"], input=text, text=True, check=True)
        try:
            yield
        finally:
            subprocess.run(["nft", "delete", "table", "netdev", TABLE], check=False)


def main() -> int:
    rules = int(sys.argv[1]) if len(sys.argv) > 1 else 300
    topology = api.load_topology(HERE / "netns-bridge-cell.yaml")
    a = api.run(topology, progress=print, index=False)
    b = api.run(topology, progress=print, hooks=[NftRules(rules)], index=False)
    print(f"A: {a.run_dir}\nB: {b.run_dir} ({rules} nftables rules on the bridge port's ingress)")
    print(api.render_comparison(api.compare(a.run_dir, b.run_dir)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
