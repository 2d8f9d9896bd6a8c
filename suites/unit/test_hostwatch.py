"""Detecting what the host did to a sample from outside (testbed.host.hostwatch): a daemon that
restarted (a real process stopped and started again under its pidfile), a daemon that does
not come back, and gaps in wire counters."""
from __future__ import annotations

import subprocess
import threading
import time

import pytest

from testbed.host import hostwatch
from testbed.host.hostwatch import Daemon, Guard, Seen


def test_gaps_are_silences_between_traffic_not_at_the_ends():
    # 0.25 s readings: quiet start, traffic (10 kB a reading), 1.25 s of nothing, traffic, quiet end
    t = [i * 0.25 for i in range(20)]
    b = [x * 1000 for x in (0, 0, 0, 10, 20, 30, 40, 40, 40, 40, 40, 40, 50, 60, 70, 80, 80, 80, 80, 80)]
    (g,) = hostwatch.gaps(list(zip(t, b)))
    assert (g.at_s, g.length_s) == (1.5, 1.25)
    assert hostwatch.gaps(list(zip(t, b)), min_gap_s=1.5) == []
    assert hostwatch.gaps([(0, 0), (1, 5000), (2, 10000), (3, 15000)]) == []
    assert hostwatch.gaps([(0, 0), (5, 0), (6, 0)]) == []      # never moved: not a gap


def test_a_quiet_end_followed_by_a_neighbour_probe_is_no_gap():
    """The end of a 60 s sockperf run as the taps counted it: ping-pong traffic, then 4.5 s
    of silence while the client writes its log, then a unicast ARP probe and its reply (120
    bytes). That is a quiet end, not a stall; the same silence followed by the tool's
    traffic again is a gap."""
    t = [i * 0.25 for i in range(40)]
    probe = [i * 5000 if i < 10 else 45000 if i < 28 else 45120 for i in range(40)]
    assert hostwatch.gaps(list(zip(t, probe)), min_gap_s=2.0) == []
    resumed = [i * 5000 if i < 10 else 45000 if i < 28 else 45000 + (i - 27) * 5000 for i in range(40)]
    (g,) = hostwatch.gaps(list(zip(t, resumed)), min_gap_s=2.0)
    assert (g.at_s, g.length_s) == (2.25, 4.5)
    # the threshold is the bytes to the window's end: a probe, then the tool again, is a gap
    assert hostwatch.gaps(list(zip(t, probe)), min_gap_s=2.0, min_after_bytes=100) != []


def test_an_ongoing_silence_after_traffic_is_a_stall_once_long_enough():
    t = [i * 0.5 for i in range(30)]
    moving = [i * 10 if i < 6 else 50 for i in range(30)]     # traffic to 2.5 s, then nothing
    g = hostwatch.ongoing_gap(list(zip(t, moving)), stall_s=10)
    assert (g.at_s, g.length_s) == (2.5, 12.0)
    assert hostwatch.ongoing_gap(list(zip(t, moving)), stall_s=13) is None
    assert hostwatch.ongoing_gap(list(zip(t, [0] * 30)), stall_s=1) is None       # never moved
    assert hostwatch.ongoing_gap(list(zip(t, range(30))), stall_s=1) is None      # still moving
    # bytes before ``since`` are not traffic: no stall; times stay from the first reading
    assert hostwatch.ongoing_gap(list(zip(t, moving)), stall_s=1, since=3.0) is None
    late = moving[:20] + [60, 70] + [70] * 8                                # traffic again at 10-10.5 s
    g = hostwatch.ongoing_gap(list(zip(t, late)), stall_s=1, since=3.0)
    assert (g.at_s, g.length_s) == (10.5, 4.0)


def test_a_silent_wire_stops_the_sample_while_it_runs(monkeypatch):
    """Counters that move, then stop: the watch's stop is set with the silence in words
    after the stall time, while the sample is still open (its tools would be killed)."""
    monkeypatch.setattr(hostwatch, "STALL_STOP_S", 1.0)
    clock = {"from": time.monotonic()}
    guard = Guard(read_bytes=lambda: min(int((time.monotonic() - clock["from"]) * 1000), 300),
                  devices=("tb-x-a",), interval_s=0.05)
    with guard.sample() as sw:
        # not before the tools are started: bytes before then are no traffic of theirs
        assert not sw.stop.wait(2.5)
        sw.tools_from = clock["from"] = start = time.monotonic()    # traffic for 0.3 s, then none
        stopped = sw.stop.wait(5)
        took = time.monotonic() - start
    assert stopped and 1.0 < took < 3.5, took
    assert "had not resumed (no byte on tb-x-a" in sw.stop.why and "a stall" in sw.stop.why


def test_a_silence_the_tool_keeps_at_its_start_is_no_gap_but_one_later_is():
    """sockperf's pause after its warm-up messages (ToolDriver.quiet_start_s): traffic, a
    silence, traffic again. Beginning before the watch's quiet_until it is the tool's own;
    the same silence beginning after it fails the sample as a gap."""
    def run(quiet_s: float) -> str | None:
        start = time.monotonic()

        def read() -> int:      # 100 kB/s for 0.3 s, none for 1.2 s, then 100 kB/s again
            dt = time.monotonic() - start
            return int(dt * 1e5) if dt < 0.3 else 30000 if dt < 1.5 else 30000 + int((dt - 1.5) * 1e5)
        guard = Guard(read_bytes=read, devices=("tb-x-a",), interval_s=0.05)
        with guard.sample() as sw:
            sw.tools_from, sw.quiet_until = start, start + quiet_s
            time.sleep(2.0)
        return sw.finish()
    assert run(1.0) is None
    why = run(0.1)
    assert why is not None and "wire counters stopped for" in why and "a link flap or a stall" in why, why


def test_changes_name_the_daemon_and_both_pids():
    b = [Seen("ovs-vswitchd", 123, 1.0), Seen("ovsdb-server", 7, 1.0), Seen("libvirtd", 9, 1.0)]
    a = [Seen("ovs-vswitchd", 456, 5.0), Seen("ovsdb-server", 7, 1.0), Seen("libvirtd", None, None)]
    assert hostwatch.changes(b, a) == ["ovs-vswitchd restarted during the sample (pid 123 -> 456)",
                                       "libvirtd stopped during the sample (pid 9 gone)"]
    # same pid, another start time: the pid was reused by a new instance
    assert hostwatch.changes([Seen("x", 5, 1.0)], [Seen("x", 5, 2.0)]) == \
        ["x restarted during the sample (pid 5 -> 5)"]


def _daemon(pidfile, started=None):
    p = subprocess.Popen(["sleep", "300"])
    if started is not None:
        started.append(p)      # known before its pidfile says so: a waiter may read it at once
    pidfile.write_text(f"{p.pid}\n")
    return p


def test_a_real_process_restarted_during_a_sample_fails_it_naming_it(tmp_path):
    pidfile = tmp_path / "sleep.pid"
    first = _daemon(pidfile)
    guard = Guard(daemons=(Daemon("sleep", (str(pidfile),)),))
    try:
        with guard.sample() as sw:
            first.kill()
            first.wait()
            second = _daemon(pidfile)
        assert sw.reason == f"sleep restarted during the sample (pid {first.pid} -> {second.pid})"
        assert guard.fault == sw.reason
        # it runs again: the wait returns at once with the new instance
        (seen,) = guard.wait_back(5)
        assert seen.pid == second.pid and guard.fault is None
        with guard.sample() as sw:
            pass
        assert sw.reason is None
    finally:
        for p in (first, locals().get("second")):
            if p is not None:
                p.kill()
                p.wait()


def test_a_daemon_that_comes_back_late_is_waited_for_and_one_that_does_not_stops_the_run(tmp_path):
    pidfile = tmp_path / "sleep.pid"
    first = _daemon(pidfile)
    guard = Guard(daemons=(Daemon("sleep", (str(pidfile),)),))
    procs = [first]
    with guard.sample() as sw:
        first.kill()
        first.wait()
    assert sw.reason == f"sleep stopped during the sample (pid {first.pid} gone)"
    threading.Timer(1.0, lambda: _daemon(pidfile, procs)).start()
    t0 = time.monotonic()
    (seen,) = guard.wait_back(10)
    assert 0.9 <= time.monotonic() - t0 < 5 and seen.pid == procs[-1].pid
    procs[-1].kill()
    procs[-1].wait()
    guard.fault = "sleep stopped during the sample"
    with pytest.raises(hostwatch.DaemonLost) as e:
        guard.wait_back(1)
    assert e.value.exit_status == 4 and "sleep did not come back within 1 s" in str(e.value)
    assert "--resume" in str(e.value) and "\n" not in str(e.value)


def test_a_missing_object_is_named():
    there = {"tb-x-a": True, "tb-x-b": False}
    guard = Guard(objects=tuple((n, lambda n=n: there[n]) for n in there))
    assert guard.missing() == ["tb-x-b went missing (removed from outside the run)"]
    with guard.sample() as sw:
        pass
    assert "tb-x-b went missing" in sw.reason and guard.fault


def test_a_device_gone_before_its_guest_reads_stopped_blames_the_guest(tmp_path):
    """A destroyed guest's QEMU closes its tap a moment before libvirt marks the domain
    stopped. A look that lands in that moment must still blame the guest, not the device.
    Here the guest is a real process and its device a real file: the file goes first and
    the process dies 1 s later."""
    proc = subprocess.Popen(["sleep", "60"])
    tap = tmp_path / "tb-x-t0"
    tap.write_text("")

    def guest() -> str | None:
        return None if proc.poll() is None else "guest g1 stopped from outside"

    guard = Guard(objects=(("device tb-x-t0", tap.exists),), guests=(("g1", guest),))
    try:
        tap.unlink()
        threading.Timer(1.0, proc.kill).start()
        assert guard.missing() == ["guest g1 stopped from outside"]
        assert guard.lost == {"g1": "guest g1 stopped from outside"}
    finally:
        proc.kill()
        proc.wait()
    # with the guest still running past the settling time, the device is what is named
    alive = subprocess.Popen(["sleep", "60"])
    try:
        guard = Guard(objects=(("device tb-x-t0", tap.exists),),
                      guests=(("g1", lambda: None if alive.poll() is None else "gone"),))
        t0 = time.monotonic()
        assert guard.missing() == ["device tb-x-t0 went missing (removed from outside the run)"]
        assert time.monotonic() - t0 >= hostwatch.GUEST_SETTLE_S
    finally:
        alive.kill()
        alive.wait()
