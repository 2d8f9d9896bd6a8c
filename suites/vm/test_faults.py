"""Faults are recorded as failed samples or cells with a reason, and the run goes on.

Each fault is injected for real inside the session's guests: a stopped client, a killed
server, a frozen guest agent, a tool that is not installed, a guest that never boots."""
from __future__ import annotations

import contextlib
import dataclasses
import time

import pytest

from testbed.analysis import stats
from testbed.errors import ReadinessError
from testbed.guests import images, virt
from testbed.host import hostwatch
from testbed.measure import sampling as measure
from testbed.measure import testpaths
from testbed.records import results
from testbed.topology.config import default
from testbed.topology.model import Attachment, Backend, Cell, GuestSpec, Pattern, Profile, Repetitions, Tool

STREAM = Profile("tcp_stream", pattern=Pattern.STREAM, message_size=16384, duration_s=6)
# 20 s: the fault lands while the stream runs even when a busy host starts the guest's shell
# late (a 6 s stream could end first, and the sample rightly be ok)
LONG_STREAM = dataclasses.replace(STREAM, duration_s=20)


@pytest.fixture
def writer(tmp_path):
    with results.RunWriter(tmp_path, "fault-run", default(), {"accelerator": "test"}) as w:
        yield w


@contextlib.contextmanager
def bridge_path(gp):
    with testpaths.mode(Attachment("bridge"), Backend.QEMU, gp.tag, gp.client, gp.server, "198.18.0.0/24",
                     1500) as path:
        yield path


def _measure(path, writer, profile=STREAM):
    cell = Cell(Attachment("bridge"), Backend.QEMU, 1500, 1, profile)
    return measure.measure_cell(cell, path, writer, stats.StoppingRule(Repetitions()), 0, {}, {})


def _in_guest_later(guest, script: str) -> None:
    """Start a shell in the guest that injects the fault while we measure."""
    guest.agent.spawn(["/bin/sh", "-c", script])


# Wait (at most 60 s) until the measurement is under way, then inject.
WHEN_CLIENT_RUNS = "for i in $(seq 300); do pgrep -x netperf >/dev/null && break; sleep 0.2; done; sleep 1; "
# netserver forks a child per test: two of them means a test is running.
WHEN_TEST_RUNS = ("for i in $(seq 300); do [ $(pgrep -c -x netserver) -ge 2 ] && break; sleep 0.2; done; "
                  "sleep 1; ")


def _sample_with_a_hung_client(gp, writer):
    """One sample whose netperf client is stopped (SIGSTOP) a second into the stream: the
    sample, and how long it took."""
    with bridge_path(gp) as path:
        _in_guest_later(gp.client, WHEN_CLIENT_RUNS + "pkill -STOP -x netperf")
        t0 = time.monotonic()
        [s] = _measure(path, writer, LONG_STREAM)
        return s, time.monotonic() - t0


def test_client_that_hangs_times_out(guest_pair, writer, monkeypatch):
    monkeypatch.setattr(measure, "SAMPLE_MARGIN_S", 5)
    # the wire's silence would stop it first otherwise (the next test): the timeout is tested here
    monkeypatch.setattr(hostwatch, "STALL_STOP_S", 600)
    s, took = _sample_with_a_hung_client(guest_pair, writer)
    assert s.status == "failed"
    assert "client timed out" in s.reason
    assert took < LONG_STREAM.duration_s + 5 + 30
    # The stopped client was killed, not left behind in the guest.
    assert guest_pair.client.agent.run(["/usr/bin/pgrep", "-x", "netperf"], check=False).rc == 1


def test_a_silent_wire_stops_a_hung_client_long_before_its_timeout(guest_pair, writer):
    """The client stops sending a second into the stream (SIGSTOP, as a guest NIC that stops
    receiving under TCG leaves it): after STALL_STOP_S of silence on the path's devices the
    sample is stopped and failed, naming the silence, instead of waiting out the tool's
    timeout (the stream's 20 s and a minute)."""
    assert measure.SAMPLE_MARGIN_S >= 60
    s, took = _sample_with_a_hung_client(guest_pair, writer)
    assert s.status == "failed"
    assert "stopped early" in s.reason and "had not resumed" in s.reason and "a stall" in s.reason, s.reason
    assert took < hostwatch.STALL_STOP_S + 30, took
    assert guest_pair.client.agent.run(["/usr/bin/pgrep", "-x", "netperf"], check=False).rc == 1


def test_server_that_dies_mid_measurement(guest_pair, writer):
    with bridge_path(guest_pair) as path:
        _in_guest_later(guest_pair.server, WHEN_TEST_RUNS + "pkill -KILL -x netserver")
        [s] = _measure(path, writer, LONG_STREAM)
    assert s.status == "failed"
    assert s.reason and "netperf" in s.reason.lower()
    assert s.metrics == {}


def test_tool_missing_in_guest(guest_pair, writer):
    uperf = Profile("uperf_stream", tool=Tool("uperf"), pattern=Pattern.STREAM, message_size=1024, duration_s=3)
    with bridge_path(guest_pair) as path:
        [s] = _measure(path, writer, uperf)
    assert s.status == "failed"
    assert "server did not start" in s.reason and "uperf" in s.reason


def test_unreachable_guest_agent(guest_pair, writer):
    g = guest_pair.client
    with bridge_path(guest_pair) as path:
        # Freeze the agent for 16 s from inside; a child shell thaws it again. The sample's
        # first call to the frozen agent comes about 1 s into the freeze and gives up after
        # guest.AGENT_TIMEOUT_S (10 s): the thaw comes well after that.
        _in_guest_later(g, "sleep 1; kill -STOP $(pidof qemu-ga); sleep 16; kill -CONT $(pidof qemu-ga)")
        time.sleep(2)
        [s] = _measure(path, writer)
        assert s.status == "failed"
        assert "agent" in s.reason
        deadline = time.monotonic() + 90
        while not g.agent.ping():
            assert time.monotonic() < deadline, "agent did not come back"
            time.sleep(1)
    # The run goes on: the next sample on the same pair measures again.
    with bridge_path(guest_pair) as path:
        [s2] = _measure(path, writer)
    assert s2.status == "ok", s2.reason


def test_guest_that_does_not_boot(accelerator, tmp_path):
    """A root disk that is not there: the initramfs gives up and the guest stops; the error
    says what was awaited and shows the console."""
    img = dataclasses.replace(images.ensure(), cmdline="root=/dev/vdz rootdelay=2 panic=1 console=ttyS0")
    from testbed.admin import cleanup
    with cleanup.owned_fresh_state(results.new_run_id) as (run_id, tag, state), virt.connect("qemu:///system") as conn:
        with virt.guest(conn, GuestSpec("bad", "local"), img, accelerator, run_id, tag, state) as g:
            with pytest.raises(ReadinessError) as ei:
                g.wait_ready(120)
    msg = str(ei.value)
    assert "guest agent" in msg and "last console lines" in msg
    assert "vdz" in msg or "root" in msg.lower()
    # libvirt's own log of the domain went with it (libvirt keeps it otherwise)
    from testbed.host import paths
    assert not list(paths.QEMU_LOG_DIR.glob(f"tb-{tag}-*")), list(paths.QEMU_LOG_DIR.glob(f"tb-{tag}-*"))
