"""Study B's table: throughput against the number of chained OVS bridges, patch ports and veth."""
from __future__ import annotations

import os
import shutil

import pytest

from testbed import attachments, bench
from testbed.topology.model import Attachment

pytestmark = [pytest.mark.netns, pytest.mark.attach("netns")]


def test_chain_table_patch_and_veth():
    if os.geteuid() != 0:
        pytest.skip("needs root: creates namespaces and OVS bridges")
    if not shutil.which("netperf"):
        pytest.skip("netperf missing (Debian non-free)")
    why = attachments.unavailable(Attachment("ovs"))
    if why:
        pytest.skip(f"OVS unavailable: {why}")
    rows = bench.chain_table((1, 2, 4, 8), duration_s=2)
    assert {(r["link"], r["bridges"]) for r in rows} == {(l, n) for l in ("patch", "veth") for n in (1, 2, 4, 8)}
    for r in rows:
        assert r["ok"], r
        assert r["throughput_mbps"] > 0
    table = bench.format_chain(rows)
    print(table)
    assert len(table.splitlines()) == 5 and "failed" not in table
