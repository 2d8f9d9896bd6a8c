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
from dataclasses import dataclass, field

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
    """vCPU threads are named 'CPU n/KVM' or 'CPU n/TCG'; IO threads 'IO ...'; vhost
    workers 'vhost-<pid>' (inside QEMU's thread group since Linux 6.4); the rest is the
    emulator (main loop, workers)."""
    if comm.startswith("CPU ") and "/" in comm:
        return "vcpu"
    if comm.startswith("IO ") or comm.startswith("iothread"):
        return "iothread"
    if comm.startswith("vhost-"):
        return "vhost"
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


def _procs_named(prefixes: Iterable[str]) -> tuple[dict[str, list[int]], dict[int, tuple[float, int]]]:
    """The pids whose names start with each prefix, and every process's CPU seconds with
    those of its reaped children (utime + stime + cutime + cstime, in ticks: one read of
    /proc/<pid>/stat each) and its parent, for the host's rest (:func:`others_delta`)."""
    found: dict[str, list[int]] = {}
    times: dict[int, tuple[float, int]] = {}
    for p in psutil.process_iter(["name", "pid", "ppid", "cpu_times"]):
        name = p.info["name"] or ""
        for pre in prefixes:
            if name.startswith(pre):
                found.setdefault(pre, []).append(p.info["pid"])
        t = p.info["cpu_times"]
        if t is not None:
            times[p.info["pid"]] = (t.user + t.system + t.children_user + t.children_system, p.info["ppid"])
    return found, times


#: kthreadd: the kernel threads it starts are released when they exit, never waited for,
#: so their time is added to no parent's
KTHREADD = 2


def others_delta(before: Mapping[int, tuple[float, int]], after: Mapping[int, tuple[float, int]]) -> float:
    """Pure: CPU seconds the host's other processes (everything but the guests' QEMUs and
    vhost workers, the switch and ksoftirqd: libvirtd, the testbed itself, kernel workers,
    whatever else runs) used between two readings, measured rather than left over, so that
    the roles of a sample's cost can be held against the host's busy time
    (testbed.analysis.sample_cost). Readings are pid -> (CPU seconds with reaped children's, ppid).

    A difference of sums, not of the processes seen twice: a process that started in
    between counts whole; one that ended in between left its whole life in the
    reaped-children time of whoever waited for it (its parent, or the reaper it was handed
    to when its parent ended first), so its time before the first reading is taken off
    again. Kernel threads are waited for by nobody: the part of a kernel thread's time
    after the first reading is lost when it ends in between (the gap holds it)."""
    total = sum(v for v, _ in after.values())
    total -= sum(v for pid, (v, ppid) in before.items() if pid in after or ppid != KTHREADD)
    return round(total, 4)


def process_seconds(pid: int) -> float:
    """CPU seconds of all of a process's threads (ovs-vswitchd's handlers, revalidators, pmds)."""
    total = 0.0
    for tid in _tids(pid):
        try:
            total += _task_seconds(pid, tid)
        except OSError:
            continue
    return total


@dataclass(frozen=True)
class GuestReading:
    """A guest's /proc/stat and the guest's own clock (/proc/uptime) from the same read."""

    uptime: float
    stat: Mapping[str, Mapping[str, int]]


def parse_guest_reading(text: str) -> GuestReading:
    """Pure: the output of `cat /proc/uptime /proc/stat` -> GuestReading."""
    first = text.split("\n", 1)[0].split()
    return GuestReading(float(first[0]), parse_proc_stat(text))


def guest_reading(agent) -> GuestReading:
    """One agent command prints both files, so the stat and the clock it is divided by are
    taken together, inside the guest: agent round trips (tens of ms under TCG) fall outside."""
    return parse_guest_reading(agent.run(["/usr/bin/cat", "/proc/uptime", "/proc/stat"], timeout=30).stdout)


def guest_delta(before: GuestReading, after: GuestReading) -> tuple[dict[str, dict[str, float]], float]:
    """(cores used per CPU line, interval in seconds), the interval the guest's own clock."""
    secs = after.uptime - before.uptime
    return stat_delta(before.stat, after.stat, secs), secs


@dataclass(frozen=True)
class HostReading:
    at: float                                      # monotonic clock when /proc/stat was read
    per_guest: Mapping[str, Mapping[str, float]]   # guest -> {vcpu, emulator, iothread, vhost}
    named: Mapping[str, float]                     # ovs-vswitchd, ksoftirqd
    host: Mapping[str, Mapping[str, int]]          # /proc/stat
    #: guest -> how its vhost workers were found: "thread" (in QEMU's thread group, Linux
    #: >= 6.4), "kthread" (kernel threads vhost-<qemu pid>, before 6.4), or "none"
    vhost_model: Mapping[str, str] = field(default_factory=dict)
    #: guest -> CPU seconds libvirt reports for the domain (virDomainGetCPUStats total),
    #: or the reason it could not
    libvirt: Mapping[str, float | str] = field(default_factory=dict)
    #: pid -> (CPU seconds with its reaped children's, ppid) of every other process: the
    #: host's rest
    others: Mapping[int, tuple[float, int]] = field(default_factory=dict)


def host_reading(qemu_pids: Mapping[str, int], domains: Mapping[str, object] | None = None) -> HostReading:
    per_guest: dict[str, dict[str, float]] = {}
    models: dict[str, str] = {}
    named_pids, proc_times = _procs_named(("vhost-", "ovs-vswitchd", "ksoftirqd"))
    known = {*qemu_pids.values(), *(v for k in ("ovs-vswitchd", "ksoftirqd") for v in named_pids.get(k, []))}
    for guest, pid in qemu_pids.items():
        t = _thread_times(pid)
        in_group = "vhost" in t
        # Before 6.4 the vhost-net workers are kernel threads named vhost-<qemu pid>.
        kthreads = [v for v in named_pids.get("vhost-", []) if v != pid and _comm(v) == f"vhost-{pid}"]
        known.update(kthreads)
        t["vhost"] = t.get("vhost", 0.0) + sum(process_seconds(v) for v in kthreads)
        models[guest] = "+".join(m for m, found in (("thread", in_group), ("kthread", bool(kthreads)))
                                 if found) or "none"
        per_guest[guest] = t
    named = {"ovs-vswitchd": sum(process_seconds(p) for p in named_pids.get("ovs-vswitchd", [])),
             "ksoftirqd": sum(process_seconds(p) for p in named_pids.get("ksoftirqd", []))}
    virt = {g: domain_cpu_seconds(d) for g, d in (domains or {}).items() if g in qemu_pids}
    with open("/proc/stat") as f:
        at = time.monotonic()
        host = parse_proc_stat(f.read())
    rest = {p: v for p, v in proc_times.items() if p not in known}
    return HostReading(at, per_guest, named, host, models, virt, rest)


def domain_cpu_seconds(dom) -> float | str:
    """libvirt's CPU time of the whole domain (its cgroup: every QEMU thread and the vhost
    workers attached to it), or why it is not available."""
    try:
        stats = dom.getCPUStats(True)
        return stats[0]["cpu_time"] / 1e9
    except Exception as e:   # libvirt.libvirtError, or no cgroup accounting on this host
        return f"libvirt getCPUStats: {str(e).strip() or type(e).__name__}"


def _comm(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/comm") as f:
            return f.read().strip()
    except OSError:
        return ""


#: Largest relative gap between the attributed QEMU total and libvirt's domain figure that
#: counts as agreement; beyond it the sample carries a warning with both figures.
LIBVIRT_AGREEMENT = 0.02
#: attributed <= busy * (1 + this) + one tick per CPU over the window, or the sample fails
INVARIANT_SLACK = 0.01


def host_delta(before: HostReading, after: HostReading) -> dict:
    secs = after.at - before.at
    guests = {g: {k: round((after.per_guest[g].get(k, 0.0) - before.per_guest[g].get(k, 0.0)) / secs, 4)
                  for k in set(before.per_guest[g]) | set(after.per_guest[g])}
              for g in before.per_guest if g in after.per_guest}
    for g, d in guests.items():
        d["total"] = round(sum(d.values()), 4)
    named = {k: round((after.named[k] - v) / secs, 4) for k, v in before.named.items()}
    whole = stat_delta(before.host, after.host, secs)
    host = whole.get("cpu", {})
    attributed = round(sum(d["total"] for d in guests.values()) + sum(named.values()), 4)
    busy = host.get("busy", 0.0)
    ncpus = len(whole) - 1 if len(whole) > 1 else 1
    limit = busy * (1 + INVARIANT_SLACK) + ncpus / USER_HZ / secs
    libvirt_check = {}
    for g, v in after.libvirt.items():
        b = before.libvirt.get(g)
        if isinstance(v, str) or isinstance(b, str) or b is None or g not in guests:
            libvirt_check[g] = {"status": "unavailable", "reason": v if isinstance(v, str) else b}
            continue
        lv = (v - b) / secs
        ours = guests[g]["total"]
        gap = abs(ours - lv) / lv if lv > 0 else (0.0 if ours == 0 else float("inf"))
        libvirt_check[g] = {"attributed_cores": ours, "libvirt_cores": round(lv, 4),
                            "gap": round(gap, 4) if gap != float("inf") else None,
                            "status": "agree" if gap <= LIBVIRT_AGREEMENT else "disagree"}
    return {"window_s": round(secs, 3), "per_guest": guests, "named": named,
            "others": {"cores": round(others_delta(before.others, after.others) / secs, 4),
                       "processes": len(after.others)} if after.others else {},
            "host": host, "host_per_cpu": {k: v for k, v in whole.items() if k != "cpu"},
            "attributed": attributed, "unattributed": round(busy - attributed, 4),
            "irq": host.get("irq"), "softirq": host.get("softirq"),
            "invariant": {"attributed": attributed, "busy": busy, "limit": round(limit, 4),
                          "holds": attributed <= limit},
            "vhost_model": dict(after.vhost_model), "libvirt": libvirt_check}


def kernel() -> dict:
    """The kernel release, and whether it accounts irq time separately
    (CONFIG_IRQ_TIME_ACCOUNTING), with where that was read."""
    release = os.uname().release
    return {"release": release, **irq_time_accounting(release)}


def irq_time_accounting(release: str) -> dict:
    """Read from /proc/config.gz, else /boot/config-<release>; else unknown, said so (the
    /proc/stat behaviour cannot tell it apart from an idle irq column)."""
    import gzip
    for path, opener in (("/proc/config.gz", gzip.open), (f"/boot/config-{release}", open)):
        try:
            with opener(path, "rt") as f:
                text = f.read()
        except OSError:
            continue
        return {"irq_time_accounting": parse_config_flag(text, "CONFIG_IRQ_TIME_ACCOUNTING"),
                "irq_time_accounting_source": path}
    return {"irq_time_accounting": None,
            "irq_time_accounting_source": "unknown: no /proc/config.gz or /boot/config-" + release}


def parse_config_flag(text: str, name: str) -> bool:
    """Pure: whether a kernel config sets `name`=y."""
    return any(line.strip() == f"{name}=y" for line in text.splitlines())


def collector_cost(qemu_pids: Mapping[str, int], rounds: int = 20) -> float:
    """CPU seconds one host reading costs this process, averaged: the collector's overhead."""
    me = psutil.Process()
    t0 = sum(me.cpu_times()[:2])
    for _ in range(rounds):
        host_reading(qemu_pids)
    return (sum(me.cpu_times()[:2]) - t0) / rounds
