"""Frozen, typed records that flow through the testbed. No dicts passed around as records."""
from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields
from enum import StrEnum

from testbed import PREFIX

# Names end up in libvirt XML, interface names and argv; keep them to a safe alphabet so
# no value can inject markup or shell syntax, and short enough for 15-byte ifnames.
NAME_RE = re.compile(r"^[a-z][a-z0-9-]{0,9}$")


class Attachment(str):
    """How a guest NIC reaches the wire: the name of an attachment mode.

    The model knows no mode. testbed/attachments registers them; configuration validates a
    name against that registry, and code that needs a mode's behaviour asks
    ``attachments.get(name)``. So the model stays at the bottom of the package, and a new
    mode is one module plus one registry line. A string: results files hold the same text."""

    __slots__ = ()

    @property
    def value(self) -> str:
        # the same spelling as the enums beside it (Backend.value)
        return str.__str__(self)

    def __repr__(self) -> str:
        return f"Attachment({self.value!r})"


class Backend(StrEnum):
    """The virtio-net backend: in-kernel vhost-net or QEMU's userspace virtio."""

    VHOST = "vhost"
    QEMU = "qemu"

    @property
    def driver_name(self) -> str:
        # libvirt's <driver name=...> for interfaces
        return "vhost" if self is Backend.VHOST else "qemu"


class Accelerator(StrEnum):
    """What guests run on: KVM, or QEMU's TCG emulator. Every result records it; TCG figures
    are functional checks, never compared with KVM figures."""

    KVM = "kvm"
    TCG = "tcg"

    @property
    def domain_type(self) -> str:
        # libvirt calls TCG domains type='qemu'
        return "kvm" if self is Accelerator.KVM else "qemu"


class Tool(str):
    """A traffic tool's name. The model knows no tool: testbed/tools registers the drivers,
    configuration validates a name against them, and code that needs a tool's behaviour asks
    ``tools.get_tool(name)``. A string: results files hold the same text."""

    __slots__ = ()

    @property
    def value(self) -> str:
        return str.__str__(self)

    def __repr__(self) -> str:
        return f"Tool({self.value!r})"


class Protocol(StrEnum):
    TCP = "tcp"
    UDP = "udp"


class Pattern(StrEnum):
    """Traffic pattern, independent of the tool that produces it."""

    STREAM = "stream"        # client sends
    MAERTS = "maerts"        # server sends
    BIDIRECTIONAL = "bidirectional"
    RR = "rr"                # request/response on one connection
    CRR = "crr"              # connect/request/response/close

    @property
    def is_transactional(self) -> bool:
        return self in (Pattern.RR, Pattern.CRR)

    @property
    def primary_metric(self) -> str:
        """The one place that says which metric a cell of this pattern is judged by (the
        stopping rule, compare, report, capacity, history all ask here)."""
        return "transactions_per_s" if self.is_transactional else "throughput_mbps"


@dataclass(frozen=True)
class RateSearch:
    """A loss-bounded rate search (profile kind ``udp_ndr``): the offered UDP rate is searched
    for NDR (no datagram lost) and PDR (at most ``pdr_loss`` of them lost) by CSIT's
    MLRsearch (testbed.measure.ratesearch), one trial through the tool per load it asks for. Rates
    are payload bits per second; the search's own unit is datagrams per second."""

    #: the partial-drop goal's loss ratio (0.005 = 0.5 %)
    pdr_loss: float = 0.005
    #: the shortest and the longest trial, seconds (MLRsearch's initial and final durations)
    trial_s: tuple[int, int] = (1, 5)
    #: relative width at which the search stops: upper - lower bound <= precision x upper
    precision: float = 0.05
    #: the search gives up after this many seconds, with the bounds it has
    max_search_s: int = 600
    #: the rates searched between, payload bit/s; their text as the user wrote it
    min_rate_bps: int = 1_000_000
    max_rate_bps: int = 1_000_000_000
    #: share of trial seconds that may fail a goal while a load still counts as its lower
    #: bound (MLRsearch's exceed ratio; 0 = every trial must meet it)
    exceed_ratio: float = 0.0
    #: trial seconds at a load before it counts as a bound (MLRsearch's duration sum);
    #: None: the longest trial's duration, so one final trial decides
    duration_sum_s: int | None = None


@dataclass(frozen=True)
class Profile:
    """A traffic pattern: tool, protocol, pattern, sizes and duration."""

    name: str
    tool: Tool = Tool("netperf")
    protocol: Protocol = Protocol.TCP
    pattern: Pattern = Pattern.STREAM
    message_size: int | None = None     # bytes per send (stream) or request size (rr)
    response_size: int | None = None    # rr/crr only
    duration_s: int = 10
    #: target bit rate for rate-limited UDP (bit/s); None = as fast as possible
    rate_bps: int | None = None
    #: netperf -I level,width (e.g. 99,5) and -i max,min: netperf's own confidence loop
    confidence: tuple[int, int] | None = None
    iterations: tuple[int, int] | None = None
    #: paced load: target transactions per second per pair (rr/crr); a bit-rate
    #: target is rate_bps. ``rate`` keeps the text the user wrote (``2gbit``, ``5000tps``).
    rate_tps: int | None = None
    rate: str | None = None
    #: kind ``udp_ndr``: the rate is searched, not given (None: an ordinary measurement)
    search: RateSearch | None = None
    #: paced at this fraction of the maximum the profile ``rate_of`` measured in the same run
    #: (``rates: [0.5max]``): the runner resolves rate_tps from it before measuring, and the
    #: hash holds the fraction, not the resolved rate
    rate_fraction: float | None = None
    rate_of: str | None = None
    #: latency percentiles to record, percent (matrix.percentiles; None: p50, p90, p99, p99.9).
    #: What is computed from a measurement, not what is measured: left out of the hash.
    percentiles: tuple[float, ...] | None = None
    #: per-hop latency (testbed.measure.hops): each cell of this profile is measured traced
    #: too, interleaved with its untraced self. Left out of the hash: the untraced cell stays
    #: the same test; the traced one has a context of its own.
    hops: bool = False

    @property
    def kind(self) -> str:
        return "udp_ndr" if self.search is not None else "measure"

    @property
    def paced(self) -> bool:
        """A target rate per pair: bits for streams, transactions for rr/crr."""
        return self.rate is not None

    @property
    def netperf_test(self) -> str:
        return f"{self.protocol.value}_{self.pattern.value}".upper()


@dataclass(frozen=True)
class Cell:
    """One point of the matrix."""

    attachment: Attachment
    backend: Backend
    mtu: int
    connections: int
    profile: Profile
    #: virtio-net queue pairs of the NIC under test (multiqueue); 1 = single queue
    queues: int = 1
    #: run-wide settings that change the measurement but are not matrix axes (offloads,
    #: guest size and image, placement, variant), as sorted (key, value) pairs: see
    #: :func:`context_of`. Part of the definition hash, not of the readable id.
    context: tuple[tuple[str, str], ...] = ()
    #: guest pairs measured at once on the same datapath; 1 = one pair
    pairs: int = 1

    @property
    def id(self) -> str:
        # Single-queue ids keep the short form, e.g. ovs-qemu-mtu9000-conn8-tcp_rr; so do
        # one-pair ids (-pN only for N > 1).
        q = f"-q{self.queues}" if self.queues > 1 else ""
        v = dict(self.context).get("variant")
        return (f"{self.attachment.value}-{self.backend.value}{q}-mtu{self.mtu}"
                f"-conn{self.connections}-{self.profile.name}" + (f"-v{v}" if v else "")
                + (f"-p{self.pairs}" if self.pairs > 1 else "")
                # measured traced (testbed.measure.hops), beside the same cell untraced
                + ("-hops" if dict(self.context).get("hops") else ""))

    def definition(self) -> dict:
        """Everything that changes what this cell measures, as plain JSON values."""
        return definition(self.as_dict(hashed=False),
                          json.loads(json.dumps(asdict(self.profile), default=str)),
                          dict(self.context))

    @property
    def hash(self) -> str:
        return definition_hash(self.definition())

    def as_dict(self, hashed: bool = True) -> dict:
        d = {"attachment": self.attachment.value, "backend": self.backend.value,
             "queues": self.queues, "mtu": self.mtu, "connections": self.connections,
             "profile": self.profile.name, "tool": self.profile.tool.value, "id": self.id}
        if self.context:
            d["context"] = dict(self.context)
        if self.pairs > 1:
            d["pairs"] = self.pairs
        if self.profile.rate:
            d["rate"] = self.profile.rate
        if hashed:
            d["hash"] = self.hash
            if "variant" in d.get("context", {}):
                # what `compare --variants A B` matches A's and B's cells by
                ctx = tuple(kv for kv in self.context if not kv[0].startswith("variant"))
                d["hash_without_variant"] = Cell(self.attachment, self.backend, self.mtu,
                                                 self.connections, self.profile, self.queues,
                                                 ctx, self.pairs).hash
        return d


#: the Cell fields that are matrix axes (the rest of its definition is the profile and context)
_AXES = ("attachment", "backend", "queues", "mtu", "connections")
#: Profile fields added after results were first recorded: left out of the hash while unset
_NEW_PROFILE_KEYS = ("rate_tps", "rate", "search", "rate_fraction", "rate_of")
#: Profile fields that choose what is computed from the measurement, never part of the hash
_ANALYSIS_KEYS = ("percentiles", "hops")


def definition(cell: Mapping, profile: Mapping, context: Mapping) -> dict:
    """A cell's full definition from its dict forms (a sample's ``cell``, the topology's
    profile entry, the run context), so that a cell written today and one upgraded from an
    older results file hash alike when they measured the same thing."""
    axes = {k: cell.get(k, 1 if k == "queues" else None) for k in _AXES}
    if (cell.get("pairs") or 1) != 1:
        # Only N > 1 enters the hash, so every cell defined before the pairs axis keeps its hash.
        axes["pairs"] = cell["pairs"]
    # The paced-load fields likewise enter only when set.
    prof = {k: v for k, v in dict(profile).items()
            if not (k in _NEW_PROFILE_KEYS and v is None) and k not in _ANALYSIS_KEYS}
    if prof.get("rate_fraction") is not None:
        # resolved from this run's own maximum: the fraction is the definition
        prof.pop("rate_tps", None)
    return {"axes": axes, "profile": prof, "context": {str(k): str(v) for k, v in context.items()}}


def definition_hash(defn: Mapping) -> str:
    """12 hex digits of SHA-256 over the canonical JSON of a definition."""
    text = json.dumps(defn, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def context_of(topology: Mapping, variant: str | None = None) -> tuple[tuple[str, str], ...]:
    """The run-wide settings of a topology (in its JSON dict form, as run.json holds it)
    that change a measurement: requested offloads, both guests' size and image, their
    placement, the namespace endpoints' and ovs-vswitchd's pins, and the variant the cell
    ran under. Only set values are listed, so a topology that leaves them all at their
    defaults has an empty context."""
    out: dict[str, str] = {}
    off = topology.get("offloads")
    if off:
        out["offloads"] = ",".join(f"{k}-{'on' if v else 'off'}" for k, v in sorted(off.items())
                                   if v is not None) or "default"
    guests = {g.get("name"): g for g in topology.get("guests") or ()}
    for role in ("client", "server"):
        g = guests.get(topology.get(role)) or {}
        if g:
            out[f"{role}.size"] = f"{g.get('vcpus')}vcpu-{g.get('memory_mib')}MiB"
            out[f"{role}.host"] = str(g.get("host"))
            if g.get("image"):
                out[f"{role}.image"] = str(g["image"])
            label = placement_label(g.get("placement"))
            if label:
                out[f"{role}.placement"] = label
    if topology.get("switch_cpus"):
        out["switch.placement"] = cpulist(tuple(topology["switch_cpus"]))
    pins = topology.get("endpoint_pins")
    if pins:
        # a namespace cell's tools on one CPU or two measure different paths
        out["endpoints.placement"] = EndpointPins(tuple(pins["client"]), tuple(pins["server"])).label()
    if variant:
        out["variant"] = variant
    return tuple(sorted(out.items()))


def placement_label(d: Mapping | None) -> str:
    """A guest's placement (its JSON dict form, as run.json holds it) as Placement.label()
    gives it; empty when nothing is set (so every run before placement keeps its hashes)."""
    if not d:
        return ""
    vc = d.get("vcpus")
    mode = d.get("cpu_mode")
    p = Placement(vcpus=tuple(tuple(s) for s in vc) if vc is not None else None,
                  emulator=_tup(d.get("emulator")), iothreads=_tup(d.get("iothreads")),
                  vhost=_tup(d.get("vhost")), numa_node=d.get("numa_node"),
                  hugepages_kib=d.get("hugepages_kib"), cpu_mode=CpuMode(mode) if mode else None)
    return p.label()


def _tup(v: object) -> tuple[int, ...] | None:
    return None if v is None else tuple(v)  # type: ignore[arg-type]


@dataclass(frozen=True)
class HostSpec:
    """A hypervisor: a libvirt URI plus a way to run commands on it."""

    name: str
    uri: str = "qemu:///system"
    transport: str = "local"             # local | ssh | netns (emulated on this machine)
    ssh_target: str | None = None        # user@host when transport is ssh
    ssh_port: int = 22
    #: file of pinned host keys for transport ssh (None: ssh's own known_hosts files); the
    #: key is always checked, never accepted on first use
    known_hosts: str | None = None
    identity: str | None = None          # private key for transport ssh (None: ssh's default)
    #: this host's underlay interface when it differs from tunnel.underlay (real hosts)
    underlay: str | None = None

    @property
    def remote(self) -> bool:
        """A real host other than this machine, reached over ssh."""
        return self.transport == "ssh"

    @property
    def emulated(self) -> bool:
        """A host emulated on this machine: its datapath lives in its own network namespace
        and its guests run in the local libvirt."""
        return self.transport == "netns"


@dataclass(frozen=True)
class TunnelSpec:
    """The VXLAN tunnel between two hosts."""

    vni: int = 42
    udp_port: int = 4789                 # IANA's VXLAN port
    #: each host's interface that carries the tunnel; None on emulated hosts (the testbed's wire)
    underlay: str | None = None
    underlay_mtu: int = 1500


#: a set of host CPU numbers, sorted
CpuSet = tuple[int, ...]


def cpulist(cpus: CpuSet | frozenset[int] | set[int]) -> str:
    """Linux cpulist text (``0-3,6``) of a set of CPU numbers, as libvirt's cpuset and
    /proc's Cpus_allowed_list write it."""
    out: list[str] = []
    run: list[int] = []
    for c in sorted(cpus):
        if run and c == run[-1] + 1:
            run.append(c)
            continue
        if run:
            out.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
        run = [c]
    if run:
        out.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
    return ",".join(out)


def parse_cpulist(text: str) -> CpuSet:
    """Pure: ``0-3,6`` -> (0, 1, 2, 3, 6). Raises ValueError on anything else."""
    cpus: set[int] = set()
    text = text.strip()
    if not text:
        return ()
    for part in text.split(","):
        lo, dash, hi = part.strip().partition("-")
        # ASCII digits: '٣' is a digit to str.isdigit() and int(), not in a CPU list
        if not (lo.isascii() and lo.isdigit()) or (dash and not (hi.isascii() and hi.isdigit())):
            raise ValueError(f"not a CPU list: {text!r}")
        a, b = int(lo), int(hi) if dash else int(lo)
        if b < a or b - a > 4096:
            raise ValueError(f"not a CPU list: {text!r}")
        cpus.update(range(a, b + 1))
    return tuple(sorted(cpus))


class CpuMode(StrEnum):
    """libvirt's <cpu mode=...>. host-passthrough and host-model need KVM; maximum is what
    the accelerator can offer (TCG included)."""

    HOST_PASSTHROUGH = "host-passthrough"
    HOST_MODEL = "host-model"
    MAXIMUM = "maximum"

    @property
    def needs_kvm(self) -> bool:
        return self is not CpuMode.MAXIMUM


@dataclass(frozen=True)
class Placement:
    """Where a guest's threads and memory go on its host (``guests[].placement``). Every
    field None leaves it to the host's scheduler, as before placement existed.

    ``vcpus``: one set per vCPU (a single set given in the topology is repeated for each);
    ``vhost``: the vhost-net worker of the guest's NICs, or with the userspace backend the
    QEMU main-loop thread that runs virtio-net, found and pinned at run time."""

    vcpus: tuple[CpuSet, ...] | None = None
    emulator: CpuSet | None = None
    iothreads: CpuSet | None = None
    #: IO threads the domain gets (its disks use the first); 1 when iothreads is pinned
    iothread_count: int = 0
    vhost: CpuSet | None = None
    numa_node: int | None = None
    #: huge page size in KiB for the guest's memory (2048, 1048576); None: normal pages
    hugepages_kib: int | None = None
    cpu_mode: CpuMode | None = None

    @property
    def pinned(self) -> bool:
        return any(x is not None for x in (self.vcpus, self.emulator, self.iothreads, self.vhost))

    @property
    def shapes_saved_state(self) -> str | None:
        """What of this placement is baked into QEMU's start (memory backing, NUMA policy,
        CPU model, IO thread objects), so a saved guest state made without it cannot be
        restored with it; None when only pins are set (pins change on a running guest)."""
        what = [name for name, v in (("iothreads", self.iothread_count), ("numa", self.numa_node is not None),
                                     ("hugepages", self.hugepages_kib), ("cpu mode", self.cpu_mode)) if v]
        return ", ".join(what) or None

    def label(self) -> str:
        """A short text for the cell's definition (context), set fields only."""
        parts = []
        if self.vcpus is not None:
            parts.append("vcpus=" + "/".join(cpulist(s) for s in self.vcpus))
        for name, v in (("emulator", self.emulator), ("iothreads", self.iothreads), ("vhost", self.vhost)):
            if v is not None:
                parts.append(f"{name}={cpulist(v)}")
        if self.numa_node is not None:
            parts.append(f"numa={self.numa_node}")
        if self.hugepages_kib:
            parts.append(f"hugepages={self.hugepages_kib}k")
        if self.cpu_mode:
            parts.append(f"cpu={self.cpu_mode.value}")
        return ";".join(parts)


@dataclass(frozen=True)
class EndpointPins:
    """Where a namespace endpoint pair's tools run (``placement.endpoints``): every process the
    client namespace's endpoint starts (netperf, uperf, iperf3 clients) on ``client``, every
    one the server's starts (netserver, servers) on ``server``. Without it the scheduler puts
    them where it likes, and two tools that share a CPU one sample and not the next measure
    two different paths (on a 2-core host, request/response rates three times apart)."""

    client: CpuSet
    server: CpuSet

    def of(self, role: str) -> CpuSet:
        return self.client if role == "client" else self.server

    def label(self) -> str:
        return f"client {cpulist(self.client)}, server {cpulist(self.server)}"


@dataclass(frozen=True)
class GuestSpec:
    name: str
    host: str
    memory_mib: int = 1024
    vcpus: int = 1
    #: None: the testbed's own cached image; else a user-supplied qcow2 cloud image
    image: str | None = None
    placement: Placement = field(default_factory=Placement)


class NoiseAction(StrEnum):
    """What a noisy sample becomes: measured again once the host settled (``retry``), kept
    and marked (``keep``), or failed (``fail``)."""

    RETRY = "retry"
    KEEP = "keep"
    FAIL = "fail"


@dataclass(frozen=True)
class QuietWait:
    """Wait until the host's CPU used by others stays under ``bound_cores`` for ``for_s``
    seconds, at most ``timeout_s``."""

    bound_cores: float = 0.5
    for_s: float = 5.0
    timeout_s: float = 60.0


@dataclass(frozen=True)
class NoiseSpec:
    """The noise guard (topology ``noise``). A sample is noisy when the host CPU used by
    everything that is not the testbed's, over its window, is above ``threshold_cores``, or
    (when set) the mean run queue is above ``run_queue``."""

    threshold_cores: float = 0.5
    run_queue: float | None = None
    action: NoiseAction = NoiseAction.RETRY
    #: retries per cell; beyond it a noisy sample is kept, marked
    max_retries: int = 3
    #: before a retry: the host settles (waited for at most its timeout, then retried anyway)
    settle: QuietWait = field(default_factory=lambda: QuietWait(0.5, 2.0, 10.0))
    #: at the run's start, before anything is created; None: no wait. Timeout: exit 3.
    quiet_start: QuietWait | None = None


@dataclass(frozen=True)
class Repetitions:
    warmup: int = 0
    min_samples: int = 1
    max_samples: int = 1
    #: stop early once relative stddev is at or below this (0 disables the rule)
    rsd_target: float = 0.05


@dataclass(frozen=True)
class Variant:
    """An alternative the testbed can switch without rebooting the host (`matrix.variants`):
    None leaves a setting as the testbed's default."""

    name: str
    emulator: str | None = None          # QEMU binary (libvirt <emulator>)
    machine: str | None = None           # machine type: pc, q35, pc-q35-7.2 ...
    image: str | None = None             # guest qcow2 image (its kernel comes with it)
    #: extra virtio-net driver options for the NIC under test: queues, rx_queue_size,
    #: tx_queue_size, event_idx, as sorted (key, value) pairs
    nic: tuple[tuple[str, str], ...] = ()

    def label(self) -> str:
        parts = [f"emulator={self.emulator}" if self.emulator else "",
                 f"machine={self.machine}" if self.machine else "",
                 f"image={self.image}" if self.image else "",
                 *(f"{k}={v}" for k, v in self.nic)]
        return ",".join(p for p in parts if p) or "default"


@dataclass(frozen=True)
class Matrix:
    attachments: tuple[Attachment, ...]
    backends: tuple[Backend, ...]
    mtus: tuple[int, ...]
    connections: tuple[int, ...]
    profiles: tuple[Profile, ...]
    repetitions: Repetitions = field(default_factory=Repetitions)
    randomize: bool = False
    seed: int = 0
    queues: tuple[int, ...] = (1,)
    #: A/B alternatives measured interleaved in one run (empty: no variants axis)
    variants: tuple[Variant, ...] = ()
    #: guest pairs measured at once; the run boots max(pairs) pairs
    pairs: tuple[int, ...] = (1,)


class MacvtapMode(StrEnum):
    """libvirt's <source mode=...> for type='direct' interfaces."""

    BRIDGE = "bridge"
    VEPA = "vepa"
    PASSTHROUGH = "passthrough"

    @property
    def kernel(self) -> str:
        # `ip link ... type macvtap mode X` spells passthrough "passthru"
        return "passthru" if self is MacvtapMode.PASSTHROUGH else self.value


@dataclass(frozen=True)
class MacvtapSpec:
    """How the macvtap attachment reaches the wire."""

    mode: MacvtapMode = MacvtapMode.BRIDGE
    #: lower devices named by the user (passthrough: one per guest); empty: the testbed
    #: creates a tb- veth pair to serve as lower device, and a hairpin bridge for vepa
    lower: tuple[str, ...] = ()


@dataclass(frozen=True)
class Offloads:
    """Requested offload states; None leaves a feature as the driver set it.

    The kernel enforces dependencies, so what was really applied is read back and recorded
    on the Endpoint. Seen here: tx checksumming off takes the TSO sub-features down with it,
    yet ethtool 6.1 still prints ``tcp-segmentation-offload: on`` because Linux 6.18's new
    tx-tcp-accecn-segmentation stays on; asking for ``tso=False`` as well turns them all off."""

    tx: bool | None = None
    tso: bool | None = None
    gso: bool | None = None
    gro: bool | None = None
    lro: bool | None = None

    @classmethod
    def all(cls, on: bool) -> Offloads:
        return cls(**{f.name: on for f in fields(cls)})

    def requested(self) -> list[tuple[str, bool]]:
        return [(f.name, getattr(self, f.name)) for f in fields(self) if getattr(self, f.name) is not None]

    def label(self) -> str:
        req = self.requested()
        return ",".join(f"{k}-{'on' if v else 'off'}" for k, v in req) or "default"


@dataclass(frozen=True)
class HopSpec:
    """Per-hop latency tracing (topology ``hops``; a profile asks for it with ``hops: true``):
    the most tracing may cost in transactions per second before the run says so, and how far
    the hops' medians may fall from the tool's median round trip before the unexplained
    part is called beyond tolerance."""

    overhead_bound: float = 0.05
    closure_tolerance: float = 0.10


@dataclass(frozen=True)
class Topology:
    name: str
    source: str                          # file it came from, or "<builtin>"
    hosts: tuple[HostSpec, ...]
    guests: tuple[GuestSpec, ...]
    client: str                          # guest name that runs the client side
    server: str
    matrix: Matrix
    accelerator: str = "auto"            # auto | kvm | tcg
    #: segment for test traffic; must lie inside 198.18.0.0/15 (RFC 2544 benchmarking)
    subnet: str = "198.18.0.0/24"
    #: how long a guest may take from domain start to ready (agent up, cloud-init final)
    ready_timeout_s: int = 600
    macvtap: MacvtapSpec = field(default_factory=MacvtapSpec)
    #: offloads switched on the endpoints' NICs for the whole run (guest NICs, namespace
    #: veths); None: as the drivers set them
    offloads: Offloads | None = None
    tunnel: TunnelSpec = field(default_factory=TunnelSpec)
    #: host CPUs kept for the harness itself (this process and its children: agents,
    #: collectors, namespace tools; and ovs-vswitchd); empty: not restricted
    harness_cpus: CpuSet = ()
    #: CPUs of ovs-vswitchd's threads (placement.switch: Open vSwitch's userspace datapath
    #: forwards every packet in them); empty: the harness's CPUs when it has some, else free
    switch_cpus: CpuSet = ()
    #: CPUs of the namespace endpoints' tools (placement.endpoints); None: not pinned
    endpoint_pins: EndpointPins | None = None
    #: pins may share CPUs across roles (vCPUs with vCPUs or with other threads, guests with
    #: the harness); off: such an overlap is refused
    allow_overlap: bool = False
    noise: NoiseSpec = field(default_factory=NoiseSpec)
    hops: HopSpec = field(default_factory=HopSpec)

    def guest(self, name: str) -> GuestSpec:
        return next(g for g in self.guests if g.name == name)

    def host_of(self, guest: str) -> HostSpec:
        """The host a guest is placed on."""
        name = self.guest(guest).host
        return next(h for h in self.hosts if h.name == name)


def object_name(run_tag: str, kind: str, *parts: str) -> str:
    """A host object name: tb-<run tag>-<kind><parts>, kept within IFNAMSIZ (15 chars)."""
    name = f"{PREFIX}{run_tag}-{kind}{''.join(parts)}"
    if len(name) > 15:
        raise ValueError(f"object name {name!r} longer than 15 characters")
    return name


def clone_name(base: str, index: int) -> str:
    """Pair ``index``'s (0-based) guest name derived from the topology's ``base`` guest:
    pair 0 is the guest itself, pair i is <base>-p<i+1>, shortened to stay within NAME_RE."""
    if index == 0:
        return base
    suffix = f"-p{index + 1}"
    return base[:10 - len(suffix)].rstrip("-") + suffix
