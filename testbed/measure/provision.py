"""What a run sets on the host and reads from it around its guests: the harness's CPUs, the
guests' pins on their running domains, idle readings, each host's fingerprint
(testbed.measure.run calls these in its phases)."""
from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator, Mapping, Sequence

from testbed.errors import CapabilityError, TestbedError
from testbed.guests import virt
from testbed.host import environment, remote
from testbed.host import placement as placement_mod
from testbed.measure import pairs as pairs_mod
from testbed.topology.model import Topology


@contextlib.contextmanager
def harness_cpus(cpus: Sequence[int], daemons: Sequence[str] = ("ovs-vswitchd",),
                 daemon_cpus: Sequence[int] = ()) -> Iterator[dict]:
    """This process (and so every thread and child it starts from now on: agents, namespace
    tools, collectors) kept on ``cpus``, and the ``daemons``' threads on ``daemon_cpus``
    (placement.switch) or else on ``cpus``; their affinity is put back on the way out."""
    daemon_cpus = tuple(daemon_cpus) or tuple(cpus)
    if not cpus and not daemon_cpus:
        yield {}
        return
    import psutil
    saved: dict[int, set[int]] = {0: os.sched_getaffinity(0)}
    tids = []
    for p in psutil.process_iter(["name"]):
        if p.info["name"] in daemons:
            with contextlib.suppress(psutil.Error):
                tids += [th.id for th in p.threads()]
    try:
        if cpus:
            os.sched_setaffinity(0, set(cpus))
        for tid in tids:
            with contextlib.suppress(OSError):
                saved[tid] = os.sched_getaffinity(tid)
                os.sched_setaffinity(tid, set(daemon_cpus))
        yield {"cpus": list(cpus), "daemons": list(daemons), "daemon_cpus": list(daemon_cpus),
               "daemon_threads": len(tids)}
    finally:
        for tid, old in saved.items():
            with contextlib.suppress(OSError):
                os.sched_setaffinity(tid, old)

def apply_placement(t: Topology, guests: Mapping[str, virt.Guest]) -> dict:
    """Every local guest's pins set on the running domain (placement.apply_live: a guest
    restored from a snapshot gets this run's pins, not its saved ones); a per-vCPU pin QEMU
    cannot hold (all vCPUs in one thread: single-threaded TCG) is exit 3, naming the field."""
    out = {}
    for name, g in guests.items():
        if g.shell is not None:
            continue
        p = g.spec.placement
        pid = virt.qemu_pid(g)
        i = next((k for k, x in enumerate(t.guests) if x.name == name), None)
        where = f"guests[{i}]" if i is not None else f"guest {name}"
        if pid and p.vcpus is not None and len(set(p.vcpus)) > 1:
            one = placement_mod.single_threaded_vcpus(pid)
            if one:
                raise CapabilityError(f"{t.source}: {where}.placement.vcpus.pin: the vCPUs get different CPUs, "
                                      f"but QEMU runs them all in one thread ({one}: single-threaded TCG)")
        try:
            out[name] = placement_mod.apply_live(g.dom, pid, p)
        except Exception as e:     # libvirt.libvirtError, OSError from sched_setaffinity
            raise TestbedError(f"{where}: placement could not be applied: {e}") from None
    return out

def idle(guests: dict[str, virt.Guest], t: Topology, progress: Callable[[str], None]) -> list[dict]:
    """An idle reading of the guests booted so far (local QEMUs only)."""
    secs = pairs_mod.idle_window_s()
    pids = {n: p for n, g in guests.items() if g.shell is None and (p := virt.qemu_pid(g))}
    if secs <= 0 or not pids:
        return []
    rec = pairs_mod.idle_reading(pids, secs, t.guest(t.client).memory_mib)
    progress(f"idle: {rec['guests']} guests, host {rec['host_busy_cores']} cores busy over {rec['window_s']} s, "
             f"QEMU RSS {sum(rec['qemu_rss_mib'].values()):.0f} MiB")
    return [rec]

def host_fingerprints(t: Topology, env: Mapping) -> dict[str, dict]:
    """Each host's environment. A host emulated on this machine shares its kernel, QEMU and
    CPU, so its fingerprint is this machine's, marked as emulated; a remote host's is read
    there."""
    out = {}
    for h in t.hosts:
        if h.remote:
            from testbed.host import tuning
            nics = [n for n in (h.underlay or t.tunnel.underlay,) if n]
            out[h.name] = {**environment.remote_fingerprint(remote.shell(h), h.uri),
                           "tuning": tuning.remote(remote.shell(h), nics),
                           # its guests boot with the run's accelerator
                           "accelerator": env["accelerator"], "comparable_class": env["comparable_class"],
                           "uri": h.uri, "transport": h.transport, "emulated": None}
            continue
        out[h.name] = {**env, "uri": h.uri, "transport": h.transport,
                       "emulated": "netns" if h.emulated else None}
    return out


__all__ = ["apply_placement", "harness_cpus", "host_fingerprints", "idle"]
