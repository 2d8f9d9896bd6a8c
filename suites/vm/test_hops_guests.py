"""Per-hop latency between two guests: `testbed run` on the Linux bridge with a traced
request/response profile. The host's tracer follows one request in eight by its TCP
sequence number (in host byte order: read as the wire has it, its low bits are the
sequence's high byte, the same for a whole connection, and no request was ever followed)
and times the bridge hop both ways; the default image has no bpftrace, so each guest's
hops are given as not observed, with the reason."""
from __future__ import annotations

import json
import os

import pytest

from testbed._suite_plugin import run_cli
from testbed.admin import capabilities
from testbed.host import shareduse

pytestmark = pytest.mark.vm

TOPOLOGY = """\
name: hops-guests
guests:
  - {name: g1, memory_mib: 1024, vcpus: 1}
  - {name: g2, memory_mib: 1024, vcpus: 1}
matrix:
  attachments: [bridge]
  profiles:
    - {name: tcp_rr, pattern: rr, message_size: 1, response_size: 1, duration: 3, hops: true}
  repetitions: {warmup: 0, min: 2, max: 2, rsd_target: 0}
"""


def test_a_traced_guest_cell_times_the_hosts_bridge_both_ways(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("needs root: starts guests and loads BPF programs")
    ok, why = capabilities.hop_tracing()
    if not ok:
        pytest.skip(f"hop tracing unavailable here: {why}")
    topo = tmp_path / "hops.yaml"
    topo.write_text(TOPOLOGY)
    p = run_cli(["run", str(topo)], env={"TESTBED_RESULTS": str(tmp_path / "res")}, timeout=900)
    assert p.returncode == 0, p.stderr[-3000:]
    run_dir = tmp_path / "res" / p.stdout.strip().splitlines()[-1].rsplit("/", 1)[1]
    traced_id = "bridge-qemu-mtu1500-conn1-tcp_rr-hops"
    samples = [json.loads(x) for x in (run_dir / "samples.jsonl").read_text().splitlines()]
    traced = [s for s in samples if s["cell"]["id"] == traced_id and s["status"] == "ok"]
    assert len(traced) == 2, [(s["cell"]["id"], s["status"], s["reason"]) for s in samples]
    for s in traced:
        rec = s["extra"]["hops"]
        hops = {h["id"]: h for h in rec["hops"]}
        tps, secs = s["metrics"]["transactions_per_s"], s["metrics"].get("duration_s", 3)
        for hid in ("req.1.switch", "resp.1.switch"):
            h = hops[hid]
            assert "not_observed" not in h, (hid, h)
            # one request in eight followed: about tps x seconds / 8 of them, each timed
            assert 0.5 * tps * secs / 8 <= h["n"] <= 1.5 * tps * secs / 8, (hid, h, tps)
            assert 0 < h["p50_us"] <= h["p99_us"], (hid, h)
        assert rec["tracers"]["host"]["follows_one_in"] == 8
        for hid in ("req.client_stack", "req.server_stack", "server_app"):
            assert "bpftrace not installed" in hops[hid]["not_observed"], hops[hid]
        # what the host saw, against netperf's median round trip: a part of it
        c = rec["closure"]
        assert 0 < c["sum_p50_us"] < c["tool_p50_us"], c
    assert not shareduse.left("tracefs")
