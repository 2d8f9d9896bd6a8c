"""Guest placement on the host: what the host offers, applying pins to a running guest,
and what each QEMU thread's affinity really was.

Pins are rendered into the domain XML (``cputune``) for a guest booted cold, and applied
through libvirt's live calls (virDomainPinVcpuFlags, PinEmulator, PinIOThread) to every
guest once it is ready, so a guest restored from a snapshot (whose saved XML carries the
pins it was saved with, or none) ends up with this run's pins. The vhost worker is not a
libvirt object: it is found among the threads (``vhost-<qemu pid>``, a kernel thread before
Linux 6.4, a QEMU thread since) and pinned with sched_setaffinity; with the userspace
virtio-net backend the NIC is served by QEMU's main-loop thread, which gets the pin.

Nothing is assumed: per sample the affinity of every QEMU thread is read from
/proc/<pid>/task/<tid>/status (Cpus_allowed_list), libvirt's view from virDomainGetVcpus
and virDomainGetVcpuPinInfo, and the CPU each thread ran on most from field 39 of
/proc/<pid>/task/<tid>/stat sampled through the window (testbed.measure.window).
"""
from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from testbed.topology.model import CpuSet, Placement, cpulist, parse_cpulist

NODE_DIR = Path("/sys/devices/system/node")
HUGEPAGE_DIR = Path("/sys/kernel/mm/hugepages")


# --------------------------------------------------------------------------- host facts

def host_cpus() -> CpuSet:
    """The CPUs this process (and the libvirt beside it) may use: sched_getaffinity, which
    a container or cgroup may have narrowed below the online set."""
    return tuple(sorted(os.sched_getaffinity(0)))


def numa_nodes(root: Path = NODE_DIR) -> dict[int, CpuSet]:
    """Node -> its CPUs, from /sys/devices/system/node/node<N>/cpulist. A kernel without
    NUMA support has no such folder: one node 0 holding every CPU is what it behaves as."""
    out: dict[int, CpuSet] = {}
    try:
        entries = sorted(root.iterdir())
    except OSError:
        entries = []
    for d in entries:
        if d.name.startswith("node") and d.name[4:].isdigit():
            try:
                out[int(d.name[4:])] = parse_cpulist((d / "cpulist").read_text())
            except (OSError, ValueError):
                out[int(d.name[4:])] = ()
    return out or {0: host_cpus()}


def node_distances(root: Path = NODE_DIR) -> dict[int, list[int]] | None:
    out: dict[int, list[int]] = {}
    for n in numa_nodes(root):
        try:
            out[n] = [int(x) for x in (root / f"node{n}" / "distance").read_text().split()]
        except (OSError, ValueError):
            return None
    return out


def hugepage_sizes(root: Path = HUGEPAGE_DIR) -> dict[int, int]:
    """Huge page size in KiB -> free pages of that size (the host's pools)."""
    out: dict[int, int] = {}
    try:
        entries = list(root.iterdir())
    except OSError:
        return out
    for d in entries:
        if d.name.startswith("hugepages-") and d.name.endswith("kB"):
            try:
                out[int(d.name[10:-2])] = int((d / "free_hugepages").read_text())
            except (OSError, ValueError):
                continue
    return out


def hugepages_shortfall(memory_mib: int, size_kib: int, free: Mapping[int, int]) -> str | None:
    """Pure: why a guest of ``memory_mib`` cannot be backed by pages of ``size_kib``, or None."""
    if size_kib not in free:
        return (f"this host has no {size_kib} kB huge page pool (it has: "
                f"{', '.join(f'{k} kB' for k in sorted(free)) or 'none'})")
    need = -(-memory_mib * 1024 // size_kib)
    if free[size_kib] < need:
        return (f"{free[size_kib]} free {size_kib} kB huge pages on this host, the guest needs {need} "
                f"({memory_mib} MiB); reserve them (vm.nr_hugepages / hugepages= on the kernel "
                f"command line) or drop memory.hugepages")
    return None


# --------------------------------------------------------------------------- threads

@dataclass(frozen=True)
class Thread:
    tid: int
    comm: str
    role: str                 # vcpu | emulator | iothread | vhost | main
    index: int | None         # vCPU or IO thread number
    allowed: CpuSet           # Cpus_allowed_list
    last_cpu: int | None      # stat field 39 when read


def role_of(comm: str, tid: int, pid: int) -> tuple[str, int | None]:
    """A QEMU thread's role from its name: 'CPU n/KVM' or 'CPU n/TCG' (one thread per vCPU;
    single-threaded TCG has one 'ALL CPUs/TCG'), 'IO iothreadN', 'vhost-<pid>'; the thread
    whose id is the process's is the main loop; the rest is the emulator (workers)."""
    if comm.startswith("CPU ") and "/" in comm:
        n = comm[4:].split("/", 1)[0]
        return "vcpu", int(n) if n.isdigit() else None
    if comm.startswith("ALL CPUs/"):
        return "vcpu", None
    if comm.startswith(("IO iothread", "iothread")):
        # libvirt's IO threads are iothread1, iothread2... ('IO mon_iothread' is QEMU's
        # monitor thread: the emulator's)
        digits = "".join(ch for ch in comm if ch.isdigit())
        return "iothread", int(digits) if digits else None
    if comm.startswith("vhost-"):
        return "vhost", None
    if tid == pid:
        return "main", None
    return "emulator", None


def parse_status_affinity(text: str) -> CpuSet:
    """Pure: Cpus_allowed_list from a /proc/<pid>/task/<tid>/status text."""
    for line in text.splitlines():
        if line.startswith("Cpus_allowed_list:"):
            return parse_cpulist(line.split(":", 1)[1])
    raise ValueError("no Cpus_allowed_list in status")


def parse_stat_cpu(text: str) -> int:
    """Pure: field 39 (processor: the CPU last run on) of a /proc/.../stat line. The comm
    field may hold spaces and parentheses, so fields are counted after its closing ')'."""
    rest = text.rsplit(")", 1)[1].split()
    return int(rest[36])     # fields 3.. follow ')'; field 39 is index 39 - 3


def _read(path: str) -> str:
    with open(path) as f:
        return f.read()


def vhost_kthreads(pid: int) -> list[int]:
    """Kernel threads named vhost-<pid> (vhost-net before Linux 6.4)."""
    want = f"vhost-{pid}"
    out = []
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                if _read(f"/proc/{d}/comm").strip() == want:
                    out.append(int(d))
            except OSError:
                continue
    return out


def threads(pid: int, proc: str = "/proc") -> list[Thread]:
    """Every thread of QEMU process ``pid`` (and its vhost kernel threads) with role, allowed
    CPUs and last CPU. ``proc``: where /proc is (tests read a recorded copy)."""
    out = []
    tasks = [(pid, t) for t in _tids(pid, proc)] + [(k, k) for k in (vhost_kthreads(pid) if proc == "/proc" else ())]
    for owner, tid in tasks:
        read = _task(f"{proc}/{owner}/task/{tid}")
        if read is None:
            continue
        comm, allowed, last = read
        role, idx = role_of(comm, tid, pid)
        if owner != pid:
            role = "vhost"
        out.append(Thread(tid, comm, role, idx, allowed, last))
    return out


def _task(base: str) -> tuple[str, CpuSet, int] | None:
    """A thread's name, allowed CPUs and last CPU from its /proc task folder ``base``; None
    when it is gone between listing and reading."""
    try:
        return (_read(f"{base}/comm").strip(), parse_status_affinity(_read(f"{base}/status")),
                parse_stat_cpu(_read(f"{base}/stat")))
    except (OSError, ValueError, IndexError):
        return None


def _tids(pid: int, proc: str = "/proc") -> list[int]:
    try:
        return sorted(int(t) for t in os.listdir(f"{proc}/{pid}/task"))
    except OSError:
        return []


def vhost_targets(pid: int) -> tuple[str, list[int]]:
    """The threads serving a guest's virtio-net datapath: vhost workers when there are any
    (kernel threads or, since Linux 6.4, QEMU threads named vhost-<pid>), else QEMU's main
    loop (the userspace backend). (what was found, thread ids)."""
    ts = threads(pid)
    vh = [t.tid for t in ts if t.role == "vhost"]
    if vh:
        return "vhost worker", vh
    return "qemu main loop (userspace virtio-net)", [pid]


# --------------------------------------------------------------------------- applying

def _cpumap(cpus: CpuSet, ncpus: int) -> tuple[bool, ...]:
    return tuple(c in cpus for c in range(ncpus))


def apply_live(dom, pid: int | None, p: Placement, all_cpus: CpuSet | None = None) -> dict:
    """Set a running domain's pins to ``p``: vCPUs, emulator and IO threads through
    libvirt's live calls; the vhost worker (or main loop) with sched_setaffinity. A role
    ``p`` leaves unpinned gets every host CPU, so pins a restored guest's saved XML carried
    do not linger. Returns what was applied, per role (for the run record)."""
    from testbed.lazy import libvirt
    allc = tuple(all_cpus or host_cpus())
    ncpus = max(allc) + 1
    live = libvirt.VIR_DOMAIN_AFFECT_LIVE
    n = dom.vcpusFlags(live) if hasattr(dom, "vcpusFlags") else len(dom.vcpus()[0])
    applied: dict = {}
    sets = p.vcpus or tuple(allc for _ in range(n))
    for i in range(n):
        dom.pinVcpuFlags(i, _cpumap(sets[i] if i < len(sets) else allc, ncpus), live)
    applied["vcpus"] = [cpulist(s) for s in sets[:n]]
    dom.pinEmulator(_cpumap(p.emulator or allc, ncpus), live)
    applied["emulator"] = cpulist(p.emulator or allc)
    if p.iothread_count:
        for info in dom.ioThreadInfo(0):
            dom.pinIOThread(info[0], _cpumap(p.iothreads or allc, ncpus), live)
        applied["iothreads"] = cpulist(p.iothreads or allc)
    if pid and p.vhost is not None:
        applied["vhost"] = pin_vhost(pid, p.vhost)
    return applied


def pin_vhost(pid: int, cpus: CpuSet) -> dict:
    """Pin the threads serving the guest's NICs (vhost_targets) to ``cpus``. Called again
    after each NIC is plugged: vhost workers start with their NIC."""
    what, tids = vhost_targets(pid)
    for tid in tids:
        os.sched_setaffinity(tid, set(cpus))
    return {"cpus": cpulist(cpus), "threads": tids, "found": what}


def single_threaded_vcpus(pid: int) -> str | None:
    """The name of the one thread running every vCPU (single-threaded TCG), or None."""
    return next((t.comm for t in threads(pid) if t.role == "vcpu" and t.index is None), None)


# --------------------------------------------------------------------------- verifying

def expected(p: Placement, pid: int, ts: list[Thread]) -> dict[int, tuple[str, CpuSet]]:
    """Pure: thread id -> (which field asked, the CPU set it must have), for the threads a
    pin applies to. The main loop carries the vhost pin under the userspace backend (no
    vhost worker), else the emulator's; workers QEMU starts later inherit the affinity of
    the thread that started them, so they may carry either."""
    out: dict[int, tuple[str, CpuSet]] = {}
    has_vhost = any(t.role == "vhost" for t in ts)
    for t in ts:
        if t.role == "vcpu" and p.vcpus is not None and t.index is not None and t.index < len(p.vcpus):
            out[t.tid] = (f"vcpus.pin[{t.index}]", p.vcpus[t.index])
        elif t.role == "iothread" and p.iothreads is not None:
            out[t.tid] = ("iothreads.pin", p.iothreads)
        elif t.role == "vhost" and p.vhost is not None:
            out[t.tid] = ("vhost.pin", p.vhost)
        elif t.role == "main" and p.vhost is not None and not has_vhost:
            out[t.tid] = ("vhost.pin", p.vhost)
        elif t.role == "main" and p.emulator is not None:
            out[t.tid] = ("emulator.pin", p.emulator)
    return out


def check(guest: str, p: Placement, ts: list[Thread], ran_most: Mapping[int, int],
          libvirt_pins: Mapping[int, CpuSet] | None) -> list[str]:
    """Pure: why a requested pin did not hold, one reason per thread, with both sets:
    what was asked and what the thread had (and libvirt's view of a vCPU). Empty: held."""
    bad = []
    want = expected(p, _pid_of(ts), ts)
    for t in ts:
        if t.tid in want:
            field, cpus = want[t.tid]
            if set(t.allowed) != set(cpus):
                lv = (libvirt_pins or {}).get(t.index) if t.role == "vcpu" and t.index is not None else None
                bad.append(f"{guest}: placement.{field} asked CPUs {cpulist(cpus)}, thread {t.tid} "
                           f"({t.comm}) was allowed {cpulist(t.allowed)}"
                           + (f" (libvirt says {cpulist(lv)})" if lv is not None else ""))
                continue
            ran = ran_most.get(t.tid)
            if ran is not None and ran not in cpus:
                bad.append(f"{guest}: placement.{field} asked CPUs {cpulist(cpus)}, thread {t.tid} "
                           f"({t.comm}) ran mostly on CPU {ran}")
        elif t.role == "emulator" and p.emulator is not None:
            allowed_any = set(p.emulator) | set(p.vhost or ())
            if not set(t.allowed) <= allowed_any:
                bad.append(f"{guest}: placement.emulator.pin asked CPUs {cpulist(p.emulator)}, thread "
                           f"{t.tid} ({t.comm}) was allowed {cpulist(t.allowed)}")
        if t.role == "vcpu" and t.index is not None and p.vcpus is not None and libvirt_pins:
            lv = libvirt_pins.get(t.index)
            if lv is not None and set(lv) != set(p.vcpus[t.index]) and t.tid in want \
                    and set(t.allowed) == set(want[t.tid][1]):
                bad.append(f"{guest}: placement.vcpus.pin[{t.index}] asked CPUs "
                           f"{cpulist(p.vcpus[t.index])}, libvirt reports {cpulist(lv)}")
    if p.vcpus is not None and not any(t.role == "vcpu" and t.index is not None for t in ts):
        single = [t for t in ts if t.role == "vcpu"]
        if single and len({s for s in p.vcpus}) > 1:
            bad.append(f"{guest}: placement.vcpus.pin gives vCPUs different CPUs, but QEMU runs them all "
                       f"in one thread ({single[0].comm}: single-threaded TCG)")
    return bad


def _pid_of(ts: list[Thread]) -> int:
    return next((t.tid for t in ts if t.role == "main"), -1)


def libvirt_vcpus(dom) -> tuple[dict[int, CpuSet], dict[int, int], str | None]:
    """libvirt's view of a domain's vCPUs: (pins from virDomainGetVcpuPinInfo, CPU each
    vCPU is on from virDomainGetVcpus, why not when the calls failed)."""
    try:
        pins = {i: tuple(c for c, on in enumerate(m) if on) for i, m in enumerate(dom.vcpuPinInfo(0))}
        info, _maps = dom.vcpus()
        return pins, {int(v[0]): int(v[3]) for v in info}, None
    except Exception as e:   # libvirt.libvirtError: the record says why, the check goes on without
        return {}, {}, f"libvirt vcpuinfo: {str(e).strip() or type(e).__name__}"


def record(ts: list[Thread], ran_most: Mapping[int, int]) -> list[dict]:
    """Pure: the per-thread entries of a sample's placement record."""
    return [{"tid": t.tid, "comm": t.comm, "role": t.role, "index": t.index,
             "allowed": cpulist(t.allowed), "ran_most_on": ran_most.get(t.tid),
             "last_cpu": t.last_cpu} for t in ts]


# --------------------------------------------------------------------------- namespace endpoints
# A namespace endpoint's tools are plain processes: which ones belong to it is read from
# /proc (the network namespace each process is in), so forked children (netserver's per-test
# ones) are seen as well as the processes the endpoint started.

def netns_inode(netns: str) -> int | None:
    """The inode of a named network namespace (/run/netns/NAME); None when it is gone."""
    try:
        return os.stat(f"/run/netns/{netns}").st_ino
    except OSError:
        return None


def processes_in(inodes: Mapping[int, str], proc: str = "/proc") -> dict[str, list[int]]:
    """Namespace label -> the pids whose network namespace is that inode (one scan of /proc)."""
    out: dict[str, list[int]] = {label: [] for label in inodes.values()}
    for name in os.listdir(proc):
        if not name.isdigit():
            continue
        try:
            ino = os.stat(f"{proc}/{name}/ns/net").st_ino
        except OSError:
            continue          # gone, or a kernel thread's
        if ino in inodes:
            out[inodes[ino]].append(int(name))
    return out


def tool_threads(pid: int, proc: str = "/proc") -> list[Thread]:
    """Every thread of a tool process, with its allowed CPUs and last CPU."""
    out = []
    for tid in _tids(pid, proc):
        read = _task(f"{proc}/{pid}/task/{tid}")
        if read is not None:
            comm, allowed, last = read
            out.append(Thread(tid, comm, "tool", None, allowed, last))
    return out


def check_endpoint(label: str, role: str, cpus: CpuSet, seen: Mapping[int, tuple[str, frozenset[CpuSet]]],
                   ran_most: Mapping[int, int]) -> list[str]:
    """Pure: why placement.endpoints.<role> did not hold for an endpoint, one reason per
    thread, naming what was asked and what the thread had; empty: held. ``seen``: tid ->
    (comm, every allowed set it was seen with over the window)."""
    bad = []
    for tid, (comm, allowed) in sorted(seen.items()):
        wrong = sorted(a for a in allowed if set(a) != set(cpus))
        if wrong:
            bad.append(f"{label}: placement.endpoints.{role} asked CPUs {cpulist(cpus)}, thread {tid} "
                       f"({comm}) was allowed {cpulist(wrong[0])}")
            continue
        ran = ran_most.get(tid)
        if ran is not None and ran not in cpus:
            bad.append(f"{label}: placement.endpoints.{role} asked CPUs {cpulist(cpus)}, thread {tid} "
                       f"({comm}) ran mostly on CPU {ran}")
    return bad
