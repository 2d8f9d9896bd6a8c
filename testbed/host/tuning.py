"""The host settings that move figures, for run.json (``environment.tuning``): CPU frequency
governor and driver, turbo/boost, C-state limits, SMT, NUMA topology, IRQ affinity of the
NICs under test, the kernel command line, transparent huge pages and huge page pools.

Read from files only (sysfs, procfs), the same paths on this machine and on a remote host
(one shell round trip prints them), and parsed by one pure function, so both give the same
record. A setting whose file this host lacks (no cpufreq in a VM, no intel_pstate on AMD)
is None and named in ``unreadable``: never guessed.
"""
from __future__ import annotations

import glob
import re
from collections.abc import Iterable, Mapping

from testbed.topology.model import cpulist, parse_cpulist

#: files read; globs expand on the host that is read
PATTERNS = (
    "/sys/devices/system/cpu/cpu*/cpufreq/scaling_governor",
    "/sys/devices/system/cpu/cpu*/cpufreq/scaling_driver",
    "/sys/devices/system/cpu/cpufreq/boost",
    "/sys/devices/system/cpu/intel_pstate/no_turbo",
    "/sys/devices/system/cpu/intel_pstate/status",
    "/sys/devices/system/cpu/amd_pstate/status",
    "/sys/devices/system/cpu/cpuidle/current_driver",
    "/sys/devices/system/cpu/cpu0/cpuidle/state*/name",
    "/sys/devices/system/cpu/cpu0/cpuidle/state*/disable",
    "/sys/module/intel_idle/parameters/max_cstate",
    "/sys/module/processor/parameters/max_cstate",
    "/sys/devices/system/cpu/smt/control",
    "/sys/devices/system/cpu/smt/active",
    "/sys/devices/system/cpu/online",
    "/sys/devices/system/node/node*/cpulist",
    "/sys/devices/system/node/node*/distance",
    "/proc/cmdline",
    "/sys/kernel/mm/transparent_hugepage/enabled",
    "/sys/kernel/mm/transparent_hugepage/defrag",
    "/sys/kernel/mm/hugepages/hugepages-*/nr_hugepages",
    "/sys/kernel/mm/hugepages/hugepages-*/free_hugepages",
    "/proc/interrupts",
    "/proc/irq/*/smp_affinity_list",
    "/sys/class/net/*/device/msi_irqs/*",
    # a virtio NIC's device is the virtio device; its PCI function (with the IRQs) is above
    "/sys/class/net/*/device/../msi_irqs/*",
)
#: kernel command line parameters that decide where work may run
CMDLINE_KEYS = ("isolcpus", "nohz_full", "rcu_nocbs", "irqaffinity", "intel_idle.max_cstate",
                "processor.max_cstate", "idle", "intel_pstate", "amd_pstate", "nosmt", "mitigations",
                "transparent_hugepage", "hugepages", "hugepagesz", "default_hugepagesz", "iommu",
                "intel_iommu", "preempt")
_MARK = "==> "

#: one round trip on a remote host: every file, each after a '==> path' line
REMOTE_SCRIPT = ("for f in " + " ".join(PATTERNS) + "; do [ -r \"$f\" ] && { echo \"" + _MARK
                 + "$f\"; cat \"$f\" 2>/dev/null; }; done; true")


def read_local(patterns: Iterable[str] = PATTERNS) -> dict[str, str]:
    out: dict[str, str] = {}
    for pat in patterns:
        for path in sorted(glob.glob(pat)):
            try:
                with open(path, errors="replace") as f:
                    out[path] = f.read(1 << 20)
            except OSError:
                continue
    return out


def parse_dump(text: str) -> dict[str, str]:
    """Pure: REMOTE_SCRIPT's output -> path -> content."""
    out: dict[str, str] = {}
    path, buf = None, []
    for line in text.splitlines(keepends=True):
        if line.startswith(_MARK):
            if path is not None:
                out[path] = "".join(buf)
            path, buf = line[len(_MARK):].strip(), []
        elif path is not None:
            buf.append(line)
    if path is not None:
        out[path] = "".join(buf)
    return out


def _one(files: Mapping[str, str], path: str) -> str | None:
    v = files.get(path)
    return None if v is None else v.strip()


def _per_cpu(files: Mapping[str, str], leaf: str) -> dict[str, list[int]] | None:
    """value -> CPUs that have it (so a mixed setting shows, not only cpu0's)."""
    found: dict[str, list[int]] = {}
    for path, v in files.items():
        mt = re.fullmatch(r"/sys/devices/system/cpu/cpu(\d+)/cpufreq/" + leaf, path)
        if mt:
            found.setdefault(v.strip(), []).append(int(mt.group(1)))
    return {k: sorted(v) for k, v in sorted(found.items())} or None


def _bracketed(text: str | None) -> str | None:
    """'always [madvise] never' -> 'madvise'."""
    if text is None:
        return None
    mt = re.search(r"\[([^\]]+)\]", text)
    return mt.group(1) if mt else text


def _cmdline_params(cmdline: str | None) -> dict[str, str] | None:
    if cmdline is None:
        return None
    out = {}
    for tok in cmdline.split():
        if tok == "--":
            break        # the rest goes to init
        key, eq, val = tok.partition("=")
        if key in CMDLINE_KEYS:
            out[key] = val if eq else ""
    return out


def _numa(files: Mapping[str, str]) -> dict | None:
    nodes: dict[str, dict] = {}
    for path, v in files.items():
        mt = re.fullmatch(r"/sys/devices/system/node/node(\d+)/(cpulist|distance)", path)
        if mt:
            n = nodes.setdefault(mt.group(1), {})
            if mt.group(2) == "cpulist":
                n["cpus"] = v.strip()
            else:
                n["distances"] = [int(x) for x in v.split() if x.isdigit()]
    return {k: nodes[k] for k in sorted(nodes, key=int)} or None


def nic_irqs(files: Mapping[str, str], nics: Iterable[str]) -> dict[str, object]:
    """Per NIC: its IRQs with each one's CPUs (smp_affinity_list). A PCI NIC's IRQs are
    listed in /sys/class/net/<nic>/device/msi_irqs (virtio and most drivers name them after
    the device, not the interface: virtio2-input.0); others are found in /proc/interrupts by
    a name that starts with the interface's (eth0-TxRx-0). A NIC with neither (a veth, tap,
    bridge port) says so."""
    interrupts = files.get("/proc/interrupts")
    names: dict[str, str] = {}
    for line in (interrupts or "").splitlines()[1:]:
        parts = line.split()
        if parts and parts[0].rstrip(":").isdigit():
            names[parts[0].rstrip(":")] = parts[-1]
    out: dict[str, object] = {}
    for nic in nics:
        msi = {p.rsplit("/", 1)[1] for p in files
               if p.startswith((f"/sys/class/net/{nic}/device/msi_irqs/", f"/sys/class/net/{nic}/device/../msi_irqs/"))}
        if interrupts is None and not msi:
            out[nic] = None
            continue
        found = msi | {irq for irq, name in names.items()
                       if name == nic or name.startswith((f"{nic}-", f"{nic}@"))}
        irqs = {}
        for irq in sorted(found, key=int):
            aff = files.get(f"/proc/irq/{irq}/smp_affinity_list")
            irqs[f"{irq} {names.get(irq, '?')}"] = aff.strip() if aff is not None else None
        out[nic] = irqs or "no IRQs (a virtual device)"
    return out


def parse(files: Mapping[str, str], nics: Iterable[str] = ()) -> dict:
    """Pure: the tuning record from the files read (path -> content)."""
    cmdline = _one(files, "/proc/cmdline")
    no_turbo = _one(files, "/sys/devices/system/cpu/intel_pstate/no_turbo")
    boost = _one(files, "/sys/devices/system/cpu/cpufreq/boost")
    states = {}
    for path, v in files.items():
        mt = re.fullmatch(r"/sys/devices/system/cpu/cpu0/cpuidle/(state\d+)/name", path)
        if mt:
            dis = files.get(f"/sys/devices/system/cpu/cpu0/cpuidle/{mt.group(1)}/disable")
            states[v.strip()] = None if dis is None else dis.strip() == "0"
    online = _one(files, "/sys/devices/system/cpu/online")
    rec = {
        "cpufreq_governor": _per_cpu(files, "scaling_governor"),
        "cpufreq_driver": _per_cpu(files, "scaling_driver"),
        "pstate_status": _one(files, "/sys/devices/system/cpu/intel_pstate/status")
        or _one(files, "/sys/devices/system/cpu/amd_pstate/status"),
        # turbo on: intel_pstate's no_turbo 0, or cpufreq's boost 1
        "turbo": (no_turbo == "0") if no_turbo is not None else ((boost == "1") if boost is not None else None),
        "cpuidle_driver": _one(files, "/sys/devices/system/cpu/cpuidle/current_driver"),
        "cstates_enabled_cpu0": states or None,
        "max_cstate": {k: v for k, v in (
            ("intel_idle", _one(files, "/sys/module/intel_idle/parameters/max_cstate")),
            ("processor", _one(files, "/sys/module/processor/parameters/max_cstate"))) if v is not None} or None,
        "smt": _one(files, "/sys/devices/system/cpu/smt/control"),
        "smt_active": None if _one(files, "/sys/devices/system/cpu/smt/active") is None
        else _one(files, "/sys/devices/system/cpu/smt/active") == "1",
        "cpus_online": cpulist(parse_cpulist(online)) if online else None,
        "numa": _numa(files),
        "kernel_cmdline": cmdline,
        "kernel_cmdline_params": _cmdline_params(cmdline),
        "thp": _bracketed(_one(files, "/sys/kernel/mm/transparent_hugepage/enabled")),
        "thp_defrag": _bracketed(_one(files, "/sys/kernel/mm/transparent_hugepage/defrag")),
        "hugepages": {re.search(r"hugepages-(\d+kB)", p).group(1): {"total": int(v), "free": int(  # type: ignore[union-attr]
            files.get(p.replace("nr_hugepages", "free_hugepages"), "0").strip() or 0)}
            for p, v in files.items() if p.endswith("/nr_hugepages") and v.strip().isdigit()} or None,
        "irq_affinity": nic_irqs(files, nics) if nics else {},
    }
    rec["unreadable"] = sorted(k for k, v in rec.items() if v is None)
    return rec


def nics_under_test(t) -> list[str]:  # noqa: ANN001 - a model.Topology
    """The topology's real NICs: underlays and macvtap lower devices (the testbed's own taps,
    veths and bridges are virtual: no IRQs)."""
    names = [t.tunnel.underlay, *(h.underlay for h in t.hosts), *t.macvtap.lower]
    return sorted({n for n in names if n})


def local(nics: Iterable[str] = ()) -> dict:
    return parse(read_local(), nics)


def remote(shell, nics: Iterable[str] = ()) -> dict:  # noqa: ANN001 - a remote.Shell
    return parse(parse_dump(shell.run(["sh", "-c", REMOTE_SCRIPT], timeout=60).stdout), nics)


#: the record's keys a reader compares between runs (``unreadable`` and the full command
#: line's text are covered by their parts)
COMPARED = ("cpufreq_governor", "cpufreq_driver", "pstate_status", "turbo", "cpuidle_driver",
            "cstates_enabled_cpu0", "max_cstate", "smt", "smt_active", "cpus_online", "numa",
            "kernel_cmdline", "thp", "thp_defrag", "hugepages", "irq_affinity")
