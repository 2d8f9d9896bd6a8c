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
import re
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass

from testbed.errors import CommandError, GuestError
from testbed.host import proc
from testbed.measure.hops import bpfstats, parse
from testbed.measure.hops.program import DEVICES_ONLY, FLAVOURS, Flavour

log = logging.getLogger(__name__)

BPFTRACE = "bpftrace"
#: entries of bpftrace's maps (its default, 4096, is less than a busy second's packets in flight
#: between two points when a direction's end is lost)
ENV = {"BPFTRACE_MAP_KEYS_MAX": "65536"}
ATTACH_TIMEOUT_S = 90.0
GUEST_ATTACH_TIMEOUT_S = 600.0       # LLVM compiling under TCG
STOP_TIMEOUT_S = 30.0
VERSION_RE = re.compile(r"bpftrace v?(\d+(?:\.\d+)+)")

_DEVICES = ("tracepoint:net:net_dev_start_xmit { $s = (struct sk_buff *)args->skbaddr; @x = count(); }\n"
            "tracepoint:net:netif_receive_skb { $s = (struct sk_buff *)args->skbaddr; @r = count(); }\n")


def probe_program(f: Flavour) -> str:
    """A program that attaches to every probe flavour ``f`` uses, then exits."""
    ends = "" if f.send_probe is None else (f"{f.send_probe} {{ @a = count(); }}\n{f.recv_probe} {{ @b = count(); }}\n"
                                            f"{f.ready_probe} {{ @c = count(); }}\n")
    return _DEVICES + ends + "BEGIN { exit(); }\n"


def probe(run: Callable[[list[str]], tuple[int, str]]) -> tuple[Flavour | None, str]:
    """The best flavour a kernel attaches (found by trying: ``run(argv)`` gives rc and
    output there), and a line saying what was found."""
    rc, out = run([BPFTRACE, "--version"])
    m = VERSION_RE.search(out)
    if rc != 0 or not m:
        return None, "bpftrace not installed (Debian package bpftrace)"
    version = m.group(1)
    tried = []
    for f in FLAVOURS:
        rc, out = run([BPFTRACE, "-e", probe_program(f)])
        if rc == 0:
            why = f"; socket probes: {'; '.join(tried)}" if tried else ""
            what = "device tracepoints only, no socket probes" if f is DEVICES_ONLY else \
                f"device tracepoints and socket {f.name}"
            return f, f"bpftrace {version}: {what}{why}"
        tried.append(f"{f.name}: {_last_error(out)}")
    return None, f"bpftrace {version} attaches none of its probes here: {'; '.join(tried)}"


def _last_error(out: str) -> str:
    lines = [ln.strip() for ln in out.splitlines() if ln.strip() and "RLIMIT_MEMLOCK" not in ln]
    errs = [ln for ln in lines if "ERROR" in ln or "FATAL" in ln] or lines
    return (errs[-1] if errs else "no output")[:200]


def version(run: Callable[[list[str]], tuple[int, str]]) -> str | None:
    rc, out = run([BPFTRACE, "--version"])
    m = VERSION_RE.search(out)
    return m.group(1) if rc == 0 and m else None


def run_local(argv: list[str]) -> tuple[int, str]:
    try:
        res = proc.run(argv, check=False, timeout=60, env=ENV)
    except CommandError as e:
        return 127 if e.rc is None else e.rc, str(e)
    return res.rc, res.stdout + res.stderr


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
                                  f"{_last_error(self.bg.stdout() + self.bg.stderr())}")
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
            # the kernel counts BPF run time only when asked; the guest is the testbed's own
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
                    raise TracerError(f"bpftrace in {self.guest} exited before it attached: {_last_error(out)}")
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
            self.stats = bpfstats.parse_fdinfo(fdinfo.split("pos:")) if rc == 0 else None
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


__all__ = ["BPFTRACE", "GuestTracer", "HostTracer", "TracerError", "probe", "probe_program", "run_local", "version"]
