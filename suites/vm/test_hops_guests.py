"""Per-hop latency between two guests: `testbed run` on the Linux bridge with a traced
request/response profile. The host's tracer follows one request in eight by its TCP
sequence number (in host byte order: read as the wire has it, its low bits are the
sequence's high byte, the same for a whole connection, and no request was ever followed)
and times the bridge hop both ways. The default image has no bpftrace, so each guest's
hops are given as not observed, with the reason; the debian12-bpftrace image (built by the
test setup) has it, and every hop of the round trip is timed, stacks and hand-offs
included, and adds up to netperf's median."""
from __future__ import annotations

import json
import os

import pytest

from testbed._suite_plugin import run_cli
from testbed.admin import capabilities
from testbed.guests import images
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
  repetitions: {warmup: 0, min: REPS, max: REPS, rsd_target: 0}
"""


TRACED_ID = "bridge-qemu-mtu1500-conn1-tcp_rr-hops"
#: every hop of a round trip between two guests on a bridge
ROUND_TRIP = ("req.client_stack", "client.handoff", "req.1.switch", "server.handoff", "req.server_stack",
              "server_app", "resp.server_stack", "resp.1.switch", "resp.client_stack", "client_app")


def traced_run(tmp_path, image: str | None = None, reps: int = 2):
    """The traced samples (all ok) and run.json of a run of TOPOLOGY, ``reps`` rounds."""
    if os.geteuid() != 0:
        pytest.skip("needs root: starts guests and loads BPF programs")
    ok, why = capabilities.hop_tracing()
    if not ok:
        pytest.skip(f"hop tracing unavailable here: {why}")
    topo = tmp_path / "hops.yaml"
    topo.write_text(TOPOLOGY.replace("REPS", str(reps)))
    env = {"TESTBED_RESULTS": str(tmp_path / "res"), **({"TESTBED_IMAGE": image} if image else {})}
    p = run_cli(["run", str(topo)], env=env, timeout=900)
    assert p.returncode == 0, p.stderr[-3000:]
    run_dir = tmp_path / "res" / p.stdout.strip().splitlines()[-1].rsplit("/", 1)[1]
    samples = [json.loads(x) for x in (run_dir / "samples.jsonl").read_text().splitlines()]
    traced = [s for s in samples if s["cell"]["id"] == TRACED_ID and s["status"] == "ok"]
    assert len(traced) == reps, [(s["cell"]["id"], s["status"], s["reason"]) for s in samples]
    assert not shareduse.left("tracefs")
    return traced, json.loads((run_dir / "run.json").read_text())


def test_a_traced_guest_cell_times_the_hosts_bridge_both_ways(tmp_path):
    traced, _ = traced_run(tmp_path)
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


def test_guests_with_bpftrace_time_every_hop_and_the_hops_add_up(tmp_path):
    """With bpftrace in the image, each guest's tracer (kfuncs or kprobes: the guests' 6.1
    kernel has no socket tracepoints) times its stack and its application's turnaround, the
    hand-offs over virtio and the tap are derived from spans on both clocks, and the ten
    medians add up to netperf's median round trip (within the 10 % tolerance, or the
    unexplained hop says by how much). Each kernel follows the same one request in eight."""
    images.ensure(images.load_recipe("debian12-bpftrace"))   # `./tb setup --with-test-deps` built it
    # One round: each traced sample has bpftrace compile its program in both guests first
    # (20-30 s under TCG, minutes on a loaded host), and the counting sample has every figure.
    traced, run = traced_run(tmp_path, "debian12-bpftrace", reps=1)
    for s in traced:
        rec = s["extra"]["hops"]
        hops = {h["id"]: h for h in rec["hops"]}
        tps, secs = s["metrics"]["transactions_per_s"], s["metrics"].get("duration_s", 3)
        for hid in ROUND_TRIP:
            h = hops[hid]
            assert "not_observed" not in h, (hid, h)
            assert 0.5 * tps * secs / 8 <= h["n"] <= 1.5 * tps * secs / 8, (hid, h, tps)
            assert h["p50_us"] > 0, (hid, h)
        # the guests' clocks are not the host's: a hand-off is a difference of spans, and
        # its count is the transactions both kernels followed
        assert hops["client.handoff"]["n"] >= 0.9 * hops["req.client_stack"]["n"], hops
        for name in ("g1", "g2"):
            t = rec["tracers"][name]
            assert t["tracer"].startswith("bpftrace") and t["follows_one_in"] == 8, t
        c = rec["closure"]
        assert c["tool_p50_us"] == s["metrics"]["latency_p50_us"], c
        assert abs(c["sum_p50_us"] + c["unexplained_us"] - c["tool_p50_us"]) < 0.5, c
        if c["within"]:
            assert abs(c["unexplained_pct"]) <= c["tolerance_pct"], c
        else:
            assert hops["unexplained"]["p50_us"] == c["unexplained_us"], c
    tracers = run["hops"][TRACED_ID]["tracers"]
    assert {tracers[g]["probes"] for g in ("g1", "g2")} <= {"kfuncs", "kprobes"}, tracers
    # BPF's run time in the guests, from the sample that counted it
    assert all(tracers[g]["bpf"]["run_cnt"] > 0 for g in ("g1", "g2")), tracers
