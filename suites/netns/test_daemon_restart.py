"""ovs-vswitchd killed during a stream sample and started again two seconds later, as a
service manager would: the tool and the wire counters lose the same seconds, so the figure
alone looks fine (the cross-check agrees). The sample must fail naming the daemon and both
pids; once the switch answers again (it rebuilds the bridge and ports from its database)
the next sample measures normally. The same holds for a cell of two pairs measured at once
through the run's cell loop: the restart fails that cell's sample with the cause.

The switch is a PRIVATE ovsdb-server + ovs-vswitchd in a tb- namespace (ovsd.private): the
host's own switch is never touched."""
from __future__ import annotations

import contextlib
import dataclasses
import os
import shutil
import signal
import threading
import time

import pytest

from testbed import errors
from testbed.attachments.ovs import namespaces as ovsns
from testbed.host import proc
from testbed.host.hostwatch import Daemon, Guard
from testbed.host.net import ovsd
from testbed.measure import sampling as measure
from testbed.measure import testpaths
from testbed.measure.context import Arm, Context
from testbed.measure.session import claim_tag
from testbed.records import results
from testbed.topology import config
from testbed.topology.model import Attachment, Backend, Cell, Profile

# alone: it kills the host's ovs-vswitchd, which every OVS test beside it uses
pytestmark = [pytest.mark.alone, pytest.mark.netns, pytest.mark.attach("netns")]


@dataclasses.dataclass
class Switch:
    """A private ovsdb-server + ovs-vswitchd in a tb- namespace, and the pidfile of its switch
    that the guards read (it has none of its own)."""

    ovs: object
    ns: str
    pidfile: object
    work: object
    restarted: list[int] = dataclasses.field(default_factory=list)

    @property
    def ctl(self):
        return self.work / "ovs-vswitchd-2.ctl"

    def guarded(self, path):
        """``path`` with a guard that watches this switch through its pidfile."""
        g = path.guard
        return dataclasses.replace(path, guard=Guard((Daemon("ovs-vswitchd", (str(self.pidfile),)),), g.objects,
                                                     g.read_bytes, g.devices))

    def restart_later(self, first: int) -> threading.Thread:
        """1.5 s from now ovs-vswitchd is killed, and started again 2 s later, as a service
        manager would (its pid goes to ``restarted``)."""
        def restart() -> None:
            time.sleep(1.5)
            os.kill(first, signal.SIGKILL)
            time.sleep(2.0)
            w = self.work
            proc.run(["ip", "netns", "exec", self.ns, "ovs-vswitchd", self.ovs.db, f"--unixctl={self.ctl}",
                      f"--log-file={w / 'ovs-vswitchd-2.log'}", f"--pidfile={self.pidfile}",
                      "--detach", "--no-chdir", "-vconsole:off"],
                     env={"OVS_RUNDIR": str(w), "OVS_DBDIR": str(w), "OVS_LOGDIR": str(w)}, timeout=30)
            self.restarted.append(int(self.pidfile.read_text()))
        th = threading.Thread(target=restart)
        th.start()
        return th


@contextlib.contextmanager
def _private_switch(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("needs root: namespaces and a private OVS")
    for tool in ("netperf", "netserver", "ovs-vswitchd", "ovsdb-server"):
        if not shutil.which(tool):
            pytest.skip(f"{tool} missing")
    ns = f"tb-{claim_tag()}-s"
    work = tmp_path / "ovs"
    proc.run(["ip", "netns", "add", ns])
    try:
        try:
            sw_cm = ovsd.private(ns, work)
            sw = Switch(sw_cm.__enter__(), ns, tmp_path / "ovs-vswitchd.pid", work)
        except (errors.CapabilityError, errors.TestbedError) as e:
            pytest.skip(f"private ovs-vswitchd not startable: {e}")
        try:
            yield sw
        finally:
            for pid in sw.restarted:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGTERM)
            sw_cm.__exit__(None, None, None)
    finally:
        proc.run(["ip", "netns", "delete", ns], check=False)


def test_ovs_vswitchd_restarted_mid_sample_fails_it_naming_the_daemon(tmp_path):
    with _private_switch(tmp_path) as sw, ovsns.ovs_veth(claim_tag(), switch=sw.ovs) as conn, \
            testpaths.connection_path(conn, str(tmp_path / "ep")) as path:
        path = sw.guarded(path)
        (first,) = ovsd.vswitchd_pids(sw.ovs.db)
        sw.pidfile.write_text(f"{first}\n")
        writer = results.RunWriter(tmp_path / "res", "run", config.default(), {})
        cell = Cell(Attachment("netns-ovs-veth"), Backend.QEMU, 1500, 1,
                    Profile("tcp_stream", message_size=16384, duration_s=5))
        th = sw.restart_later(first)
        s = measure.measure_once(cell, path, writer, 0, False, {}, {})
        th.join()
        assert s.status == "failed", (s.status, s.metrics)
        assert f"ovs-vswitchd restarted during the sample (pid {first} -> {sw.restarted[0]})" in s.reason, s.reason
        assert path.guard.fault
        path.guard.wait_back(30, answers=lambda: proc.ok(
            ["ovs-appctl", "-t", str(sw.ctl), "--timeout=2", "version"], timeout=7))
        time.sleep(1)       # the new switch adds its ports back from the database
        s = measure.measure_once(cell, path, writer, 1, False, {}, {})
        assert s.status == "ok", s.reason
        assert s.metrics["throughput_mbps"] > 0
        writer.finish("complete")


def test_ovs_vswitchd_restarted_under_a_two_pair_cell_fails_its_sample_with_the_cause(tmp_path):
    """Two pairs on one private switch, measured at once through the one cell loop (as a
    run's N-pair cell is): each path has its host guard, and the restart fails the sample."""
    with _private_switch(tmp_path) as sw, contextlib.ExitStack() as stack:
        paths = []
        for k in range(2):
            conn = stack.enter_context(ovsns.ovs_veth(claim_tag(), switch=sw.ovs))
            paths.append(sw.guarded(stack.enter_context(testpaths.connection_path(conn, str(tmp_path / f"ep{k}")))))
        (first,) = ovsd.vswitchd_pids(sw.ovs.db)
        sw.pidfile.write_text(f"{first}\n")
        writer = stack.enter_context(results.RunWriter(tmp_path / "res", "run", config.default(), {}))
        cell = Cell(Attachment("netns-ovs-veth"), Backend.QEMU, 1500, 1,
                    Profile("tcp_stream", message_size=16384, duration_s=5), pairs=2)
        th = sw.restart_later(first)
        [[s]] = measure.measure(Context(writer), [Arm(cell, tuple(paths))])
        th.join()
    assert s.status == "failed", (s.status, s.metrics)
    assert f"ovs-vswitchd restarted during the sample (pid {first} -> {sw.restarted[0]})" in s.reason, s.reason
    assert all(p.guard.fault for p in paths)        # the run rebuilds the segment after this cell
    [outcome] = results.read_run(tmp_path / "res" / "run").cells
    assert outcome.status == "failed" and "ovs-vswitchd restarted" in outcome.reason
