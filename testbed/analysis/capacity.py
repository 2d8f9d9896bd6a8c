"""`testbed capacity`: how many VMs of a traffic profile fit on a host, per attachment mode.

Pure arithmetic on a run's samples:

- CPU cost per unit of traffic, per cell: mean cores / mean traffic over the cell's
  successful samples (a ratio of means; a mean of ratios overweights the slow samples).
  ``basis="host"`` counts the whole host's busy cores; ``basis="qemu"`` only the virtual
  path: per-guest QEMU threads and vhost workers plus ovs-vswitchd (attributed), plus the
  host's softirq share, which no thread carries. Both include the sender
  *and* the receiver guest of the measured pair, so each planned VM is charged both ends of
  a path: conservative, since a VM talking off-host costs this host only one end.
- Per mode, the most expensive matching cell is used (after the optional MTU/connections
  filters) and named, so a plan never rests on the cheapest corner of the matrix.
- Cores available: ``host_cores`` (default: the run's recorded ``cpus``) less ``headroom``.
- Link: each VM's traffic is assumed to cross the host's uplink. Stream demand is payload,
  so it is scaled by the frame overhead at the cell's MTU; a transaction puts its larger
  message, framed, on the busier direction. The same ``headroom`` is kept free on the link,
  because a link run at 100 % queues just as a CPU run at 100 % does.
- The resource that allows fewer VMs is named as the limit.
"""
from __future__ import annotations

import dataclasses
import math
import re
from dataclasses import dataclass
from typing import Any

from testbed.analysis.compare import measured
from testbed.errors import TestbedError
from testbed.records.records import Cpu, RunRecord

BASES = ("host", "qemu")
#: preamble 8 + Ethernet header 14 + FCS 4 + inter-frame gap 12: bytes per frame beyond the MTU
ETHERNET_OVERHEAD = 38
MIN_WIRE_FRAME = 84                 # 64-byte minimum frame + preamble + gap
L34_HEADERS = {"tcp": 52, "udp": 28}   # IPv4 20 + TCP 20 + timestamps 12 | IPv4 20 + UDP 8


class CapacityError(TestbedError):
    exit_status = 2


@dataclass(frozen=True)
class Demand:
    kind: str           # "stream" (per_vm in Gbit/s) or "rr" (per_vm in transactions/s)
    per_vm: float
    text: str

    @property
    def unit(self) -> str:
        return "Gbit/s" if self.kind == "stream" else "tps"


_DEMAND = re.compile(r"^(stream|rr):(\d+(?:\.\d+)?)(gbit|gbps|mbit|mbps|kbit|kbps|tps|ktps)?$",
                     re.ASCII)   # ASCII digits: float() would read '٣' as 3
_SCALE = {"gbit": 1.0, "gbps": 1.0, "mbit": 1e-3, "mbps": 1e-3, "kbit": 1e-6, "kbps": 1e-6,
          "tps": 1.0, "ktps": 1e3}


def parse_demand(text: str) -> Demand:
    """``stream:2gbit``, ``stream:500mbit``, ``rr:5000tps``, ``rr:5ktps``."""
    m = _DEMAND.match(text.strip().lower().replace(" ", ""))
    if not m:
        raise CapacityError(f"--profile {text!r}: expected stream:<N>gbit|mbit or rr:<N>tps|ktps")
    kind, value, unit = m.group(1), float(m.group(2)), m.group(3)
    unit = unit or ("gbit" if kind == "stream" else "tps")
    if (kind == "stream") != (unit not in ("tps", "ktps")):
        raise CapacityError(f"--profile {text!r}: {kind} takes "
                            f"{'a bit rate (gbit, mbit)' if kind == 'stream' else 'tps or ktps'}")
    if not math.isfinite(value) or value <= 0:
        raise CapacityError(f"--profile {text!r}: the per-VM rate must be a finite positive number")
    return Demand(kind, value * _SCALE[unit], text)


# --------------------------------------------------------------------------- link

def wire_bytes(payload: float, mtu: int, protocol: str = "tcp") -> float:
    """Bytes on the wire for one message of ``payload`` bytes, framed at ``mtu``."""
    hdr = L34_HEADERS.get(protocol, L34_HEADERS["tcp"])
    frames = max(1, math.ceil(payload / (mtu - hdr)))
    return max(MIN_WIRE_FRAME * frames, payload + frames * (hdr + ETHERNET_OVERHEAD))


def stream_wire_factor(mtu: int, protocol: str = "tcp") -> float:
    """Wire bits per payload bit for full-size frames."""
    hdr = L34_HEADERS.get(protocol, L34_HEADERS["tcp"])
    return (mtu + ETHERNET_OVERHEAD) / (mtu - hdr)


# --------------------------------------------------------------------------- unit costs

@dataclass(frozen=True)
class UnitCost:
    """What one unit of traffic (1 Gbit/s, or 1 transaction/s) cost in one cell."""

    mode: str                       # attachment/backend
    cell_id: str
    mtu: int
    connections: int
    profile: str
    n: int                          # samples used
    traffic: float                  # mean measured rate of the pair, Gbit/s or tps
    cores: float                    # mean cores on the chosen basis
    cores_per_unit: float
    link_gbit_per_unit: float       # uplink Gbit/s per unit of demand


def unit_costs(rec: RunRecord, kind: str, basis: str = "host", *, mtu: int | None = None,
               connections: int | None = None) -> list[UnitCost]:
    if basis not in BASES:
        raise CapacityError(f"--basis {basis!r}: expected one of {', '.join(BASES)}")
    out = []
    for cid, samples in sorted(measured(rec).items()):
        cell = samples[0].cell
        prof = str(cell.profile)
        if rec.is_transactional(prof) != (kind == "rr"):
            continue
        if (mtu is not None and cell.mtu != mtu) or \
                (connections is not None and cell.connections != connections):
            continue
        metric = rec.primary_metric(prof)
        pairs = []
        for s in samples:
            value = s.metrics.get(metric)
            cores = getattr(s.cpu.cores(), basis)
            if basis == "qemu" and cores is not None:
                # Softirq work done outside any attributed thread (on interrupt exit, at
                # local_bh_enable, in ksoftirqd) is the virtual path's too: the host's
                # softirq share is added, so the basis is attributed + host softirq.
                cores += _softirq(s.cpu)
            if s.ok and isinstance(value, (int, float)) and cores is not None:
                pairs.append((value / 1000.0 if kind == "stream" else float(value), cores))
        traffic = sum(p[0] for p in pairs) / len(pairs) if pairs else 0.0
        if traffic <= 0:
            continue
        cores = sum(p[1] for p in pairs) / len(pairs)
        cell_mtu, p = int(cell.mtu or 1500), rec.profile_entry(prof)
        proto = str(p.protocol or "tcp")
        if kind == "stream":
            link = stream_wire_factor(cell_mtu, proto)
        else:
            req, resp = p.message_size, p.response_size
            if req is None or resp is None:   # sizes unknown: half the payload bytes each way
                per_tx = [b / (t * d) for x in samples if x.ok
                          if (b := x.metric("bytes")) and (t := x.metric("transactions_per_s"))
                          and (d := x.metric("duration_s"))]
                req = resp = (sum(per_tx) / len(per_tx) / 2) if per_tx else 1
            link = 8 * max(wire_bytes(req, cell_mtu, proto), wire_bytes(resp, cell_mtu, proto)) / 1e9
        out.append(UnitCost(mode=cell.mode, cell_id=cid,
                            mtu=cell_mtu, connections=int(cell.connections or 0),
                            profile=prof, n=len(pairs), traffic=traffic, cores=cores,
                            cores_per_unit=cores / traffic, link_gbit_per_unit=link))
    return out


# --------------------------------------------------------------------------- fitting

@dataclass(frozen=True)
class Fit:
    mode: str
    cost: UnitCost
    cores_per_vm: float
    usable_cores: float
    vms_by_cpu: int | None          # None: the cell cost no measurable CPU
    link_gbit_per_vm: float
    usable_link_gbit: float
    vms_by_link: int
    vms: int
    limit: str                      # "cpu", "link" or "cpu+link" (a tie)
    warnings: tuple[str, ...] = ()


def fit(cost: UnitCost, demand: Demand, *, host_cores: float, headroom: float,
        link_gbit: float) -> Fit:
    if not 0 <= headroom < 1:
        raise CapacityError(f"--headroom {headroom}: expected a fraction in [0, 1)")
    if host_cores <= 0 or link_gbit <= 0:
        raise CapacityError("--host-cores and --link-gbit must be positive")
    usable_cores = host_cores * (1 - headroom)
    usable_link = link_gbit * (1 - headroom)
    cores_per_vm = cost.cores_per_unit * demand.per_vm
    link_per_vm = cost.link_gbit_per_unit * demand.per_vm
    # A hair of tolerance so 1.6 / 0.4 is 4, not 3.9999999999999996 -> 3.
    by_cpu = math.floor(usable_cores / cores_per_vm + 1e-9) if cores_per_vm > 0 else None
    by_link = math.floor(usable_link / link_per_vm + 1e-9)
    vms = by_link if by_cpu is None else min(by_cpu, by_link)
    limit = ("link" if by_cpu is None or by_link < by_cpu else
             "cpu" if by_cpu < by_link else "cpu+link")
    warnings = []
    if demand.per_vm > cost.traffic:
        warnings.append(f"per-VM demand {demand.per_vm:g} {demand.unit} is above the "
                        f"{cost.traffic:.4g} {demand.unit} this cell measured: cost extrapolated")
    if cost.n < 3:
        warnings.append(f"only {cost.n} sample(s) behind this cost")
    return Fit(mode=cost.mode, cost=cost, cores_per_vm=cores_per_vm, usable_cores=usable_cores,
               vms_by_cpu=by_cpu, link_gbit_per_vm=link_per_vm, usable_link_gbit=usable_link,
               vms_by_link=by_link, vms=vms, limit=limit, warnings=tuple(warnings))


@dataclass(frozen=True)
class Plan:
    run_id: str
    accelerator: str | None
    demand: Demand
    basis: str
    host_cores: float
    headroom: float
    link_gbit: float
    fits: tuple[Fit, ...]

    @property
    def tcg(self) -> bool:
        return self.accelerator == "tcg"


def plan(rec: RunRecord, demand: Demand, *, host_cores: float | None = None,
         headroom: float = 0.2, link_gbit: float = 10.0, basis: str = "host",
         mtu: int | None = None, connections: int | None = None) -> Plan:
    env = rec.environment
    cores = host_cores if host_cores is not None else env.cpus
    if not isinstance(cores, (int, float)) or cores <= 0:
        raise CapacityError(f"run {rec.run_id} records no cpus; pass --host-cores")
    costs = unit_costs(rec, demand.kind, basis, mtu=mtu, connections=connections)
    if not costs:
        raise CapacityError(f"run {rec.run_id} has no successful "
                            f"{'rr/crr' if demand.kind == 'rr' else 'stream'} samples with CPU "
                            f"figures" + (f" at MTU {mtu}" if mtu else "")
                            + (f" with {connections} connections" if connections else ""))
    worst: dict[str, UnitCost] = {}
    for c in costs:
        if c.mode not in worst or c.cores_per_unit > worst[c.mode].cores_per_unit:
            worst[c.mode] = c
    fits = tuple(fit(c, demand, host_cores=float(cores), headroom=headroom, link_gbit=link_gbit)
                 for _, c in sorted(worst.items()))
    return Plan(str(rec.run_id), env.accelerator, demand, basis, float(cores),
                headroom, link_gbit, fits)


# --------------------------------------------------------------------------- output

TCG_BANNER = ("!! TCG run: guest CPU was emulated, so these costs are a functional check of the "
              "arithmetic only. Do not plan a KVM host from them.")


def to_dict(p: Plan) -> dict[str, Any]:
    return {**dataclasses.asdict(p), "banner": TCG_BANNER if p.tcg else None}


def _softirq(cpu: Cpu) -> float:
    return cpu.host_softirq or 0.0


def render_text(p: Plan) -> str:
    basis = ("host busy cores" if p.basis == "host"
             else "attributed (QEMU + vhost + ovs-vswitchd) + host softirq cores")
    lines = [f"run {p.run_id} ({p.accelerator}); per VM: {p.demand.kind} {p.demand.per_vm:g} "
             f"{p.demand.unit}; CPU basis: {basis}",
             f"cores: {p.host_cores:g} less {p.headroom:.0%} headroom = "
             f"{p.host_cores * (1 - p.headroom):.3g} usable; link: {p.link_gbit:g} Gbit/s less "
             f"{p.headroom:.0%} = {p.link_gbit * (1 - p.headroom):.3g} Gbit/s usable"]
    if p.tcg:
        lines.append(TCG_BANNER)
    unit = "Gbit/s" if p.demand.kind == "stream" else "ktps"
    scale = 1.0 if p.demand.kind == "stream" else 1e3
    header = ("mode", "VMs", "limit", "cores/VM", "by cpu", "link/VM", "by link",
              f"cores per {unit}", "cell")
    rows = [(f.mode, str(f.vms), f.limit, f"{f.cores_per_vm:.3g}",
             "-" if f.vms_by_cpu is None else str(f.vms_by_cpu), f"{f.link_gbit_per_vm:.3g}",
             str(f.vms_by_link), f"{f.cost.cores_per_unit * scale:.3g}",
             f"{f.cost.cell_id} (n={f.cost.n})") for f in p.fits]
    widths = [max(len(r[i]) for r in (header, *rows)) for i in range(len(header))]
    lines += ["  ".join(v.ljust(w) for v, w in zip(r, widths)).rstrip() for r in (header, *rows)]
    lines += [f"  {f.mode}: {w}" for f in p.fits for w in f.warnings]
    return "\n".join(lines) + "\n"
