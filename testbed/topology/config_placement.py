"""The topology's placement and noise fields, read and checked against this host.

Per guest (``guests[].placement``)::

    placement:
      vcpus: {pin: "2-3"}            # one set for every vCPU, or per vCPU: [[2], [3]]
      emulator: {pin: [1]}
      iothreads: {pin: [1]}          # one IO thread, used by the guest's disks
      vhost: {pin: [1]}              # the vhost worker, or QEMU's main loop (userspace backend)
      numa: {node: 0}                # memory bound strictly to the node (numatune)
      memory: {hugepages: 2M}
      cpu: {mode: host-passthrough}  # host-passthrough | host-model (KVM only) | maximum

Host-wide: ``placement: {harness: [0], allow_overlap: false, endpoints: {client: [0], server:
[1]}, switch: [1]}`` (endpoints: the namespace endpoints' tools; switch: ovs-vswitchd) and ``noise: {...}``
(testbed.topology.model.NoiseSpec). A CPU or NUMA node a local host does not have, an overlap the
topology did not allow, a CPU mode the chosen accelerator cannot give: ConfigError naming
the field (exit 2). Nodes are read from /sys/devices/system/node, CPUs from
sched_getaffinity: the set this process, and the libvirt beside it, may use.

Imported by testbed.topology.config; reads the same typed nodes (testbed.topology.yamlnode).
"""
from __future__ import annotations

import re
from typing import Any

import yaml

from testbed.topology.model import (
    CpuMode,
    CpuSet,
    EndpointPins,
    HopSpec,
    HostSpec,
    NoiseAction,
    NoiseSpec,
    Placement,
    QuietWait,
    Topology,
    cpulist,
    parse_cpulist,
)
from testbed.topology.yamlnode import Node, show

MAX_CPU = 4095
HUGEPAGE_RE = re.compile(r"([0-9]{1,12})\s*([kKmMgG])(i?B)?")
_UNIT_KIB = {"k": 1, "m": 1024, "g": 1024 * 1024}


def cpuset(n: Node) -> CpuSet:
    """A CPU set: a list of CPU numbers, or a cpulist text such as ``"0-3,6"``."""
    if isinstance(n.node, yaml.SequenceNode):
        cpus = tuple(sorted({x.int(0, MAX_CPU, "CPU") for x in n.seq(1)}))
    else:
        v = n.scalar()
        if isinstance(v, bool):
            raise n.error(f"expected CPU numbers, got {show(v)}")
        if isinstance(v, int):
            if not 0 <= v <= MAX_CPU:
                raise n.error(f"CPU {v} out of range 0..{MAX_CPU}")
            return (v,)
        if not isinstance(v, str):
            raise n.error(f"expected a list of CPUs or a CPU list such as \"0-3,6\", got {show(v)}")
        if not v.isprintable() or len(v) > 1024:
            # a line break or a megabyte of ranges is no CPU list a host has
            raise n.error(f"not a CPU list: {show(v)} (one line of at most 1024 characters, e.g. \"0-3,6\")")
        try:
            cpus = parse_cpulist(v)
        except ValueError:
            raise n.error(f"not a CPU list: {show(v)} (e.g. \"0-3,6\" or [0, 1])") from None
        if not cpus:
            raise n.error("empty CPU list")
        if cpus[-1] > MAX_CPU:
            raise n.error(f"CPU {cpus[-1]} out of range 0..{MAX_CPU}")
    return cpus


def _pin(n: Node, field: str = "pin") -> tuple[CpuSet, Any]:
    m = n.mapping({field}, required=(field,))
    return cpuset(m[field]), m[field]


def _hugepages(n: Node) -> int:
    v = n.scalar()
    if isinstance(v, int) and not isinstance(v, bool):
        kib = v
    elif isinstance(v, str) and (mt := HUGEPAGE_RE.fullmatch(v)):
        kib = int(mt.group(1)) * _UNIT_KIB[mt.group(2).lower()]
    else:
        raise n.error(f"huge page size {show(v)}: expected a size such as 2M or 1G (or KiB as a number)")
    if kib < 4 or kib & (kib - 1):
        raise n.error(f"huge page size {show(v)}: not a power of two of at least 4 KiB")
    return kib


def guest_placement(n: Node, vcpus: int, host: HostSpec) -> Placement:
    """``guests[i].placement``, its CPUs and node checked against this machine when the
    guest's host is this machine (local, or emulated here)."""
    m = n.mapping({"vcpus", "emulator", "iothreads", "vhost", "numa", "memory", "cpu"})
    vc = None
    if "vcpus" in m:
        pm = m["vcpus"].mapping({"pin"}, required=("pin",))
        pn = pm["pin"]
        items = pn.seq(1) if isinstance(pn.node, yaml.SequenceNode) else None
        if items and all(isinstance(x.node, yaml.SequenceNode) or
                         (isinstance(x.node, yaml.ScalarNode) and isinstance(x.scalar(), str)) for x in items):
            # one set per vCPU
            if len(items) != vcpus:
                raise pn.error(f"{len(items)} CPU sets for {vcpus} vCPU(s): give one set per vCPU, "
                               f"or one set for all")
            vc = tuple(cpuset(x) for x in items)
        else:
            one = cpuset(pn)
            vc = tuple(one for _ in range(vcpus))
    emu = _pin(m["emulator"])[0] if "emulator" in m else None
    io, count = None, 0
    if "iothreads" in m:
        io, count = _pin(m["iothreads"])[0], 1
    vh = _pin(m["vhost"])[0] if "vhost" in m else None
    node = None
    if "numa" in m:
        nm = m["numa"].mapping({"node"}, required=("node",))
        node = nm["node"].int(0, 1023, "NUMA node")
    huge = None
    if "memory" in m:
        mm = m["memory"].mapping({"hugepages"}, required=("hugepages",))
        huge = _hugepages(mm["hugepages"])
    mode = None
    if "cpu" in m:
        cm = m["cpu"].mapping({"mode"}, required=("mode",))
        mode = cm["mode"].enum(CpuMode)
    p = Placement(vcpus=vc, emulator=emu, iothreads=io, iothread_count=count, vhost=vh, numa_node=node,
                  hugepages_kib=huge, cpu_mode=mode)
    if vh is not None and emu is not None and not set(vh) <= set(emu):
        # libvirt keeps the emulator threads in a cpuset cgroup of the emulator pin; the
        # thread serving the NIC (QEMU's main loop, or a vhost worker in QEMU's group) is
        # one of them, and the kernel refuses it an affinity outside that set.
        raise _field(m["vhost"], "pin").error(
            f"CPUs {cpulist(set(vh) - set(emu))} are outside emulator.pin ({cpulist(emu)}): the thread "
            f"serving the NIC lives in the emulator's cgroup, so vhost.pin must lie within emulator.pin")
    if not host.remote:
        _check_host(m, p)
    return p


def _check_host(m: dict, p: Placement) -> None:
    """This machine has the CPUs and the node (a remote host's are checked there, at run
    time, by libvirt, whose refusal names the domain)."""
    from testbed.host import placement as pl
    have = set(pl.host_cpus())
    for key, sets in (("vcpus", p.vcpus or ()), ("emulator", (p.emulator,) if p.emulator else ()),
                      ("iothreads", (p.iothreads,) if p.iothreads else ()),
                      ("vhost", (p.vhost,) if p.vhost else ())):
        for s in sets:
            missing = sorted(set(s) - have)
            if missing:
                node = _field(m[key], "pin")
                raise node.error(f"CPU {cpulist(set(missing))} is not on this host (it has CPUs "
                                 f"{cpulist(have)})")
    if p.numa_node is not None:
        nodes = pl.numa_nodes()
        if p.numa_node not in nodes:
            raise _field(m["numa"], "node").error(f"NUMA node {p.numa_node} is not on this host (it has "
                                                  f"node{'s' if len(nodes) > 1 else ''} "
                                                  f"{', '.join(map(str, sorted(nodes)))})")
    if p.hugepages_kib is not None:
        sizes = pl.hugepage_sizes()
        if sizes and p.hugepages_kib not in sizes:
            raise _field(m["memory"], "hugepages").error(
                f"this host offers no {p.hugepages_kib} kB huge pages (it offers: "
                f"{', '.join(f'{k} kB' for k in sorted(sizes))})")


def _field(n: Node, key: str):
    return n.mapping({key})[key] if isinstance(n.node, yaml.MappingNode) else n


def host_placement(n: Node) -> tuple[CpuSet, bool, EndpointPins | None, CpuSet]:
    """Host-wide ``placement: {harness: CPUS, allow_overlap: BOOL, endpoints: {client: CPUS,
    server: CPUS}, switch: CPUS}``."""
    m = n.mapping(HOST_KEYS)
    from testbed.host import placement as pl
    have = set(pl.host_cpus())
    harness: CpuSet = ()
    if "harness" in m:
        harness = _on_host(m["harness"], have)
        if set(harness) >= have:
            raise m["harness"].error(f"the harness would take every CPU of this host ({cpulist(have)}); "
                                     f"leave some for the guests")
    overlap = m["allow_overlap"].bool() if "allow_overlap" in m else False
    switch: CpuSet = _on_host(m["switch"], have) if "switch" in m else ()
    pins = None
    if "endpoints" in m:
        e = m["endpoints"].mapping({"client", "server"}, required=("client", "server"))
        pins = EndpointPins(client=_on_host(e["client"], have), server=_on_host(e["server"], have))
        if not overlap:
            for role in ("client", "server"):
                for other, cpus in (("placement.harness (kept for the testbed's own processes)", harness),
                                    ("placement.switch (ovs-vswitchd)", switch)):
                    if both := set(pins.of(role)) & set(cpus):
                        raise e[role].error(f"CPU {cpulist(both)} is also in {other}; set "
                                            f"placement.allow_overlap: true to allow it")
            if both := set(pins.client) & set(pins.server):
                raise e["server"].error(f"CPU {cpulist(both)} is also the client's: tools that share a CPU "
                                        f"measure a different path (no cross-CPU wakeups); set "
                                        f"placement.allow_overlap: true to measure that on purpose")
    return harness, overlap, pins, switch


#: the keys of the host-wide placement mapping
HOST_KEYS = frozenset({"harness", "allow_overlap", "endpoints", "switch"})


def _on_host(n: Node, have: set[int]) -> CpuSet:
    cpus = cpuset(n)
    missing = sorted(set(cpus) - have)
    if missing:
        raise n.error(f"CPU {cpulist(set(missing))} is not on this host (it has CPUs {cpulist(have)})")
    return cpus


def _quiet(n: Node, default: QuietWait) -> QuietWait:
    m = n.mapping({"bound_cores", "for_s", "timeout_s"})
    q = QuietWait(bound_cores=m["bound_cores"].float(0, 1024) if "bound_cores" in m else default.bound_cores,
                  for_s=m["for_s"].float(0.5, 3600) if "for_s" in m else default.for_s,
                  timeout_s=m["timeout_s"].float(1, 86400) if "timeout_s" in m else default.timeout_s)
    if q.timeout_s < q.for_s:
        raise (m.get("timeout_s") or n).error(f"timeout_s {q.timeout_s:g} is shorter than for_s {q.for_s:g}: "
                                              f"the host could never be found quiet")
    return q


def noise(n: Node) -> NoiseSpec:
    """``noise: {threshold_cores, run_queue, action, max_retries, settle, quiet_start}``."""
    m = n.mapping({"threshold_cores", "run_queue", "action", "max_retries", "settle", "quiet_start"})
    d = NoiseSpec()
    return NoiseSpec(
        threshold_cores=m["threshold_cores"].float(0, 1024) if "threshold_cores" in m else d.threshold_cores,
        run_queue=m["run_queue"].float(0, 100000) if "run_queue" in m else None,
        action=m["action"].enum(NoiseAction) if "action" in m else d.action,
        max_retries=m["max_retries"].int(0, 100, "max_retries") if "max_retries" in m else d.max_retries,
        settle=_quiet(m["settle"], d.settle) if "settle" in m else d.settle,
        quiet_start=_quiet(m["quiet_start"], QuietWait()) if "quiet_start" in m else None)


def hop_spec(n: Node, matrix) -> HopSpec:  # noqa: ANN001
    """``hops: {overhead_bound_pct, closure_tolerance_pct}``: the bounds per-hop tracing is
    judged by; only with a profile that asks for hops (``hops: true``)."""
    m = n.mapping({"overhead_bound_pct", "closure_tolerance_pct"})
    if not any(p.hops for p in matrix.profiles):
        raise n.error("no profile asks for per-hop latency (give an rr or crr profile hops: true)")
    d = HopSpec()
    return HopSpec(
        overhead_bound=m["overhead_bound_pct"].float(0.1, 100) / 100 if "overhead_bound_pct" in m
        else d.overhead_bound,
        closure_tolerance=m["closure_tolerance_pct"].float(0.1, 100) / 100 if "closure_tolerance_pct" in m
        else d.closure_tolerance)


def hop_profiles(matrix_node: dict[str, Node], matrix) -> None:  # noqa: ANN001
    """Traced cells are measured interleaved with their untraced selves on one path: not
    beside variants (their own interleaving) nor N pairs at once."""
    if not any(p.hops for p in matrix.profiles):
        return
    where = matrix_node["profiles"]
    if matrix.variants:
        raise where.error("hops and variants cannot be combined (each is an interleaving of its own)")
    if max(matrix.pairs) > 1:
        raise where.error("hops are traced one pair at a time (matrix.pairs must be 1)")


def check_placements(t: Topology, host_node, guest_nodes: list, pairs_node) -> None:  # noqa: ANN001
    """Across guests: overlaps the topology did not allow, CPU modes the accelerator cannot
    give, and pins that N pairs would clone onto the same CPUs."""
    def gfield(i: int, *path: str):  # noqa: ANN202
        node = guest_nodes[i].mapping({"name", "host", "memory_mib", "vcpus", "image", "placement"})["placement"]
        for key in path:
            node = node.mapping({"vcpus", "emulator", "iothreads", "vhost", "numa", "memory", "cpu", "pin",
                                 "node", "hugepages", "mode"})[key]
        return node

    for i, g in enumerate(t.guests):
        mode = g.placement.cpu_mode
        if mode is not None and mode.needs_kvm and t.accelerator == "tcg":
            raise gfield(i, "cpu", "mode").error(f"cpu mode {mode.value} needs KVM; this topology asks for "
                                                 f"accelerator tcg (use maximum, or drop cpu.mode)")
    if t.allow_overlap:
        return
    # (guest index, field path, kind, cpus): vCPUs want CPUs of their own; the emulator, IO
    # threads and vhost of guests may share theirs with each other, not with vCPUs.
    roles = []
    for i, g in enumerate(t.guests):
        p = g.placement
        if p.vcpus is not None:
            distinct = list(dict.fromkeys(p.vcpus))
            if len(distinct) > 1:
                for k, s in enumerate(p.vcpus):
                    roles.append((i, ("vcpus", "pin"), f"vCPU {k}", "vcpu", s))
            else:
                roles.append((i, ("vcpus", "pin"), "vCPUs", "vcpu", p.vcpus[0]))
        for key, s in (("emulator", p.emulator), ("iothreads", p.iothreads), ("vhost", p.vhost)):
            if s is not None:
                roles.append((i, (key, "pin"), key, "other", s))
    for a in range(len(roles)):
        ia, fa, wa, ka, sa = roles[a]
        if t.harness_cpus and set(sa) & set(t.harness_cpus):
            raise gfield(ia, *fa).error(
                f"CPU {cpulist(set(sa) & set(t.harness_cpus))} is also in placement.harness (kept for the "
                f"testbed's own processes); set placement.allow_overlap: true to allow it")
        if ka == "vcpu" and set(sa) & set(t.switch_cpus):
            raise gfield(ia, *fa).error(
                f"CPU {cpulist(set(sa) & set(t.switch_cpus))} is also in placement.switch (ovs-vswitchd); "
                f"vCPUs get CPUs of their own unless placement.allow_overlap: true")
        for b in range(a):
            ib, fb, wb, kb, sb = roles[b]
            if "vcpu" not in (ka, kb) or not set(sa) & set(sb):
                continue
            raise gfield(ia, *fa).error(
                f"{t.guests[ia].name} {wa} on CPU {cpulist(set(sa) & set(sb))} overlaps "
                f"{t.guests[ib].name} {wb} (guests[{ib}].placement.{'.'.join(fb)}); vCPUs get CPUs of their "
                f"own unless placement.allow_overlap: true")
    if pairs_node is not None and max(t.matrix.pairs) > 1 and any(g.placement.pinned for g in t.guests):
        raise pairs_node.error("pairs > 1 clone each guest with its placement, so the clones' pins would "
                               "overlap; set placement.allow_overlap: true to allow it")
