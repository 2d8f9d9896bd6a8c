"""CPU accounting over exactly a measurement window, guest and host.

Each collector takes a reading before and after the window; the difference divided by
the window length is "cores used". Readings are cheap reads of /proc (host) and of
/proc/stat through the guest agent (guest), so the collectors cost far less than 1% of a
core; `collector_cost()` measures it.
"""
from __future__ import annotations

import os
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import psutil

USER_HZ = os.sysconf("SC_CLK_TCK")
STAT_FIELDS = ("user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal")


def parse_proc_stat(text: str) -> dict[str, dict[str, int]]:
    """Pure: /proc/stat -> {"cpu": {...}, "cpu0": {...}} in ticks."""
    out: dict[str, dict[str, int]] = {}
    for line in text.splitlines():
        if not line.startswith("cpu"):
            continue
        parts = line.split()
        out[parts[0]] = {k: int(v) for k, v in zip(STAT_FIELDS, parts[1:9])}
    return out


def stat_delta(before: Mapping[str, Mapping[str, int]], after: Mapping[str, Mapping[str, int]],
               seconds: float) -> dict[str, dict[str, float]]:
    """Pure: cores used per category, per CPU line, over `seconds`."""
    res: dict[str, dict[str, float]] = {}
    ncpus = sum(1 for c in before if c != "cpu") or 1
    for cpu, b in before.items():
        a = after.get(cpu)
        if a is None or seconds <= 0:
            continue
        d = {k: (a[k] - b[k]) / USER_HZ / seconds for k in STAT_FIELDS}
        # Busy is what was not idle. On tickless kernels idle (and iowait) come from exact
        # sleep times while user/system/softirq are sampled at each tick, so this is the
        # exact total, comparable with per-thread run times (schedstat); the categories
        # keep their tick resolution.
        n = ncpus if cpu == "cpu" else 1
        d["busy"] = max(0.0, n - d["idle"] - d["iowait"])
        res[cpu] = {k: round(v, 4) for k, v in d.items()}
    return res


def classify_qemu_thread(comm: str) -> str:
    """vCPU threads are named 'CPU n/KVM' or 'CPU n/TCG'; IO threads 'IO ...'; the rest is
    the emulator (main loop, workers)."""
    if comm.startswith("CPU ") and "/" in comm:
        return "vcpu"
    if comm.startswith("IO ") or comm.startswith("iothread"):
        return "iothread"
    return "emulator"


def _task_seconds(pid: int, tid: str) -> float:
    """CPU seconds one thread has run. schedstat's first field is the scheduler's exact run
    time in ns; utime+stime in stat are in ticks (10 ms), which over a few-second window and
    a dozen threads adds up to more error than the effects being measured."""
    try:
        with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
            return int(f.read().split()[0]) / 1e9
    except FileNotFoundError:
        pass  # kernel without schedstat/sched_info: fall back to ticks
    with open(f"/proc/{pid}/task/{tid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / USER_HZ   # utime + stime


def _tids(pid: int) -> list[str]:
    try:
        return os.listdir(f"/proc/{pid}/task")
    except OSError:
        return []


def _thread_times(pid: int) -> dict[str, float]:
    """Per-class CPU seconds of one process's threads (vcpu, emulator, iothread)."""
    out: dict[str, float] = {}
    for tid in _tids(pid):
        try:
            with open(f"/proc/{pid}/task/{tid}/comm") as f:
                comm = f.read().strip()
            secs = _task_seconds(pid, tid)
        except OSError:
            continue  # thread exited between listdir and read
        key = classify_qemu_thread(comm)
        out[key] = out.get(key, 0.0) + secs
    return out


def _procs_named(prefixes: Iterable[str]) -> dict[str, list[int]]:
    found: dict[str, list[int]] = {}
    for p in psutil.process_iter(["name", "pid"]):
        name = p.info["name"] or ""
        for pre in prefixes:
            if name.startswith(pre):
                found.setdefault(pre, []).append(p.info["pid"])
    return found


def _proc_seconds(pid: int) -> float:
    """CPU seconds of all of a process's threads (ovs-vswitchd's handlers, revalidators, pmds)."""
    total = 0.0
    for tid in _tids(pid):
        try:
            total += _task_seconds(pid, tid)
        except OSError:
            continue
    return total


@dataclass(frozen=True)
class HostReading:
    at: float
    per_guest: Mapping[str, Mapping[str, float]]   # guest -> {vcpu, emulator, iothread, vhost}
    named: Mapping[str, float]                     # ovs-vswitchd, ksoftirqd
    host: Mapping[str, Mapping[str, int]]          # /proc/stat


def host_reading(qemu_pids: Mapping[str, int]) -> HostReading:
    per_guest: dict[str, dict[str, float]] = {}
    named_pids = _procs_named(("vhost-", "ovs-vswitchd", "ksoftirqd"))
    for guest, pid in qemu_pids.items():
        t = _thread_times(pid)
        # vhost-net workers are kernel threads named vhost-<qemu pid>
        t["vhost"] = sum(_proc_seconds(v) for v in named_pids.get("vhost-", [])
                         if _comm(v) == f"vhost-{pid}")
        per_guest[guest] = t
    named = {"ovs-vswitchd": sum(_proc_seconds(p) for p in named_pids.get("ovs-vswitchd", [])),
             "ksoftirqd": sum(_proc_seconds(p) for p in named_pids.get("ksoftirqd", []))}
    with open("/proc/stat") as f:
        host = parse_proc_stat(f.read())
    return HostReading(time.monotonic(), per_guest, named, host)


def _comm(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/comm") as f:
            return f.read().strip()
    except OSError:
        return ""


def host_delta(before: HostReading, after: HostReading) -> dict:
    secs = after.at - before.at
    guests = {g: {k: round((after.per_guest[g].get(k, 0.0) - v) / secs, 4)
                  for k, v in before.per_guest[g].items()}
              for g in before.per_guest if g in after.per_guest}
    for g, d in guests.items():
        d["total"] = round(sum(d.values()), 4)
    named = {k: round((after.named[k] - v) / secs, 4) for k, v in before.named.items()}
    whole = stat_delta(before.host, after.host, secs)
    return {"window_s": round(secs, 3), "per_guest": guests, "named": named,
            "host": whole.get("cpu", {}), "host_per_cpu": {k: v for k, v in whole.items() if k != "cpu"}}


def collector_cost(qemu_pids: Mapping[str, int], rounds: int = 20) -> float:
    """CPU seconds one host reading costs this process, averaged: the collector's overhead."""
    me = psutil.Process()
    t0 = sum(me.cpu_times()[:2])
    for _ in range(rounds):
        host_reading(qemu_pids)
    return (sum(me.cpu_times()[:2]) - t0) / rounds
