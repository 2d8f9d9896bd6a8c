"""The noise guard on real work: a CPU burner (two spinning Python processes, not the
testbed's: reparented to init, so neither attributed nor the harness's own) started during
one sample of a namespace cell makes that sample noisy, with the figure; it is measured
again once the host settled, and compare leaves it out and says so.

This machine is shared (two cores, other work running, each session's processes in a cgroup
of their own, so a burner gets its cgroup's share, not the host), so the test asserts what
must hold whatever else runs: the burner's own CPU over the window shows up in the noise
figure (it is other work), the burned sample is set aside and retried, and the retry is the
next attempt of the same rep, the one the cell keeps. The threshold is low (0.1 cores) so
the burner's share, whatever others take, is above it; on this busy host the retry may be
noisy too, and is then kept, marked (the retry budget is one)."""
from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time

import psutil
import pytest

from testbed.analysis import compare, stats
from testbed.measure import sampling
from testbed.measure import sampling as measure
from testbed.measure import testpaths, window
from testbed.measure.session import claim_tag
from testbed.records import results
from testbed.topology.model import (
    Attachment,
    Backend,
    Cell,
    NoiseAction,
    NoiseSpec,
    Pattern,
    Profile,
    QuietWait,
    Repetitions,
)

# alone: a CPU burner and a quiet-start wait: the noise is the test's own
pytestmark = [pytest.mark.alone, pytest.mark.netns, pytest.mark.attach("netns")]


@pytest.fixture(autouse=True)
def _host_alone(monkeypatch):
    """Its runs hold the host alone, where a noisy sample is measured again (the default)."""
    monkeypatch.delenv("TESTBED_SHARED_HOST", raising=False)

CELL = Cell(Attachment("netns-veth"), Backend.QEMU, 1500, 1,
            Profile("tcp_rr", pattern=Pattern.RR, message_size=1, response_size=1, duration_s=3))


@contextlib.contextmanager
def burner(n: int = 2) -> contextlib.AbstractContextManager[list[psutil.Process]]:
    """``n`` processes spinning on the CPU, detached from this process (their parent shell
    exits at once), killed on the way out."""
    spin = f"{sys.executable} -c 'while True: pass'"
    out = subprocess.run(["sh", "-c", " ".join([f"nice -n -5 {spin} >/dev/null 2>&1 & echo $!;"] * n)],
                         capture_output=True, text=True, timeout=10).stdout
    procs = [psutil.Process(int(p)) for p in out.split()]
    try:
        yield procs
    finally:
        for p in procs:
            with contextlib.suppress(psutil.Error):
                os.kill(p.pid, signal.SIGKILL)


def test_burner_makes_a_sample_noisy_and_it_is_retried(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("needs root: creates namespaces")
    for tool in ("netperf", "netserver"):
        if not shutil.which(tool):
            pytest.skip(f"{tool} missing")
    burned: dict = {}

    @contextlib.contextmanager
    def on_window(cell_id: str, rep: int, attempt: int):
        if (rep, attempt) != (0, 0):
            yield
            return
        with burner() as procs:
            time.sleep(0.3)         # both spinning before the tool starts
            t0 = sum(sum(p.cpu_times()[:2]) for p in procs)
            s0 = time.monotonic()
            yield
            burned["cores"] = (sum(sum(p.cpu_times()[:2]) for p in procs) - t0) / (time.monotonic() - s0)
            burned["pids"] = [p.pid for p in procs]

    spec = NoiseSpec(threshold_cores=0.1, action=NoiseAction.RETRY, max_retries=1,
                     settle=QuietWait(bound_cores=0.1, for_s=1.0, timeout_s=4.0))
    watch = window.Watch(spec, on_window=on_window)
    with results.RunWriter(tmp_path / "res", "20260101T000000Z-nois", _topology(), {"accelerator": "none"}) as w, \
            testpaths.own_endpoints_path(Attachment("netns-veth"), claim_tag(), "198.18.252.0/30", 1500,
                                      str(tmp_path / "ep")) as path:
        kept = measure.measure_cell(CELL, path, w, stats.StoppingRule(Repetitions()), 0, {}, {}, watch=watch)
    run = results.read_run(w.dir)
    first, *rest = run.samples
    # the burner's CPU is other work: the sample's figure holds it (the rest of the host, at
    # least as much again, is others' too), and the sample was set aside
    assert burned["cores"] > 0.15, burned
    assert not any(p in [c.pid for c in psutil.Process().children(recursive=True)] for p in burned["pids"])
    n = first.noise
    assert n["other_cores"] >= 0.9 * burned["cores"] - 0.05, (n, burned)
    assert first.status == "noisy" and n["noisy"] is True and n["action"] == "retried", (first.status, n)
    assert first.reason.startswith("noisy: ") and "cores used by other work (threshold 0.1)" in first.reason
    # measured again: the same rep, the next attempt, and that is the sample the cell kept
    [again] = rest
    assert again.rep == 0 and again.noise["attempt"] == 1 and again.status != "noisy", again
    assert again.noise["action"] in (None, "kept"), again.noise
    assert len(kept) == 1 and kept[0].status == again.status
    assert run.counts.noisy == 1 and run.counts.samples == 2 and run.counts.failed == (again.status == "failed")
    # compare leaves the noisy one out and says how many
    rc = compare.compare_runs(run, run)
    assert rc.noisy["base_excluded"] == 1 and rc.noisy["new_excluded"] == 1
    assert "noisy samples excluded (host busy with other work, measured again): BASE 1, NEW 1" in \
        compare.render_text(rc)


def _topology():
    from testbed.topology import config
    return config.parse("name: noise\nmatrix:\n  attachments: [netns-veth]\n  profiles:\n"
                        "    - {name: tcp_rr, pattern: rr, message_size: 1, response_size: 1, duration: 3}\n",
                        "<noise test>")


def test_quiet_start_timeout_is_exit_4(tmp_path):
    """A run that waits for a quiet host and never gets one stops before anything is
    created, exit 4, naming the field. The test makes the host busy itself: a process
    outside the run spins one core for the whole wait (an idle CI machine would otherwise
    be quiet, and the run would rightly go ahead)."""
    topo = tmp_path / "quiet.yaml"
    topo.write_text("name: quiet\nnoise: {quiet_start: {bound_cores: 0.3, for_s: 1, timeout_s: 3}}\n"
                    "matrix:\n  attachments: [netns-veth]\n  profiles:\n"
                    "    - {name: tcp_rr, pattern: rr, message_size: 1, response_size: 1, duration: 1}\n")
    # Detached (its parent shell exits at once), so it is no descendant of this process: the
    # harness's own CPU is not other work, a stranger's is.
    pid = int(subprocess.run(["sh", "-c", f"{sys.executable} -c 'while True: pass' >/dev/null 2>&1 & echo $!"],
                             capture_output=True, text=True, check=True).stdout)
    try:
        time.sleep(0.5)
        assert window.other_cores_now({}, 1.0) > 0.3, "the spinning process is not seen as other work"
        p = subprocess.run([sys.executable, "-m", "testbed.cli", "--results", str(tmp_path / "res"), "run", str(topo)],
                           capture_output=True, text=True, timeout=300)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    assert p.returncode == 4, p.stderr[-2000:]
    last = p.stderr.strip().splitlines()[-1]
    assert "noise.quiet_start: the host was not quiet within 3 s" in last, p.stderr
    assert not (tmp_path / "res").exists() or not any((tmp_path / "res").iterdir())


def test_pairs_samples_carry_the_noise_figure(tmp_path):
    """N pairs at once (measure_paths over N paths) go through the same guard: the figure per sample."""
    if os.geteuid() != 0 or not shutil.which("netperf"):
        pytest.skip("needs root and netperf")
    from testbed.topology import config
    cell = Cell(Attachment("netns-veth"), Backend.QEMU, 1500, 1, CELL.profile, pairs=2)
    with results.RunWriter(tmp_path / "res", "20260101T000000Z-nopa", _topology(), {"accelerator": "none"}) as w, \
            testpaths.pair_paths(Attachment("netns-veth"), Backend.QEMU, claim_tag(), config.default(), None,
                                 n=2, max_mtu=1500, workdir=tmp_path / "ep") as paths:
        [s] = measure.measure_paths(cell, paths, w, stats.StoppingRule(Repetitions()), 0, {}, {},
                                 watch=window.Watch(NoiseSpec(threshold_cores=1024)))
    assert s.status == "ok", s.reason
    n = s.data["noise"]
    assert n["noisy"] is False and n["action"] is None and n["other_cores"] >= 0 and n["run_queue_mean"] > 0


def test_interleaved_variants_retry_a_noisy_sample_as_a_sequential_cell_does(tmp_path):
    """A variants step (two arms sampled A B B A, as a run measures a cell's variants) goes
    through the same loop and the run's own Watch: the burned sample of variant A is set
    aside as noisy and measured again (the same rep, the next attempt) before B's turn."""
    if os.geteuid() != 0 or not shutil.which("netperf"):
        pytest.skip("needs root and netperf")
    from testbed.measure import variants
    from testbed.measure.context import Arm, Context
    from testbed.topology import config
    from testbed.topology.model import Variant
    windows: list[tuple[str, int, int]] = []

    @contextlib.contextmanager
    def on_window(cell_id: str, rep: int, attempt: int):
        windows.append((cell_id, rep, attempt))
        if len(windows) > 1:
            yield
            return
        with burner():
            time.sleep(0.3)
            yield

    spec = NoiseSpec(threshold_cores=0.1, action=NoiseAction.RETRY, max_retries=1,
                     settle=QuietWait(bound_cores=0.1, for_s=1.0, timeout_s=4.0))
    a, b = variants.expand([CELL], [Variant("A"), Variant("B")])
    with results.RunWriter(tmp_path / "res", "20260101T000000Z-nova", _topology(), {"accelerator": "none"}) as w, \
            testpaths.pair_paths(Attachment("netns-veth"), Backend.QEMU, claim_tag(), config.default(), None,
                                 n=2, max_mtu=1500, workdir=tmp_path / "ep") as paths:
        ctx = Context(w, window.Watch(spec, on_window=on_window))
        kept = sampling.measure(ctx, [Arm(a, (paths[0],), by_pair=False), Arm(b, (paths[1],), by_pair=False)])
    run = results.read_run(w.dir)
    first, again, *rest = run.samples
    assert first.cell.id == a.id and first.status == "noisy" and first.noise["action"] == "retried", first
    # measured again at once, the same rep, the next attempt; then B's turn
    assert again.cell.id == a.id and again.rep == 0 and again.noise["attempt"] == 1 and again.status != "noisy"
    assert [s.cell.id for s in rest] == [b.id] and rest[0].status != "noisy"
    assert windows[:2] == [(a.id, 0, 0), (a.id, 0, 1)], windows
    assert [len(k) for k in kept] == [1, 1] and run.counts.noisy == 1
    assert {c.cell.id for c in run.cells} == {a.id, b.id}