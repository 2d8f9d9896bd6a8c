"""Per-hop latency for real: `testbed run` on a namespace bridge with a traced request/response
profile. bpftrace attaches on this host, every hop of the datapath and of the stacks is seen,
the hops are checked against netperf's median, the traced cell is measured interleaved with
its untraced self and the run says what tracing cost; nothing is left behind."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings

import pytest

from testbed._suite_plugin import leftover_tracers, skip_unless_namespace_tracing
from testbed.host import shareduse

pytestmark = [pytest.mark.netns, pytest.mark.attach("netns")]

TOPOLOGY = """\
name: hops-netns
hops: {overhead_bound_pct: 5, closure_tolerance_pct: 10}
matrix:
  attachments: [{mode}]
  profiles:
    - {name: tcp_rr, pattern: rr, message_size: 1, response_size: 1, duration: 2, hops: true}
  repetitions: {warmup: 0, min: 3, max: 3, rsd_target: 0}
"""


@pytest.mark.parametrize("mode", ["netns-bridge", "netns-ovs-veth"])
def test_a_traced_namespace_cell_gives_every_hop_closure_and_its_cost(tmp_path, mode):
    skip_unless_namespace_tracing()
    from testbed import attachments
    from testbed.topology.model import Attachment
    if (missing := attachments.unavailable(Attachment(mode))):
        pytest.skip(f"{mode} unavailable here: {missing}")
    topo = tmp_path / "hops.yaml"
    topo.write_text(TOPOLOGY.replace("{mode}", mode))
    p = subprocess.run([sys.executable, "-m", "testbed.cli", "run", str(topo)], capture_output=True,
                       text=True, timeout=900, env={**os.environ, "TESTBED_RESULTS": str(tmp_path / "res")})
    assert p.returncode == 0, p.stderr[-3000:]
    assert "tracing cost" in p.stderr                       # the run says what it cost
    run_dir = tmp_path / "res" / p.stdout.strip().splitlines()[-1].rsplit("/", 1)[1]
    run = json.loads((run_dir / "run.json").read_text())
    assert run["environment"]["versions"]["bpftrace"]        # the tracer, named with its version
    traced_id = f"{mode}-qemu-mtu1500-conn1-tcp_rr-hops"
    assert {c["id"] for c in run["cells"]} == {traced_id, traced_id.removesuffix("-hops")}
    cost = run["hops"][traced_id]
    assert cost["untraced"] == traced_id.removesuffix("-hops") and cost["rounds"] == 3
    assert isinstance(cost["tps_cost_pct"], float) and cost["within_bound"] in (True, False)
    # BPF's run time counted in the first round only (counting costs a clock read per run)
    assert [x["bpf_counted"] for x in cost["pairs"]] == [True, False, False]
    assert isinstance(cost["pairs"][0].get("bpf_cores"), float) and "bpf_cores" not in cost["pairs"][1]
    assert "did not count BPF's run time" in cost["note"]
    samples = [json.loads(x) for x in (run_dir / "samples.jsonl").read_text().splitlines()]
    traced = [s for s in samples if s["cell"]["id"] == traced_id and s["status"] == "ok"]
    plain = [s for s in samples if s["cell"]["id"] != traced_id]
    assert len(traced) == 3 and all("hops" not in s["extra"] for s in plain)
    # A B B A: the first round starts untraced, the second traced
    order = [s["cell"]["id"] == traced_id for s in samples]
    assert order[:4] == [False, True, True, False]
    # A host tracer that would not exit after SIGINT is that sample's finding, given as its
    # hops' reason with where the tracer waited (a CI machine saturated by the tests beside
    # it once kept one past 90 s): one such sample is reported, not failed; two are a fault.
    stuck = [s for s in traced
             if s["extra"]["hops"]["tracers"]["host"].get("reason", "").startswith("bpftrace did not exit")]
    assert len(stuck) <= 1, [s["extra"]["hops"]["tracers"]["host"]["reason"] for s in stuck]
    for s in stuck:
        why = s["extra"]["hops"]["tracers"]["host"]["reason"]
        warnings.warn(f"a traced sample's host tracer did not exit: {why}")
        assert "state " in why and all(why in h.get("not_observed", "") for h in s["extra"]["hops"]["hops"]
                                        if h["id"] != "unexplained"), why
    for s in (s for s in traced if s not in stuck):
        hops = {h["id"]: h for h in s["extra"]["hops"]["hops"]}
        for hid in ("req.client_stack", "req.1.wire", "req.2.switch", "req.3.wire", "req.server_stack",
                    "server_app", "resp.server_stack", "resp.2.switch", "resp.client_stack", "client_app"):
            h = hops[hid]
            assert "not_observed" not in h, (hid, h)
            assert h["n"] > 50 and 0 < h["p50_us"] <= h["p90_us"] <= h["p99_us"], (hid, h)
            if hid.startswith("req."):
                # one request in 32 followed, drawn at the client's send (OVS hands on a
                # copy: a buffer left followed there once made every later packet followed)
                expected = s["metrics"]["transactions_per_s"] * s["metrics"]["duration_s"] / 32
                assert 0.5 * expected <= h["n"] <= 1.5 * expected, (hid, h, expected)
            assert s["metrics"][f"hop_p50_us.{hid}"] == h["p50_us"]
        c = s["extra"]["hops"]["closure"]
        # the hops and netperf's own median round trip are two sources of one figure
        assert c["tool_p50_us"] == s["metrics"]["latency_p50_us"]
        assert c["sum_p50_us"] + c["unexplained_us"] == pytest.approx(c["tool_p50_us"], abs=0.01)
        assert 0.3 < c["sum_p50_us"] / c["tool_p50_us"] < 3, c
        bpf = s["extra"]["hops"]["tracers"]["host"]["bpf"]
        # how long the tracer took to exit after SIGINT, kept for a host where that is slow
        assert 0 <= s["extra"]["hops"]["tracers"]["host"]["stop_s"] < 180
        assert bpf["run_cnt"] > 0 if s["rep"] == 0 else "not_counted" in bpf, (s["rep"], bpf)
    # each traced sample keeps its tracer's own output beside the tool's
    assert len(list(run_dir.glob(f"raw/{traced_id}/rep*-hops-host.out"))) == 3 - len(stuck)
    # torn down: no tracer left running, tracefs as it was
    assert not leftover_tracers()
    # tracefs as the host had it: mounted by a testbed process only while one still uses it
    # (tests on other workers may), never left mounted by the last one out
    assert not shareduse.left("tracefs")
    from testbed.analysis import hops_report
    from testbed.records import results
    figs = hops_report.waterfalls([results.read_run(run_dir)])
    assert [t for t, _, _ in figs] == [f"Where the microseconds go: {mode}"]
