"""Nightly comparison on real measurements: the same path twice compares as unchanged; the
same path throttled by a tbf qdisc on its tap compares as regressed, with exit status 1."""
from __future__ import annotations

import statistics
import subprocess
import sys

from testbed.analysis import stats
from testbed.host import environment, proc
from testbed.measure import sampling as measure
from testbed.measure import testpaths
from testbed.records import results
from testbed.topology.config import default
from testbed.topology.model import Attachment, Backend, Cell, Pattern, Profile, Repetitions

CELL = Cell(Attachment("bridge"), Backend.QEMU, 1500, 1,
            Profile("tcp_stream", pattern=Pattern.STREAM, message_size=16384, duration_s=3))
REPS = Repetitions(warmup=0, min_samples=5, max_samples=5, rsd_target=0)   # compare needs 5 a side


def _run(gp, root, name, throttle_mbit=None):
    """Five good, steady samples of the cell on a freshly plugged path. A path whose samples
    failed or spread wildly is plugged afresh, up to three times in all: twice on this 2-core
    TCG host the server guest's new virtio NIC stopped receiving a few seconds into a stream
    (the guard saw TCP back off, 3-26 s gaps, and the next sample could not reach netserver),
    which is the guest's fault, not the comparison's, and each failed sample says so in the
    run written first."""
    errors = []
    for attempt in range(3):
        try:
            return _run_once(gp, root, name if not attempt else f"{name}-again{attempt}", throttle_mbit)
        except AssertionError as e:
            errors.append(str(e))
    raise AssertionError("three times too few good or steady samples: " + "; then: ".join(errors))


def _run_once(gp, root, name, throttle_mbit=None):
    env = environment.fingerprint(gp.accelerator)
    with results.RunWriter(root, name, default(), env) as w:
        with testpaths.mode(CELL.attachment, CELL.backend, gp.tag, gp.client, gp.server, "198.18.0.0/24",
                         CELL.mtu) as path:
            if throttle_mbit:
                # Egress of the server's tap is what reaches the server guest.
                # A generous burst and queue: drops under a tight tbf can stall a TCG guest's
                # netperf past its timeout, which would test TCP recovery, not the gate.
                proc.run(["tc", "qdisc", "add", "dev", path.server.tap, "root", "tbf", "rate",
                          f"{throttle_mbit}mbit", "burst", "1mb", "latency", "500ms"])
            samples = measure.measure_cell(CELL, path, w, stats.StoppingRule(REPS), 0, {}, {})
    ok = [s for s in samples if s.status == "ok"]
    # A failed sample is recorded with its reason and left out of the comparison; the gate
    # still needs enough good ones on each side for a significance test.
    assert len(ok) >= 5, [s.reason for s in samples]
    vals = [s.metrics["throughput_mbps"] for s in ok]
    # A host busy with the suite's other workers can stall a TCG guest for seconds: samples
    # spread that widely once made even a -78 % change honestly inconclusive, so such a run is
    # measured again, like one with failed samples. A stall only lowers a sample, so the
    # spread is taken without the lowest one: one stalled sample of five (57 against 136-301
    # Mbit/s) still leaves a throttled path plainly regressed by the gate's own test.
    upper = sorted(vals)[1:]
    cv = statistics.stdev(upper) / statistics.mean(upper)
    assert cv <= 0.5, f"samples spread {cv:.0%} without the lowest (a TCG guest stalled by the busy host): {vals}"
    return root / name, vals


def _compare(base, new):
    return subprocess.run([sys.executable, "-m", "testbed.cli", "compare", str(base), str(new),
                           "--threshold", "0.3"], capture_output=True, text=True, timeout=120)


def test_same_path_unchanged_throttled_path_regressed(guest_pair, tmp_path):
    base, b = _run(guest_pair, tmp_path, "base")
    same, s = _run(guest_pair, tmp_path, "same")
    # the median: one BASE sample of a TCG guest on a busy host once fell to 18 Mbit/s
    # against 230-430 for the others (the host stalled it), which the comparison can carry
    # but a throttle set from the minimum cannot
    typical = statistics.median(b)
    # Cut to a tenth: a fifth (-80 %) was once left honestly undecided, its interval -86 % to
    # -20 %, when stalls spread BASE's five samples on a busy 2-core host. What this test
    # checks is that real runs reach the gate and a plain regression exits 1; the gate's
    # power at small changes is `testbed bench gate`'s.
    slow, t = _run(guest_pair, tmp_path, "throttled", throttle_mbit=max(5, int(typical / 10)))
    assert max(t) < 0.3 * typical, (b, t)
    p = _compare(base, same)
    # The same path never regresses. "Unchanged" must be shown by equivalence (the change's
    # interval within +-30 %), which 5 TCG samples a side may not be precise enough for: then
    # the gate says undecided (exit 5), never regressed.
    assert p.returncode in (0, 5), p.stdout + p.stderr
    assert ("unchanged" if p.returncode == 0 else "inconclusive") in p.stdout.lower()
    assert "REGRESSED" not in p.stdout          # the verdict column
    p = _compare(base, slow)
    assert p.returncode == 1, p.stdout + p.stderr
    assert "regressed" in p.stdout.lower()
