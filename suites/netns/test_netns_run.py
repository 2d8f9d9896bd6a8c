"""Namespace endpoints through the same runner, tools, statistics and results format as
guests: `testbed run` on a topology with netns-* attachments and no guests."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

from testbed import attachments
from testbed.admin import cleanup
from testbed.analysis import sample_cost as cost
from testbed.topology.model import Attachment

pytestmark = [pytest.mark.netns, pytest.mark.attach("netns")]

TOPOLOGY = """\
name: netns-pair
matrix:
  attachments: [ATTACHMENTS]
  mtus: [1500, 9000]
  connections: [1]
  profiles:
    - {name: tcp_stream, pattern: stream, message_size: 16384, duration: 1}
    - {name: tcp_rr, pattern: rr, message_size: 1, response_size: 1, duration: 1}
  repetitions: {warmup: 1, min: 2, max: 2, rsd_target: 0.1}
"""


def test_netns_run_fills_every_field(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("needs root: creates namespaces")
    for tool in ("netperf", "netserver", "ping"):
        if not shutil.which(tool):
            pytest.skip(f"{tool} missing")
    modes = [a for a in (Attachment("netns-veth"), Attachment("netns-bridge"), Attachment("netns-ovs-veth"),
                         Attachment("netns-ovs-internal")) if attachments.unavailable(a) is None]
    topo = tmp_path / "netns.yaml"
    topo.write_text(TOPOLOGY.replace("ATTACHMENTS", ", ".join(m.value for m in modes)))
    p = subprocess.run([sys.executable, "-m", "testbed.cli", "run", str(topo)], capture_output=True,
                       text=True, timeout=900, env={**os.environ, "TESTBED_RESULTS": str(tmp_path / "res")})
    assert p.returncode == 0, p.stderr[-3000:]
    run_dir = tmp_path / "res" / p.stdout.strip().splitlines()[-1].rsplit("/", 1)[1]
    # stderr's last status line is the report's summary, word for word (retried samples,
    # if the host was busy, are counted as such there and here, never as failed)
    [status] = [line for line in p.stderr.splitlines() if line.startswith("status: ")]
    assert status.startswith("status: complete, ") and ", 0 failed" in status, status
    assert status in (run_dir / "report.html").read_text()
    run = json.loads((run_dir / "run.json").read_text())
    assert run["status"] == "complete" and run["counts"]["boots"] == 0
    assert run["environment"]["accelerator"] == "none"
    from testbed import __version__
    assert run["environment"]["testbed"] == __version__      # the version that measured it
    assert run["collector"]["fraction_of_one_core_per_10s_window"] < 0.01
    assert len(run["cells"]) == len(modes) * 4
    for c in run["cells"]:
        key = "throughput_mbps" if c["profile"] == "tcp_stream" else "transactions_per_s"
        s = c["summary"][key]
        assert s["n"] >= 2 and s["mean"] > 0 and s["ci95"][0] <= s["mean"] <= s["ci95"][1]
        assert c["converged"] in (True, False)
    # a sample the noise guard set aside (host busy with other work) was measured again
    samples = [s for s in map(json.loads, (run_dir / "samples.jsonl").read_text().splitlines())
               if s["status"] != "noisy"]
    assert any(s["warmup"] for s in samples)
    for s in samples:
        assert s["status"] == "ok", s["reason"]
        m = s["metrics"]
        assert m["host_cores"] > 0
        if "latency_p99_us" in m:
            # a stream's are netperf's per-send times: where most sends take under a
            # microsecond netperf prints P50_LATENCY=-2147483648, which is left out
            assert "latency_p50_us" in m or s["cell"]["profile"] == "tcp_stream", m
            assert m["latency_p99_us"] >= m.get("latency_p50_us", 0)
        else:
            # left out, honestly: a p99 needs ten transactions above it (1000 in all), and a
            # 1 s sample on a host busy with other tests can carry fewer
            assert m["transactions_per_s"] * m["duration_s"] < 1000, m
        if s["cell"]["profile"] == "tcp_stream":
            assert m["host_gbit_per_core"] > 0 and m["host_gbit_per_ghz"] > 0
            dev, counts = s["extra"]["device_mbps"], s["extra"]["counters"]
            # The receiving endpoint's device counted the bytes netperf reported, headers
            # added (the fewer of the two ends' data counts: the sender's carries
            # retransmissions too, so it can read higher through lossy paths). Bytes, not
            # rates: the counters' window encloses netperf's and, on a host busy with other
            # tests, can be much longer than its 1 s.
            sent = m["throughput_mbps"] * m["duration_s"] * 1e6 / 8
            received = min(max(d["rx_bytes"], d["tx_bytes"]) for d in counts.values())
            assert 0.8 * sent < received < 1.1 * sent, (sent, counts)
            # the devices' rates are over that longer window: never above netperf's
            assert set(dev) == set(counts)
            assert 0 < max(d["to_guest"] for d in dev.values()) < 1.1 * m["throughput_mbps"], dev
        else:
            assert m["host_cpu_us_per_txn"] > 0
        host = s["cpu"]["host"]
        assert 0 < host["busy"] <= os.cpu_count() + 0.05
        assert host["softirq"] >= 0
        # The wire cross-check on the receiving endpoint's device: a stream's ratio is the
        # one headers explain, within the tolerance; request/response carries at least its payload.
        c = s["crosscheck"]
        assert c["verdict"] == "ok" and c["wire_bytes"] >= c["tool_bytes"] > 0, c
        if s["cell"]["profile"] == "tcp_stream":
            # Within the tolerance of the headers' ratio; below it by at most what TCP's
            # retransmissions explain (an upper bound: full-size segments), as the check allows.
            room = 1 - c["explained_extra_bytes"] / c["wire_bytes"]
            assert c["expected_ratio"] * room * 0.97 <= c["ratio"] <= c["expected_ratio"] * 1.03, c
        # Host CPU adds up: what nobody is charged with is stated, never negative, and the
        # invariant was checked on the sample.
        assert s["cpu"]["invariant"]["holds"] and s["cpu"]["unattributed"] >= 0, s["cpu"]["invariant"]
        assert s["cpu"]["irq"] is not None and s["cpu"]["softirq"] is not None
        # One window per sample, stated: the collectors enclose the tool's own interval.
        w = s["extra"]["window"]
        assert w["tool_s"] >= 0.9 * 1 and set(w["guest_s"]) == {"ns-a", "ns-b"}
        assert w["coverage"] == {"host": 1.0, "ns-a": 1.0, "ns-b": 1.0}, w
        assert s["extra"]["kernel"]["irq_time_accounting_source"]
        # Its host CPU per packet by role, over the wire counter's packets; the roles add up
        # to the host's busy time within the tolerance, or the gap is a role of its own. The
        # endpoints' own work (netperf in its namespace) is in no role of the path, so the
        # cost is recorded but is no metric the gate judges.
        k = s["extra"]["cost"]
        assert k["packets"] == c["wire_packets"] > 0 and set(k["cores"]) >= set(cost.ROLES), k
        assert k["cores"]["vcpu"] == k["cores"]["emulator"] == 0, k["cores"]
        # the rest is the endpoints' tools; on a host where processes come and go, one that
        # ended unreaped in the window can leave it unmeasurable: a note then says so, never < 0
        assert k["cores"].get("rest", 0) > 0 or "other processes read" in " ".join(k["notes"]), k
        assert not any(x.startswith("cost_") for x in m) and "not attributed" in " ".join(k["notes"])
        assert k["closure"]["busy"] == host["busy"] and k["check"]["verdict"] == "ok"
        assert k["closure"]["within"] or k["cores"]["gap"] == k["closure"]["gap"], k["closure"]
    tag = run_dir.name.rsplit("-", 1)[1]
    found = cleanup.find(include_live=True)
    assert [n for g in found.__dict__.values() for n in g if n.startswith(f"tb-{tag}")] == []


def test_offloads_switched_for_the_run_and_recorded(tmp_path, monkeypatch):
    """`offloads: off` reaches the endpoints' NICs; each sample records the states the NICs
    report and the datapath that forwarded it."""
    if os.geteuid() != 0:
        pytest.skip("needs root: creates namespaces")
    from testbed.measure import runner
    from testbed.records import results
    from testbed.topology import config
    monkeypatch.setenv("TESTBED_RESULTS", str(tmp_path / "res"))
    t = config.parse("matrix:\n  attachments: [netns-veth]\n  profiles:\n"
                     "    - {name: tcp_stream, pattern: stream, message_size: 16384, duration: 2}\n"
                     "offloads: {tso: false, gso: false, gro: false}\n", "off.yaml")
    out = runner.execute(t)
    assert out.status == "complete" and out.failed == 0
    # a sample the noise guard set aside (host busy with other work) was measured again
    [s] = [x for x in results.read_run(out.run_dir).samples if x.status != "noisy"]
    assert s.data["datapath"] == "veth"
    assert set(s.data["offloads"]) == {"ns-a", "ns-b"}
    for states in s.data["offloads"].values():
        for feature in ("tso", "gso", "gro"):
            assert states[feature].startswith("off"), states
