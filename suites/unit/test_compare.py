"""testbed compare: per-cell verdicts, refusals and exit statuses on small runs in the real format.

Runs are written by the production RunWriter, with metric and CPU records shaped like the
real TCG run 20261122T030019Z-a0e9 (bridge, netperf TCP_STREAM and TCP_RR).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import pytest

from testbed import errors
from testbed.analysis import compare, stats
from testbed.cli import results as cli_results
from testbed.records.results import RunWriter, SampleRecord, now
from testbed.topology.model import Attachment, Backend, Cell, GuestSpec, HostSpec, Matrix, Pattern, Profile, Topology

pytestmark = pytest.mark.unit

# ----------------------------------------------------------------------------- run factory

STREAM = Profile("tcp_stream", message_size=16384)
RR = Profile("tcp_rr", pattern=Pattern.RR, message_size=1, response_size=1)
ENV = {"accelerator": "kvm", "comparable_class": "kvm", "cpu_mhz": 2596.122,
       "cpu_model": "AMD EPYC", "cpus": 2, "host": "vm", "kernel": "6.18.44-fc-v657",
       "image": {"digest": "e20ee5c55fe078c0", "kernel": "6.1.0-50-cloud-amd64", "name": "debian12"},
       "memory_bytes": 25276510208, "testbed": "0.1.0", "testbed_commit": "d680013",
       "versions": {"iperf3": "3.12", "libvirt": "9.0.0", "netperf": "2.7.0", "ovs": "3.1.0",
                    "qemu": "7.2.22", "uperf": None}, "vhost_net": False}


def cpu(host: float, guest: float, qemu: float) -> dict:
    half = lambda v: round(v / 2, 4)  # noqa: E731
    return {"guest": {g: {"busy": half(guest), "idle": 0.3, "softirq": 0.1, "system": 0.3,
                          "user": 0.05, "irq": 0.0, "steal": 0.0, "iowait": 0.0, "nice": 0.0}
                      for g in ("g1", "g2")},
            "host": {"busy": host, "idle": 2 - host, "softirq": 0.002, "system": 0.5,
                     "user": host - 0.5, "irq": 0.0, "steal": 0.0, "iowait": 0.0, "nice": 0.0},
            "per_guest": {g: {"vcpu": half(qemu * 0.7), "emulator": half(qemu * 0.3),
                              "iothread": 0.0, "vhost": 0.0, "total": half(qemu)}
                          for g in ("g1", "g2")},
            "named": {"ksoftirqd": 0.0, "ovs-vswitchd": 0.0}, "window_s": 10.3}


def stream_metrics(mbps: float) -> dict:
    return {"throughput_mbps": mbps, "bytes": mbps * 1.25e6 * 10, "duration_s": 10.01,
            "latency_mean_us": 56.79, "latency_p50_us": 16.0, "latency_p90_us": 64.0,
            "latency_p99_us": 729.0, "retransmits": 1.0}


def rr_metrics(tps: float, p99: float = 1322.0) -> dict:
    return {"transactions_per_s": tps, "bytes": tps * 20, "duration_s": 10.0,
            "latency_mean_us": 1e6 / tps, "latency_p50_us": 545.0, "latency_p90_us": 736.0,
            "latency_p99_us": p99, "retransmits": 0.0}


def cell(profile: Profile, attachment: str = "bridge", mtu: int = 1500, conns: int = 1) -> Cell:
    return Cell(Attachment(attachment), Backend.QEMU, mtu, conns, profile)


def write_run(root: Path, run_id: str, samples: dict[Cell, list], **env) -> Path:
    """A run directory: per cell, a list of samples, each a (metrics, cpu) pair or a failure
    reason (str)."""
    cells = list(samples)
    matrix = Matrix(attachments=tuple(dict.fromkeys(c.attachment for c in cells)),
                    backends=(Backend.QEMU,), mtus=tuple(sorted({c.mtu for c in cells})),
                    connections=tuple(sorted({c.connections for c in cells})),
                    profiles=tuple(dict.fromkeys(c.profile for c in cells)))
    topo = Topology("t", "<test>", (HostSpec("local"),), (GuestSpec("g1", "local"),
                    GuestSpec("g2", "local")), "g1", "g2", matrix)
    with RunWriter(root, run_id, topo, {**ENV, **env}) as w:
        for c, items in samples.items():
            for rep, item in enumerate(items):
                if isinstance(item, str):
                    w.add_sample(SampleRecord.new(run_id, c.as_dict(), rep, False, "failed", item, {}, {},
                                                  now(), now()))
                else:
                    w.add_sample(SampleRecord.new(run_id, c.as_dict(), rep, False, "ok", None, item[0],
                                                  item[1], now(), now()))
            w.add_cell(c, "ok", None, True, {})
    return w.dir


def matrix_run(root: Path, run_id: str, *, seed: int, scale: dict[str, float] | None = None,
               n: int = 8, attachments=("bridge",), **env) -> Path:
    """Stream and rr cells at two MTUs per attachment, n samples of 1 % noise each;
    ``scale`` multiplies one cell's primary metric."""
    rng = np.random.default_rng(seed)
    scale = scale or {}
    samples: dict[Cell, list] = {}
    for att in attachments:
        for mtu in (1500, 9000):
            s, r = cell(STREAM, att, mtu), cell(RR, att, mtu)
            k = scale.get(s.id, 1.0)
            samples[s] = [(stream_metrics(2000 * k * rng.normal(1, 0.01)), cpu(1.6, 1.4, 1.6))
                          for _ in range(n)]
            k = scale.get(r.id, 1.0)
            samples[r] = [(rr_metrics(1700 * k * rng.normal(1, 0.01),
                                      1322 * rng.normal(1, 0.01)), cpu(1.3, 0.5, 1.2))
                          for _ in range(n)]
    return write_run(root, run_id, samples, **env)


def run_cli(argv: list[str], capsys) -> tuple[int, str, str]:
    """The commands as `testbed` will run them: registered by add_commands, errors mapped."""
    parser = argparse.ArgumentParser(prog="testbed")
    cli_results.add_commands(parser.add_subparsers(dest="cmd", required=True))
    args = parser.parse_args(argv)
    try:
        rc = args.func(args)
    except errors.TestbedError as e:
        print(f"testbed: {e}", file=sys.stderr)
        rc = e.exit_status
    out = capsys.readouterr()
    return rc, out.out, out.err


# ----------------------------------------------------------------------------- verdicts

STREAM_1500 = "bridge-qemu-mtu1500-conn1-tcp_stream"


def test_same_distribution_is_unchanged_and_exits_0(tmp_path, capsys):
    matrix_run(tmp_path, "base", seed=1)
    matrix_run(tmp_path, "new", seed=2)
    rc, out, _ = run_cli(["compare", "base", "new", "--results", str(tmp_path)], capsys)
    assert rc == 0, out
    res = compare.compare_runs(compare.load("base", tmp_path), compare.load("new", tmp_path))
    assert {c.verdict for c in res.cells} == {compare.CellVerdict.UNCHANGED}
    assert len(res.cells) == 4 and res.exit_status == 0
    assert "4 unchanged" in out


def test_forty_percent_throughput_cut_regresses_and_exits_1(tmp_path, capsys):
    matrix_run(tmp_path, "base", seed=1)
    matrix_run(tmp_path, "new", seed=2, scale={STREAM_1500: 0.6})
    rc, out, _ = run_cli(["compare", "base", "new", "--results", str(tmp_path), "--json"], capsys)
    assert rc == 1
    doc = json.loads(out)
    verdicts = {c["cell_id"]: c["verdict"] for c in doc["cells"]}
    assert verdicts.pop(STREAM_1500) == "regressed"
    assert set(verdicts.values()) == {"unchanged"}
    assert doc["failing"] == [STREAM_1500] and doc["exit_status"] == 1
    tput = next(m for c in doc["cells"] if c["cell_id"] == STREAM_1500 for m in c["metrics"]
                if m["metric"] == "throughput_mbps")
    assert tput["comparison"]["delta_pct"] == pytest.approx(-40, abs=2)
    assert tput["comparison"]["p_value"] < 1e-6


def test_human_output_is_a_table_naming_the_regression(tmp_path, capsys):
    matrix_run(tmp_path, "base", seed=1)
    matrix_run(tmp_path, "new", seed=2, scale={STREAM_1500: 0.6})
    rc, out, _ = run_cli(["compare", str(tmp_path / "base"), str(tmp_path / "new")], capsys)
    assert rc == 1
    row = next(line for line in out.splitlines() if line.startswith(STREAM_1500))
    assert "REGRESSED" in row and "throughput_mbps" in row and "-40." in row
    assert f"GATE FAILED: {STREAM_1500} regressed" in out


def test_improvement_does_not_fail_the_gate(tmp_path):
    matrix_run(tmp_path, "base", seed=1)
    matrix_run(tmp_path, "new", seed=2, scale={"bridge-qemu-mtu9000-conn1-tcp_rr": 1.3})
    res = compare.compare_runs(compare.load("base", tmp_path), compare.load("new", tmp_path),
                               test="mannwhitney")
    by_id = {c.cell_id: c for c in res.cells}
    assert by_id["bridge-qemu-mtu9000-conn1-tcp_rr"].verdict is compare.CellVerdict.IMPROVED
    assert by_id["bridge-qemu-mtu9000-conn1-tcp_rr"].metrics[0].comparison.test == "mannwhitney"
    assert res.exit_status == 0


def test_rr_latency_decides_but_stream_latency_is_information(tmp_path):
    s, r = cell(STREAM), cell(RR)
    base = {s: [(stream_metrics(2000 + i), cpu(1.6, 1.4, 1.6)) for i in range(6)],
            r: [(rr_metrics(1700 + i, 1300 + i), cpu(1.3, 0.5, 1.2)) for i in range(6)]}
    worse_latency = {s: [({**stream_metrics(2000 + i), "latency_p99_us": 2000.0 + i},
                          cpu(1.6, 1.4, 1.6)) for i in range(6)],
                     r: [(rr_metrics(1700 + i, 2000 + i), cpu(1.3, 0.5, 1.2)) for i in range(6)]}
    write_run(tmp_path, "base", base)
    write_run(tmp_path, "new", worse_latency)
    res = compare.compare_runs(compare.load("base", tmp_path), compare.load("new", tmp_path))
    by_id = {c.cell_id: c for c in res.cells}
    assert by_id[r.id].verdict is compare.CellVerdict.REGRESSED
    p99 = next(m for m in by_id[s.id].metrics if m.metric == "latency_p99_us")
    assert p99.comparison.verdict.value == "regressed" and not p99.decides
    assert by_id[s.id].verdict is compare.CellVerdict.UNCHANGED


# ----------------------------------------------------------------------------- failures

def test_failed_samples_are_excluded_but_reported(tmp_path, capsys):
    s = cell(STREAM)
    good = [(stream_metrics(2000 + i), cpu(1.6, 1.4, 1.6)) for i in range(7)]
    write_run(tmp_path, "base", {s: good[:5] + ["no route"]})
    write_run(tmp_path, "new", {s: good[:5] + ["netperf timed out after 30 s"]})
    res = compare.compare_runs(compare.load("base", tmp_path), compare.load("new", tmp_path))
    (c,) = res.cells
    assert (c.new_ok, c.new_failed) == (5, 1)
    assert c.metrics[0].comparison.new.n == 5
    assert c.verdict is compare.CellVerdict.UNCHANGED
    assert any("netperf timed out after 30 s" in f for f in c.failures)
    rc, out, _ = run_cli(["compare", "base", "new", "--results", str(tmp_path)], capsys)
    assert rc == 0
    assert "failed samples (excluded from statistics): 2" in out and "no route" in out


def test_a_risen_failure_rate_breaks_the_cell_whatever_the_survivors_say(tmp_path):
    s = cell(STREAM)
    good = [(stream_metrics(2000 + i), cpu(1.6, 1.4, 1.6)) for i in range(5)]
    write_run(tmp_path, "base", {s: good})
    write_run(tmp_path, "new", {s: good[:1] + ["no route"] * 4})
    res = compare.compare_runs(compare.load("base", tmp_path), compare.load("new", tmp_path))
    (c,) = res.cells
    assert c.verdict is compare.CellVerdict.BROKEN and "failure rate rose" in c.note
    assert not c.metrics and res.exit_status == 1


def test_cell_with_no_successful_sample_breaks_the_gate(tmp_path):
    s, r = cell(STREAM), cell(RR)
    write_run(tmp_path, "base", {s: [(stream_metrics(2000), cpu(1.6, 1.4, 1.6))] * 5,
                                 r: [(rr_metrics(1700), cpu(1.3, 0.5, 1.2))] * 5})
    write_run(tmp_path, "new", {s: ["guest agent unreachable"] * 5,
                                r: [(rr_metrics(1700), cpu(1.3, 0.5, 1.2))] * 5})
    res = compare.compare_runs(compare.load("base", tmp_path), compare.load("new", tmp_path))
    by_id = {c.cell_id: c for c in res.cells}
    assert by_id[s.id].verdict is compare.CellVerdict.BROKEN
    assert by_id[r.id].verdict is compare.CellVerdict.UNCHANGED
    assert res.exit_status == 1


def test_cell_missing_from_new_fails_the_gate(tmp_path):
    s, r = cell(STREAM), cell(RR)
    write_run(tmp_path, "base", {s: [(stream_metrics(2000), cpu(1.6, 1.4, 1.6))] * 2,
                                 r: [(rr_metrics(1700), cpu(1.3, 0.5, 1.2))] * 2})
    write_run(tmp_path, "new", {s: [(stream_metrics(2000), cpu(1.6, 1.4, 1.6))] * 2})
    res = compare.compare_runs(compare.load("base", tmp_path), compare.load("new", tmp_path))
    assert [c.verdict for c in res.failing] == [compare.CellVerdict.BASE_ONLY]
    assert res.exit_status == 1


# ----------------------------------------------------------------------------- refusals

def test_tcg_against_kvm_is_refused_with_exit_2_even_with_force(tmp_path, capsys):
    matrix_run(tmp_path, "base", seed=1, accelerator="tcg", comparable_class="tcg-functional-only")
    matrix_run(tmp_path, "new", seed=2)
    for extra in ([], ["--force"]):
        rc, out, err = run_cli(["compare", "base", "new", "--results", str(tmp_path), *extra],
                               capsys)
        assert rc == 2
        assert "accelerator: tcg -> kvm" in out and "REFUSED" in out and "NEVER COMPARABLE" in out
        assert "never compared with KVM" in err
    assert "--force IGNORED" in err          # the last round was the forced one
    rc, out, _ = run_cli(["compare", "base", "new", "--results", str(tmp_path), "--json"], capsys)
    doc = json.loads(out)
    assert rc == 2 and doc["refused"] and doc["cells"] == []
    assert {d["what"]: d["severity"] for d in doc["differences"]}["accelerator"] == "forbidden"


def test_cpu_model_mismatch_is_refused_unless_forced(tmp_path, capsys):
    matrix_run(tmp_path, "base", seed=1)
    matrix_run(tmp_path, "new", seed=2, cpu_model="Intel Xeon Gold 6338")
    rc, out, err = run_cli(["compare", "base", "new", "--results", str(tmp_path)], capsys)
    assert rc == 2 and "cpu_model: AMD EPYC -> Intel Xeon Gold 6338" in out
    assert "--force compares anyway" in err
    rc, out, err = run_cli(["compare", "base", "new", "--results", str(tmp_path), "--force"],
                           capsys)
    assert rc == 0 and "--force: compared despite" in out and "WARNING" in err


def test_attachment_sets_must_match(tmp_path):
    matrix_run(tmp_path, "base", seed=1, attachments=("bridge", "ovs"))
    matrix_run(tmp_path, "new", seed=2, attachments=("bridge",))
    res = compare.compare_runs(compare.load("base", tmp_path), compare.load("new", tmp_path))
    assert res.exit_status == 2 and res.cells == ()
    (d,) = [d for d in res.differences if d.what == "attachments"]
    assert (d.base, d.new, d.severity) == ("bridge,ovs", "bridge", compare.Severity.MISMATCH)


def test_version_changes_are_listed_not_refused(tmp_path):
    matrix_run(tmp_path, "base", seed=1)
    matrix_run(tmp_path, "new", seed=2, versions={**ENV["versions"], "qemu": "8.2.0"})
    res = compare.compare_runs(compare.load("base", tmp_path), compare.load("new", tmp_path))
    assert res.refused is None
    assert [(d.what, d.base, d.new) for d in res.differences] == [("versions.qemu", "7.2.22", "8.2.0")]


def test_tcg_runs_compare_with_a_loud_banner(tmp_path, capsys):
    tcg = {"accelerator": "tcg", "comparable_class": "tcg-functional-only"}
    matrix_run(tmp_path, "base", seed=1, **tcg)
    matrix_run(tmp_path, "new", seed=2, **tcg)
    rc, out, _ = run_cli(["compare", "base", "new", "--results", str(tmp_path)], capsys)
    assert rc == 0 and "!! TCG" in out and "Not comparable with KVM" in out


def test_unknown_run_is_a_usage_error(tmp_path, capsys):
    rc, _, err = run_cli(["compare", "nope", "nada", "--results", str(tmp_path)], capsys)
    assert rc == 2 and "nope" in err


def test_threshold_outside_0_1_is_rejected(tmp_path, capsys):
    with pytest.raises(SystemExit):
        run_cli(["compare", "a", "b", "--threshold", "1.5"], capsys)


def test_an_undecided_gate_says_what_the_hosts_noise_resolves(tmp_path, capsys):
    """Unchanged cells at 8 % noise cannot be shown within 5 % by five samples a side: the
    gate stays undecided and says so in one line, with the smallest detectable changes and
    the samples the threshold would need; at a threshold the noise resolves it passes."""
    def noisy(run_id, seed):
        rng = np.random.default_rng(seed)
        write_run(tmp_path, run_id, {cell(STREAM, "bridge", mtu): [
            (stream_metrics(2000 * rng.normal(1, 0.08)), cpu(1.6, 1.4, 1.6)) for _ in range(5)]
            for mtu in (1500, 9000)})
    noisy("base", 11)
    noisy("new", 12)
    rc, out, _ = run_cli(["compare", "base", "new", "--results", str(tmp_path)], capsys)
    assert rc == 5, out
    line = next(x for x in out.splitlines() if x.startswith("resolution:"))
    res = compare.compare_runs(compare.load("base", tmp_path), compare.load("new", tmp_path))
    mdcs = sorted(m.comparison.mdc for c in res.undecided for m in c.metrics
                  if m.decides and m.comparison.verdict is stats.Verdict.INCONCLUSIVE)
    assert f"{mdcs[0]:.1%} to {mdcs[-1]:.1%}" in line and "threshold of 5%" in line, line
    need = int(line.split("about ")[1].split()[0])
    assert need > 5 * (mdcs[0] / 0.05) ** 2 * 0.99, line        # samples grow as the mdc squared
    assert "this host's noise, not the build" in line
    rc, out, _ = run_cli(["compare", "base", "new", "--results", str(tmp_path), "--threshold", "0.3"], capsys)
    assert rc == 0 and "resolution:" not in out, out
