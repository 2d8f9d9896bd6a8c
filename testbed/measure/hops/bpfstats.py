"""BPF's own run-time statistics: how long the tracer's programs ran, and how often.

The kernel counts them only while someone asks it to. ``BPF_ENABLE_STATS`` hands out a file
descriptor that keeps the counting on while it is open and switches it back off when the
last one closes, so nothing global is left changed (the ``kernel.bpf_stats_enabled`` sysctl
would be). Each program's ``run_time_ns`` and ``run_cnt`` are read from the tracer process's
file descriptor info (/proc/PID/fdinfo), so no bpftool is needed.
"""
from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import os
import platform
from collections.abc import Iterator
from dataclasses import dataclass

#: bpf(2) command and stats type (include/uapi/linux/bpf.h)
BPF_ENABLE_STATS = 32
BPF_STATS_RUN_TIME = 0
_SYS_BPF = {"x86_64": 321, "aarch64": 280}


@contextlib.contextmanager
def enabled() -> Iterator[str | None]:
    """Run-time statistics on for the block; yields None, or why they are not there."""
    nr = _SYS_BPF.get(platform.machine())
    if nr is None:
        yield f"no bpf(2) number known for {platform.machine()}"
        return
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    attr = (ctypes.c_uint32 * 2)(BPF_STATS_RUN_TIME, 0)
    fd = libc.syscall(nr, BPF_ENABLE_STATS, ctypes.byref(attr), ctypes.sizeof(attr))
    if fd < 0:
        yield f"BPF_ENABLE_STATS refused: {os.strerror(ctypes.get_errno())}"
        return
    try:
        yield None
    finally:
        os.close(fd)


@dataclass(frozen=True)
class RunStats:
    programs: int
    run_time_ns: int
    run_cnt: int
    #: per program, in the order the tracer loaded them: (probe, run_time_ns, run_cnt)
    per_probe: tuple[tuple[str, int, int], ...] = ()

    @property
    def ns_per_run(self) -> float | None:
        return self.run_time_ns / self.run_cnt if self.run_cnt else None


def parse_fdinfo(texts: list[str]) -> RunStats:
    """Pure: the BPF programs among fdinfo texts (those with a prog_type), added up."""
    n = t = c = 0
    for text in texts:
        kv = dict(line.split(":", 1) for line in text.splitlines() if ":" in line)
        if "prog_type" not in kv:
            continue
        n += 1
        t += int(kv.get("run_time_ns", "0").strip() or 0)
        c += int(kv.get("run_cnt", "0").strip() or 0)
    return RunStats(n, t, c)


def of_process(pid: int) -> RunStats:
    """The BPF programs a process holds, as its fdinfo shows them now."""
    texts = []
    base = f"/proc/{pid}/fdinfo"
    with contextlib.suppress(OSError):
        for fd in os.listdir(base):
            with contextlib.suppress(OSError):
                with open(f"{base}/{fd}") as f:
                    texts.append(f.read())
    return parse_fdinfo(texts)
