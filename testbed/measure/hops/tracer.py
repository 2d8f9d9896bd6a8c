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
import time
from dataclasses import dataclass

from testbed.errors import CommandError, GuestError
from testbed.host import proc
from testbed.host.bpftrace import BPFTRACE, ENV, last_error
from testbed.measure.hops import bpfstats, parse

log = logging.getLogger(__name__)

ATTACH_TIMEOUT_S = 90.0
GUEST_ATTACH_TIMEOUT_S = 600.0       # LLVM compiling under TCG
#: bpftrace prints its maps after SIGINT; on a host saturated by other work that took more
#: than 30 s once (a CI machine running two tracers and guests beside each other). One
#: SIGINT only: bpftrace 0.17 given a second one while it reads its maps (0.1 s after the
#: first, 40 000 keys) exits without printing any, where waiting gets them all
STOP_TIMEOUT_S = 90.0


class TracerError(Exception):
    """A tracer that could not start or stop; the sample's hops say why."""


@dataclass
class HostTracer:
    """bpftrace on this host, for one sample."""

    program: str
    out_dir: str
    name: str = "tb-hops-host"
    bg: proc.Background | None = None
    attach_s: float | None = None
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

    def stop(self) -> str:
        """Its output, once it printed its maps and exited."""
        bg = self.bg
        if bg is None:
            raise TracerError("bpftrace was not started")
        self.stats = bpfstats.of_process(bg.popen.pid)
        with contextlib.suppress(ProcessLookupError):
            os.kill(bg.popen.pid, signal.SIGINT)
        try:
            bg.popen.wait(timeout=STOP_TIMEOUT_S)
        except Exception:
            bg.stop()
            raise TracerError(f"bpftrace did not exit within {STOP_TIMEOUT_S:.0f} s of SIGINT") from None
        finally:
            self.bg = None
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
                if time.monotonic() - t0 > STOP_TIMEOUT_S * 4:
                    raise TracerError(f"bpftrace in {self.guest} did not exit after SIGINT")
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


__all__ = ["GuestTracer", "HostTracer", "TracerError"]
