"""The tracer processes: bpftrace (Debian's package) on the host and in each guest, started
before a traced sample's window opens and stopped when it closes, on every way out.

bpftrace compiles its program when it starts (seconds on the host, longer in a TCG guest);
the window opens only once it says it is attached, so that cost falls outside it. Stopped
with SIGINT it prints its histograms and exits; one that does not is killed, and the sample
gets its hops as not observed, with the reason.
"""
from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import time
from dataclasses import dataclass

from testbed.errors import CommandError, GuestError
from testbed.host import proc
from testbed.host.bpftrace import BPFTRACE, ENV, last_error
from testbed.measure.cpu import process_seconds
from testbed.measure.hops import bpfstats, parse

log = logging.getLogger(__name__)

ATTACH_TIMEOUT_S = 90.0
GUEST_ATTACH_TIMEOUT_S = 600.0       # LLVM compiling under TCG
#: bpftrace detaches its probes, runs END and prints its maps after SIGINT: under a second
#: here, but more than 30 s once and more than 90 s once on a CI machine saturated by tests
#: beside it (two tracers and TCG guests). One SIGINT only: bpftrace 0.17 given a second
#: one while it reads its maps (0.1 s after the first, 40 000 keys) exits without printing
#: any, where waiting gets them all. One that still has not exited is described (where its
#: threads wait in the kernel, the CPU it used meanwhile) before it is killed, so the
#: sample's reason says whether it was starved, spinning or stuck.
STOP_TIMEOUT_S = 180.0
GUEST_STOP_TIMEOUT_S = 360.0         # its maps read under TCG


class TracerError(Exception):
    """A tracer that could not start or stop; the sample's hops say why."""


def describe(pid: int, cpu0: float, waited_s: float) -> str:
    """Where a process that would not exit is: its state, the CPU it used while it was
    waited for, and the distinct kernel functions its threads wait in (their stacks' top)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return "it exited as it was killed"
    parts = [f"state {state}", f"{process_seconds(pid) - cpu0:.1f} s of CPU in {waited_s:.0f} s"]
    waits: list[str] = []
    with contextlib.suppress(OSError):
        for tid in sorted(os.listdir(f"/proc/{pid}/task"), key=int):
            with contextlib.suppress(OSError):
                with open(f"/proc/{pid}/task/{tid}/stack") as f:
                    frames = [ln.split("] ", 1)[-1].split("+", 1)[0] for ln in f.read().splitlines()]
                if frames and frames[0] not in waits:
                    waits.append(frames[0])
    if waits:
        parts.append("threads waiting in " + ", ".join(waits[:4]))
    return "; ".join(parts)


@dataclass
class HostTracer:
    """bpftrace on this host, for one sample."""

    program: str
    out_dir: str
    name: str = "tb-hops-host"
    bg: proc.Background | None = None
    attach_s: float | None = None
    #: seconds from SIGINT to its exit
    stop_s: float | None = None
    stats: bpfstats.RunStats | None = None

    def start(self, timeout: float = ATTACH_TIMEOUT_S) -> None:
        path = os.path.join(self.out_dir, f"{self.name}.bt")
        os.makedirs(self.out_dir, exist_ok=True)
        with open(path, "w") as f:
            f.write(self.program)
        t0 = time.monotonic()
        try:
            self.bg = proc.start([BPFTRACE, path], out_dir=self.out_dir, name=self.name, env=ENV)
        except CommandError as e:
            raise TracerError(f"bpftrace did not start: {e}") from None
        while parse.READY not in self.bg.stdout():
            if self.bg.popen.poll() is not None:
                raise TracerError(f"bpftrace exited ({self.bg.popen.returncode}) before it attached: "
                                  f"{last_error(self.bg.stdout() + self.bg.stderr())}")
            if time.monotonic() - t0 > timeout:
                self.bg.stop()
                raise TracerError(f"bpftrace not attached after {timeout:.0f} s")
            time.sleep(0.05)
        self.attach_s = round(time.monotonic() - t0, 3)

    def stop(self, timeout: float = STOP_TIMEOUT_S) -> str:
        """Its output, once it printed its maps and exited."""
        bg = self.bg
        if bg is None:
            raise TracerError("bpftrace was not started")
        pid = bg.popen.pid
        self.stats = bpfstats.of_process(pid)
        cpu0 = process_seconds(pid)
        t0 = time.monotonic()
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGINT)
        try:
            bg.popen.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            seen = describe(pid, cpu0, time.monotonic() - t0)
            bg.stop()
            raise TracerError(f"bpftrace did not exit within {timeout:.0f} s of SIGINT ({seen})") from None
        except BaseException:
            bg.stop()
            raise
        finally:
            self.bg = None
        self.stop_s = round(time.monotonic() - t0, 3)
        return bg.stdout()

    def kill(self) -> None:
        """The teardown of every other way out (an error, Ctrl-C)."""
        if self.bg is not None:
            self.bg.stop()
            self.bg = None


@dataclass
class GuestTracer:
    """bpftrace inside a guest, through its agent, for one sample."""

    agent: object
    program: str
    guest: str
    #: BPF's run time counted (HopSession.window): the guest's sysctl on for the window
    count_bpf: bool = True
    pid: int | None = None
    attach_s: float | None = None
    stats: bpfstats.RunStats | None = None
    PROGRAM = "/run/tb-hops.bt"
    OUTPUT = "/run/tb-hops.out"

    def _run(self, argv: list[str], timeout: float = 30) -> tuple[int, str]:
        res = self.agent.run(argv, check=False, timeout=timeout)  # type: ignore[attr-defined]
        return res.rc, res.stdout + res.stderr

    def start(self, timeout: float = GUEST_ATTACH_TIMEOUT_S) -> None:
        a = self.agent
        try:
            a.write_file(self.PROGRAM, self.program)  # type: ignore[attr-defined]
            # Emptied before the spawn, not by its redirection: read before the shell ran, a
            # missing file failed the start, and the last sample's output (its "attached"
            # line) was taken for this tracer's, whose window then opened while its program
            # was still compiling.
            a.write_file(self.OUTPUT, "")  # type: ignore[attr-defined]
            # the kernel counts BPF run time only when asked; the guest is the testbed's own
            if self.count_bpf:
                self._run(["/sbin/sysctl", "-q", "-w", "kernel.bpf_stats_enabled=1"])
            t0 = time.monotonic()
            self.pid = a.spawn(["/bin/sh", "-c", f"exec env BPFTRACE_MAP_KEYS_MAX={ENV['BPFTRACE_MAP_KEYS_MAX']} "  # type: ignore[attr-defined]
                                f"{BPFTRACE} {self.PROGRAM} > {self.OUTPUT} 2>&1"])
            while True:
                out = a.read_file(self.OUTPUT)  # type: ignore[attr-defined]
                if parse.READY in out:
                    break
                if not a.alive(self.pid):  # type: ignore[attr-defined]
                    self.pid = None
                    raise TracerError(f"bpftrace in {self.guest} exited before it attached: {last_error(out)}")
                if time.monotonic() - t0 > timeout:
                    self.kill()
                    raise TracerError(f"bpftrace in {self.guest} not attached after {timeout:.0f} s")
                time.sleep(0.5)
            self.attach_s = round(time.monotonic() - t0, 3)
        except (CommandError, GuestError) as e:
            self.kill()
            raise TracerError(f"bpftrace in {self.guest} could not start: {e}") from None

    def stop(self) -> str:
        if self.pid is None:
            raise TracerError(f"bpftrace in {self.guest} was not started")
        a, pid = self.agent, self.pid
        try:
            rc, fdinfo = self._run(["/bin/sh", "-c", f"cat /proc/{pid}/fdinfo/* 2>/dev/null; true"])
            self.stats = bpfstats.parse_fdinfo(fdinfo.split("pos:")) if rc == 0 and self.count_bpf else None
            a.kill(pid, "INT")  # type: ignore[attr-defined]
            t0 = time.monotonic()
            while a.alive(pid):  # type: ignore[attr-defined]
                if time.monotonic() - t0 > GUEST_STOP_TIMEOUT_S:
                    raise TracerError(f"bpftrace in {self.guest} did not exit within "
                                      f"{GUEST_STOP_TIMEOUT_S:.0f} s of SIGINT")
                time.sleep(0.5)
            self.pid = None
            return a.read_file(self.OUTPUT)  # type: ignore[attr-defined]
        except (CommandError, GuestError) as e:
            raise TracerError(f"bpftrace in {self.guest} could not be stopped: {e}") from None
        finally:
            self.kill()

    def kill(self) -> None:
        if self.pid is not None:
            with contextlib.suppress(CommandError, GuestError):
                self.agent.kill(self.pid)  # type: ignore[attr-defined]
            self.pid = None
        with contextlib.suppress(CommandError, GuestError):
            self._run(["/sbin/sysctl", "-q", "-w", "kernel.bpf_stats_enabled=0"])


__all__ = ["GuestTracer", "HostTracer", "TracerError", "describe"]
