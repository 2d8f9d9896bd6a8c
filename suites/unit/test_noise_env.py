"""Host tuning in run.json (parsed from recorded dumps), the noise guard's pure parts, noisy
samples in records and in compare (left out, counted), and compare listing the host
settings that differ."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from testbed.analysis import compare
from testbed.host import tuning
from testbed.measure import window
from testbed.records import results
from testbed.records.records import RunRecord, SampleRecord
from testbed.topology.model import NoiseAction, NoiseSpec

FIX = Path(__file__).parent / "fixtures"
CI = tuning.parse_dump((FIX / "tuning" / "ci-host.txt").read_text())
EDITED = tuning.parse_dump((FIX / "tuning" / "edited-host.txt").read_text())


def test_tuning_of_the_ci_host_absent_fields_unreadable():
    t = tuning.parse(CI, ["eth0"])
    # a VM without cpufreq: no governor, driver or turbo, said so, not guessed
    assert t["cpufreq_governor"] is None and t["cpufreq_driver"] is None and t["turbo"] is None
    assert {"cpufreq_governor", "cpufreq_driver", "turbo", "pstate_status"} <= set(t["unreadable"])
    assert t["smt"] == "notsupported" and t["smt_active"] is False
    assert t["numa"] == {"0": {"cpus": "0-1", "distances": [10]}}
    assert t["thp"] == "madvise" and t["kernel_cmdline"].startswith("mitigations=")
    assert t["kernel_cmdline_params"] == {"mitigations": "auto,no_guest_host,no_guest_guest"}
    assert t["max_cstate"] == {"intel_idle": "9", "processor": "8"}
    # eth0 is virtio: its IRQs are the PCI function's, named virtio2-*
    irqs = t["irq_affinity"]["eth0"]
    assert set(irqs) == {"37 virtio2-config", "38 virtio2-input.0", "39 virtio2-output.0"}
    assert set(irqs.values()) == {"0-1"}
    assert tuning.parse(CI, ["tb-x"])["irq_affinity"] == {"tb-x": "no IRQs (a virtual device)"}


def test_tuning_of_a_tuned_host():
    t = tuning.parse(EDITED)
    assert t["cpufreq_governor"] == {"performance": [0], "powersave": [1]}
    assert t["cpufreq_driver"] == {"intel_pstate": [0, 1]} and t["turbo"] is False
    assert t["kernel_cmdline_params"]["isolcpus"] == "1" and t["kernel_cmdline_params"]["nohz_full"] == "1"
    assert t["thp"] == "always"


def test_tuning_read_here_matches_the_script():
    """The local reader and the remote script read the same files: one parse, one record."""
    if not shutil.which("sh"):
        pytest.skip("no sh")
    import subprocess
    dump = subprocess.run(["sh", "-c", tuning.REMOTE_SCRIPT], capture_output=True, text=True, timeout=30).stdout
    here = tuning.local()
    there = tuning.parse(tuning.parse_dump(dump))
    assert {k: v for k, v in here.items() if k != "irq_affinity"} == \
        {k: v for k, v in there.items() if k != "irq_affinity"}


def test_noise_pure_parts():
    assert window.parse_procs_running("cpu 1 2\nprocs_running 3\nprocs_blocked 0\n") == 3
    info = {"host": {"busy": 1.8}, "attributed": 0.9}
    assert window.noise_figure(info, 0.1) == 0.8
    assert window.noise_figure({"host": {"busy": 0.5}, "attributed": 0.6}, 0.1) == 0.0
    spec = NoiseSpec(threshold_cores=0.5, run_queue=4)
    assert window.judge(spec, 0.4, 3.0) is None
    assert "0.80 cores used by other work (threshold 0.5)" in window.judge(spec, 0.8, None)
    assert "run queue 5.0 (threshold 4)" in window.judge(spec, 0.1, 5.0)


def test_retry_budget_then_keep(monkeypatch):
    monkeypatch.delenv("TESTBED_SHARED_HOST", raising=False)      # a run that holds the host alone
    w = window.Watch(NoiseSpec(max_retries=1, action=NoiseAction.RETRY))
    assert w.action_for(None) is None and w.action_for("busy") == "retry"
    w.retries_left -= 1
    assert w.action_for("busy") == "keep"
    w.begin_cell()
    assert w.action_for("busy") == "retry"
    assert window.Watch(NoiseSpec(action=NoiseAction.FAIL)).action_for("busy") == "fail"
    assert window.Watch().action_for("busy") == "keep"    # measuring without a topology: marked only


def test_a_shared_host_keeps_noisy_samples_instead_of_retrying(monkeypatch):
    """Beside other shared runs (--shared-host) the neighbours are expected: a retry would meet
    them again. What the topology asked to fail still fails."""
    monkeypatch.setenv("TESTBED_SHARED_HOST", "1")
    assert window.Watch(NoiseSpec(max_retries=3, action=NoiseAction.RETRY)).action_for("busy") == "keep"
    assert window.Watch(NoiseSpec(action=NoiseAction.FAIL)).action_for("busy") == "fail"
    assert window.for_host(NoiseSpec()).action is NoiseAction.KEEP
    monkeypatch.setenv("TESTBED_SHARED_HOST", "0")
    assert window.for_host(NoiseSpec()).action is NoiseAction.RETRY


def _sample(status: str, rep: int, value: float, noisy: bool = False, reason: str | None = None) -> dict:
    return {"run_id": "r", "cell": {"id": "bridge-qemu-mtu1500-conn1-tcp_rr", "profile": "tcp_rr", "hash": "h"},
            "rep": rep, "warmup": False, "status": status, "reason": reason,
            "metrics": {"transactions_per_s": value}, "extra": {"noise": {"noisy": noisy, "other_cores": 0.9}}}


def test_noisy_sample_records():
    s = SampleRecord.from_dict(_sample("noisy", 0, 1.0, True, "noisy: busy"))
    s.validate()
    assert s.noisy and not s.ok and not s.measured
    with pytest.raises(ValueError, match="a noisy sample needs a reason"):
        SampleRecord.from_dict(_sample("noisy", 0, 1.0, True)).validate()
    kept = SampleRecord.from_dict(_sample("ok", 0, 1.0, True))
    assert kept.noisy and kept.ok


def _run(tmp_path: Path, name: str, samples: list[dict], tune: dict) -> RunRecord:
    d = tmp_path / name
    d.mkdir()
    topo = {"matrix": {"profiles": [{"name": "tcp_rr", "pattern": "rr"}], "attachments": ["bridge"]}}
    (d / "run.json").write_text(json.dumps({
        "format_version": results.FORMAT_VERSION, "run_id": name, "status": "complete", "topology": topo,
        "environment": {"accelerator": "tcg", "comparable_class": "tcg-functional-only", "cpu_model": "x",
                        "tuning": tune}, "counts": {}, "cells": []}))
    (d / "samples.jsonl").write_text("".join(json.dumps({**s, "run_id": name}) + "\n" for s in samples))
    return results.read_run(d)


def test_compare_excludes_noisy_and_lists_differing_host_settings(tmp_path):
    base = [_sample("ok", i, 100.0 + i) for i in range(5)]
    new = [_sample("noisy", 0, 10.0, True, "noisy: 0.90 cores used by other work (threshold 0.5)")] + \
          [_sample("ok", i, 100.0 + i, noisy=(i == 4)) for i in range(5)]
    b = _run(tmp_path, "base", base, tuning.parse(CI))
    n = _run(tmp_path, "new", new, tuning.parse(EDITED))
    rc = compare.compare_runs(b, n)
    [cell] = rc.cells
    # the set-aside sample is neither a failure nor a value: 5 ok a side, same figures
    assert cell.new_ok == 5 and cell.new_failed == 0 and cell.verdict.value == "unchanged"
    assert rc.noisy == {"base_excluded": 0, "new_excluded": 1, "base_kept": 0, "new_kept": 1}
    what = {d.what: d for d in rc.tuning}
    assert what["tuning.thp"].base == "madvise" and what["tuning.thp"].new == "always"
    assert what["tuning.cpufreq_governor"].base == "unreadable"
    assert "tuning.numa" not in what
    text = compare.render_text(rc)
    assert "host setting differs: tuning.thp: madvise -> always" in text
    assert "noisy samples excluded (host busy with other work, measured again): BASE 0, NEW 1; kept, " \
           "marked: BASE 0, NEW 1" in text
    assert compare.to_dict(rc)["noisy"]["new_excluded"] == 1
    # runs recorded before tuning existed: nothing to list
    assert compare.tuning_differences(_run(tmp_path, "old", base, {}), n) == ()


def test_wait_quiet_bound_and_timeout():
    from testbed.topology.model import QuietWait
    r = window.wait_quiet(QuietWait(bound_cores=1024, for_s=1, timeout_s=5))
    assert r["quiet"] is True and r["waited_s"] < 5
    # nothing is ever under a negative bound: the wait ends at its timeout, saying so
    r = window.wait_quiet(QuietWait(bound_cores=-1, for_s=1, timeout_s=1.5))
    assert r["quiet"] is False and r["waited_s"] >= 1.5 and r["last_other_cores"] >= 0


def test_harness_cpus_set_and_put_back():
    import os

    from testbed.measure import runner
    before = os.sched_getaffinity(0)
    one = min(before)
    with runner.harness_cpus([one], daemons=()) as rec:
        assert os.sched_getaffinity(0) == {one} and rec["cpus"] == [one]
    assert os.sched_getaffinity(0) == before
    with runner.harness_cpus([]) as rec:
        assert rec == {} and os.sched_getaffinity(0) == before


def test_switch_cpus_pin_the_daemon_alone_and_put_it_back(tmp_path):
    """placement.switch: the daemon's threads (a real process under a name of its own, so
    no other process of the host is touched) go to its CPUs, this process stays free."""
    import os
    import shutil
    import subprocess

    from testbed.measure import runner
    cpus = sorted(os.sched_getaffinity(0))
    exe = tmp_path / "tb-fakeswitch"
    shutil.copy("/bin/sleep", exe)
    proc = subprocess.Popen([str(exe), "30"])
    try:
        before_self, before_daemon = os.sched_getaffinity(0), os.sched_getaffinity(proc.pid)
        with runner.harness_cpus([], daemons=("tb-fakeswitch",), daemon_cpus=[cpus[-1]]) as rec:
            assert os.sched_getaffinity(proc.pid) == {cpus[-1]}, rec
            assert os.sched_getaffinity(0) == before_self
            assert rec["daemon_cpus"] == [cpus[-1]] and rec["daemon_threads"] == 1 and rec["cpus"] == []
        assert os.sched_getaffinity(proc.pid) == before_daemon
    finally:
        proc.kill()
        proc.wait()
