"""What else happened during a sample's window: where the guests' threads ran, and whether
the host was busy with work that is not the testbed's (the noise guard).

A :class:`Watch` is opened around the window the CPU collectors read (sampling.sample_paths,
one path or N pairs). While it is open, one thread samples every ``SAMPLE_EVERY_S`` (0.5 s; watching two
processes of 19 threads each cost 0.8 % of a core here, measured over 5 s):

- field 39 of /proc/<qemu pid>/task/<tid>/stat (the CPU each QEMU thread last ran on), so
  the CPU each ran on most is known;
- procs_running of /proc/stat (the run queue: tasks runnable at that instant, host-wide).

Around it, the CPU seconds of the harness itself: this process and its children (agents,
namespace tools), with the CPU of children already reaped (cutime/cstime), and the libvirt
daemons that carry its guest-agent calls. The noise figure of a sample is

    other cores = host busy - attributed (QEMU threads, vhost, ovs-vswitchd, ksoftirqd) - harness
                  - irq and softirq (charged to no process; mostly the test traffic's own)

over the window, all from the same readings; above ``NoiseSpec.threshold_cores`` (or a run
queue above ``run_queue``, when set) the sample is noisy.

After the window each guest's threads are read once more (affinity from status, libvirt's
vcpuinfo and vcpu pin info) and checked against the pins the topology asked for
(testbed.host.placement.check): a pin that did not hold fails the sample with both sets.
"""
from __future__ import annotations

import contextlib
import dataclasses
import os
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field

import psutil

from testbed.host import placement, remotewatch
from testbed.measure import cpu
from testbed.topology.model import NoiseAction, NoiseSpec, Placement, QuietWait

SAMPLE_EVERY_S = 0.5
#: processes that serve the harness's own calls (guest agent commands, domain stats)
HARNESS_DAEMONS = ("libvirtd", "virtqemud", "virtlogd")


def parse_procs_running(text: str) -> int | None:
    """Pure: procs_running from /proc/stat."""
    for line in text.splitlines():
        if line.startswith("procs_running "):
            return int(line.split()[1])
    return None


def _times(p: psutil.Process) -> float:
    t = p.cpu_times()
    return t.user + t.system + getattr(t, "children_user", 0.0) + getattr(t, "children_system", 0.0)


_DAEMONS: tuple[float, list[psutil.Process]] = (0.0, [])


def _daemons() -> list[psutil.Process]:
    """The libvirt daemons, looked up once a minute (a scan of every process costs more
    than the rest of a reading)."""
    global _DAEMONS
    at, procs = _DAEMONS
    if time.monotonic() - at > 60 or not all(p.is_running() for p in procs):
        procs = [p for p in psutil.process_iter(["name"]) if (p.info["name"] or "") in HARNESS_DAEMONS]
        _DAEMONS = (time.monotonic(), procs)
    return procs


def harness_seconds() -> float:
    """CPU seconds of the harness so far: this process, its live descendants (each with its
    reaped children), and the libvirt daemons. A child reaped during a window moves its time
    into its parent's children_* fields, so differences over a window stay right."""
    total = 0.0
    me = psutil.Process()
    procs = [me]
    with contextlib.suppress(psutil.Error):
        procs += me.children(recursive=True)
    procs += _daemons()
    seen = set()
    for p in procs:
        if p.pid in seen:
            continue
        seen.add(p.pid)
        with contextlib.suppress(psutil.Error):
            total += _times(p)
    return total


def noise_figure(cpu_info: Mapping, harness_cores: float) -> float:
    """Pure: host cores used by others over the window (never below 0). The host's irq and
    softirq time is left out too: the kernel charges it to no process, and during a sample
    it is mostly the test traffic's own packet processing (a namespace stream spends about
    half a core there), so counting it would call every busy sample noisy."""
    host = cpu_info.get("host") or {}
    busy = float(host.get("busy") or 0.0)
    kernel = float(host.get("softirq") or cpu_info.get("softirq") or 0.0) \
        + float(host.get("irq") or cpu_info.get("irq") or 0.0)
    return round(max(0.0, busy - float(cpu_info.get("attributed") or 0.0) - harness_cores - kernel), 4)


def judge(spec: NoiseSpec, other: float, runq_mean: float | None) -> str | None:
    """Pure: why a window was noisy, or None."""
    why = []
    if other > spec.threshold_cores:
        why.append(f"{other:.2f} cores used by other work (threshold {spec.threshold_cores:g})")
    if spec.run_queue is not None and runq_mean is not None and runq_mean > spec.run_queue:
        why.append(f"run queue {runq_mean:.1f} (threshold {spec.run_queue:g})")
    return "; ".join(why) or None


@dataclass(frozen=True)
class NsEndpoint:
    """A namespace endpoint watched in the window: its namespace, its role (client, server)
    and the CPUs placement.endpoints gives its tools (() when not pinned: recorded only)."""

    netns: str
    role: str
    cpus: tuple[int, ...] = ()


@dataclass
class Observed:
    """One window's observations, filled by Watch.window."""

    started: float = 0.0
    ended: float = 0.0
    harness_s: float = 0.0
    runq: list[int] = field(default_factory=list)
    last_cpu: dict[int, Counter] = field(default_factory=dict)    # tid -> CPU -> count
    samples: int = 0
    #: remote host -> its other work over the window (remotewatch.figure)
    remote: dict[str, dict] = field(default_factory=dict)
    #: namespace endpoint -> tid -> (comm, every allowed CPU set it was seen with)
    ns_seen: dict[str, dict[int, tuple[str, set]]] = field(default_factory=dict)

    def ran_most(self) -> dict[int, int]:
        return {tid: c.most_common(1)[0][0] for tid, c in self.last_cpu.items() if c}


def for_host(noise: NoiseSpec) -> NoiseSpec:
    """The noise guard as this host runs it: beside other shared runs (``--shared-host``)
    the neighbours are expected, and measuring a noisy sample again would meet them again,
    so ``retry`` becomes ``keep`` (the sample is kept and marked); ``fail`` stays."""
    from testbed.host import paths
    if paths.shared_host() and noise.action is NoiseAction.RETRY:
        return dataclasses.replace(noise, action=NoiseAction.KEEP)
    return noise


class Watch:
    """The pins to verify (guest -> Placement) and the noise guard of a run. One per run;
    :meth:`begin_cell` resets the retry budget. ``on_window``: a context manager factory
    called around every window with (cell id, rep, attempt), for tests that need something
    to happen during one (a CPU burner)."""

    def __init__(self, noise: NoiseSpec | None = None, pins: Mapping[str, Placement] | None = None,
                 on_window: Callable[[str, int, int], contextlib.AbstractContextManager] | None = None,
                 remote: Sequence = ()) -> None:
        self.noise = for_host(noise or NoiseSpec(action=NoiseAction.KEEP))
        #: the remote hosts a run's paths cross (remotewatch.Probe): their noise is judged too
        self.remote = tuple(remote)
        self.pins = {g: p for g, p in (pins or {}).items() if p.pinned}
        self.on_window = on_window
        self.retries_left = self.noise.max_retries
        self.attempt = 0

    def begin_cell(self) -> None:
        self.retries_left = self.noise.max_retries
        self.attempt = 0

    @contextlib.contextmanager
    def window(self, qemu_pids: Mapping[str, int], cell_id: str = "", rep: int = 0,
               endpoints: Mapping[str, NsEndpoint] | None = None) -> Iterator[Observed]:
        """``endpoints``: the namespace endpoints whose tools are watched too (label ->
        NsEndpoint): which CPUs each thread was allowed and ran on."""
        obs = Observed()
        stop = threading.Event()
        pids = list(qemu_pids.values())
        inodes = {ino: label for label, e in (endpoints or {}).items()
                  if (ino := placement.netns_inode(e.netns)) is not None}
        obs.ns_seen = {label: {} for label in (endpoints or {})}

        def endpoint_tools() -> None:
            for label, tool_pids in placement.processes_in(inodes).items():
                for pid in tool_pids:
                    for t in placement.tool_threads(pid):
                        comm, allowed = obs.ns_seen[label].setdefault(t.tid, (t.comm, set()))
                        allowed.add(t.allowed)
                        if t.last_cpu is not None:
                            obs.last_cpu.setdefault(t.tid, Counter())[t.last_cpu] += 1

        def sample() -> None:
            while not stop.is_set():
                with contextlib.suppress(OSError, ValueError):
                    with open("/proc/stat") as f:
                        r = parse_procs_running(f.read())
                    if r is not None:
                        obs.runq.append(r)
                for pid in pids:
                    for owner, tid in [(pid, t) for t in _tids(pid)] + [(k, k) for k in _vhost(pid)]:
                        with contextlib.suppress(OSError, ValueError, IndexError):
                            with open(f"/proc/{owner}/task/{tid}/stat") as f:
                                c = placement.parse_stat_cpu(f.read())
                            obs.last_cpu.setdefault(tid, Counter())[c] += 1
                if inodes:
                    with contextlib.suppress(OSError):
                        endpoint_tools()
                obs.samples += 1
                stop.wait(SAMPLE_EVERY_S)

        hook = self.on_window(cell_id, rep, self.attempt) if self.on_window else contextlib.nullcontext()
        far = [remotewatch.Noise(p) for p in self.remote]
        for n in far:
            n.begin()
        h0 = harness_seconds()
        obs.started = time.monotonic()
        th = threading.Thread(target=sample, name="tb-window", daemon=True)
        th.start()
        try:
            with hook:
                yield obs
        finally:
            stop.set()
            th.join(timeout=5)
            obs.ended = time.monotonic()
            obs.harness_s = harness_seconds() - h0
            obs.remote = {n.probe.name: f for n in far if (f := n.end()) is not None}

    def verdict(self, obs: Observed, cpu_info: Mapping, qemu_pids: Mapping[str, int],
                domains: Mapping[str, object],
                endpoints: Mapping[str, NsEndpoint] | None = None) -> tuple[dict, str | None, str | None]:
        """(extra entries for the sample, why a pin did not hold or None, why the window was
        noisy or None). The window's length is the CPU record's, so the harness's share is
        divided by the same seconds as the host's busy time."""
        secs = float(cpu_info.get("window_s") or (obs.ended - obs.started) or 1.0)
        harness = round(obs.harness_s / secs, 4) if secs > 0 else 0.0
        other = noise_figure(cpu_info, harness)
        runq_mean = round(sum(obs.runq) / len(obs.runq), 2) if obs.runq else None
        far = {h: remotewatch.less_harness(f, harness) for h, f in obs.remote.items()}
        noisy = "; ".join(x for x in (judge(self.noise, other, runq_mean),
                                      remotewatch.judge(self.noise, far)) if x) or None
        extra: dict = {"noise": {"other_cores": other, "harness_cores": harness,
                                 "run_queue_mean": runq_mean, "run_queue_max": max(obs.runq) if obs.runq else None,
                                 "threshold_cores": self.noise.threshold_cores, "run_queue_threshold":
                                     self.noise.run_queue, "noisy": bool(noisy), "attempt": self.attempt}}
        if far:
            extra["noise"]["remote"] = far
        recs, bad = {}, []
        ran = obs.ran_most()
        for g, pid in qemu_pids.items():
            ts = placement.threads(pid)
            pins, on, why = placement.libvirt_vcpus(domains[g]) if g in domains else ({}, {}, "no domain")
            req = self.pins.get(g)
            recs[g] = {"requested": req.label() if req else None, "threads": placement.record(ts, ran),
                       "libvirt": {"vcpu_pins": {str(k): placement.cpulist(v) for k, v in pins.items()},
                                   "vcpu_cpu": {str(k): v for k, v in on.items()}, "error": why},
                       "window_samples": obs.samples}
            if req:
                reasons = placement.check(g, req, ts, ran, pins)
                recs[g]["held"] = not reasons
                bad += reasons
        if recs:
            extra["placement"] = recs
        ends = {}
        for label, e in (endpoints or {}).items():
            seen = {tid: (comm, frozenset(allowed)) for tid, (comm, allowed) in obs.ns_seen.get(label, {}).items()}
            ends[label] = {"netns": e.netns, "role": e.role, "requested": placement.cpulist(e.cpus) if e.cpus else None,
                           "threads": [{"tid": tid, "comm": comm, "allowed": sorted(placement.cpulist(a) for a in al),
                                        "ran_most_on": ran.get(tid)} for tid, (comm, al) in sorted(seen.items())],
                           "window_samples": obs.samples}
            if e.cpus:
                # no tool seen (a window shorter than one observation): not verified, said so
                reasons = placement.check_endpoint(label, e.role, e.cpus, seen, ran)
                ends[label]["held"] = not reasons if seen else None
                bad += reasons
        if ends:
            extra["endpoint_placement"] = ends
        return extra, ("; ".join(bad) or None), noisy

    def settle(self, qemu_pids: Mapping[str, int]) -> dict:
        """Before a retry: spend one of the cell's retries and wait for the host to settle."""
        self.retries_left -= 1
        self.attempt += 1
        return wait_quiet(self.noise.settle, qemu_pids)

    def action_for(self, noisy: str | None) -> str | None:
        """What a noisy sample becomes now: 'retry' while the budget lasts, else 'keep'
        (marked); 'fail' or 'keep' when the topology says so. None: not noisy."""
        if not noisy:
            return None
        if self.noise.action is NoiseAction.RETRY:
            return "retry" if self.retries_left > 0 else "keep"
        return self.noise.action.value


def _tids(pid: int) -> list[int]:
    try:
        return [int(t) for t in os.listdir(f"/proc/{pid}/task")]
    except OSError:
        return []


_VHOST: dict[int, tuple[float, list[int]]] = {}


def _vhost(pid: int) -> list[int]:
    """vhost kernel threads of a QEMU, looked up once a few seconds (a scan of /proc)."""
    now = time.monotonic()
    hit = _VHOST.get(pid)
    if hit is None or now - hit[0] > 5:
        hit = _VHOST[pid] = (now, placement.vhost_kthreads(pid))
    return hit[1]


def other_cores_now(qemu_pids: Mapping[str, int], seconds: float = 1.0) -> float:
    """Host cores used by others over ``seconds`` from now (guests idle or not: their
    QEMU threads are the testbed's)."""
    h0, b0 = cpu.host_reading(qemu_pids), harness_seconds()
    time.sleep(seconds)
    h1, b1 = cpu.host_reading(qemu_pids), harness_seconds()
    d = cpu.host_delta(h0, h1)
    return noise_figure(d, (b1 - b0) / d["window_s"] if d["window_s"] else 0.0)


def wait_quiet(q: QuietWait, qemu_pids: Mapping[str, int] | None = None,
               progress: Callable[[str], None] = lambda s: None) -> dict:
    """Wait until other cores stay under ``q.bound_cores`` for ``q.for_s`` in a row, or
    ``q.timeout_s`` passed. Returns {quiet, waited_s, last_other_cores}."""
    start = time.monotonic()
    quiet_since: float | None = None
    last = None
    while True:
        last = other_cores_now(qemu_pids or {}, 1.0)
        now = time.monotonic()
        if last <= q.bound_cores:
            quiet_since = quiet_since if quiet_since is not None else now - 1.0
            if now - quiet_since >= q.for_s:
                return {"quiet": True, "waited_s": round(now - start, 1), "last_other_cores": last}
        else:
            quiet_since = None
        if now - start >= q.timeout_s:
            return {"quiet": False, "waited_s": round(now - start, 1), "last_other_cores": last}
        progress(f"waiting for a quiet host: {last:.2f} cores used by others (bound {q.bound_cores:g})")
