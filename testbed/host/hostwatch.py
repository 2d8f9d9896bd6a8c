"""What the host did to a sample from outside: daemons that restarted, objects that went
missing, and wire counters that stopped in the middle of a stream.

A figure measured while ovs-vswitchd restarted looks fine: the tool and the device counters
lose the same seconds, so the wire cross-check agrees. The error messages do not tell either
(a restarted switch returns no error to the tool). So every sample of a guarded path
(measure.TestPath.guard) is judged from three readings of its own:

- the daemons that forward or serve it (ovs-vswitchd and ovsdb-server for an OVS datapath,
  libvirtd or virtqemud for guests): pid and start time before and after the window, from
  their pidfiles; a change fails the sample naming the daemon and both pids;
- the segment's objects (its namespaces and root-namespace devices, and the endpoints'
  devices under test): checked before the sample and after it; one missing fails the sample
  naming it;
- the byte counters of the devices under test, read every ``INTERVAL_S`` through the window:
  a stretch of at least ``MIN_GAP_S`` with no byte on them, with traffic before and after it,
  fails the sample with its time and length. It catches a link flap or a stall that no
  daemon reports. A silence that begins within the tool's own pause at its start
  (``ToolDriver.quiet_start_s``: sockperf sleeps after its warm-up messages) is not one,
  nor is a quiet end followed only by the kernel's few frames (``MIN_AFTER_BYTES``). A
  silence after traffic that lasts ``STALL_STOP_S`` while the tools still run stops them
  there (the sample has failed whatever comes next).

A daemon or object fault also marks the guard ``fault``: the runner then waits (at most
``COMEBACK_S``) for the daemons to come back, and builds the segment again for the next
cell; a daemon that does not come back stops the run (:class:`DaemonLost`, exit status 4),
its finished samples kept for `--resume`.
"""
from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from testbed.errors import TestbedError
from testbed.host import proc

#: how often the counters are read through a window (a netlink dump of two devices costs a
#: fraction of a millisecond)
INTERVAL_S = 0.25
#: the shortest silence counted as a gap: a 1 s link flap stalls TCP for longer (its
#: retransmission timer backs off), and no stream here idles for this long on its own
MIN_GAP_S = 0.75
#: what must cross the devices after a silence, to the window's end, for it to be a gap and
#: not a quiet end: a UDP request/response leaves the sender's neighbour entry unconfirmed,
#: so the kernel probes it (a unicast ARP request and its reply, about 120 bytes on the two
#: devices) some 5 s after the tool's last frame, and at the end of a 60 s sockperf run
#: (which spends seconds writing its full log before it exits) that probe made the quiet
#: end a 2-4 s "stall" with traffic on both sides. 4 KiB is some 70 minimum-size frames:
#: any tool that resumes after a real stall sends more before the window ends.
MIN_AFTER_BYTES = 4096
#: the same for guests: a TCG guest on a loaded 2-core host can go a second without running
#: its vCPU thread, which is the host's noise (the noise guard's business), not a stall
MIN_GAP_GUEST_S = 2.0
#: a silence this long on the devices under test, with traffic before it and none since,
#: while the tools still run, stops the sample there (SampleWatch.stop): such a sample fails
#: whatever comes next (a gap if traffic resumes, the tool's timeout if not), and a TCG
#: guest's NIC that stopped receiving otherwise held its tool until the timeout, a minute on
#: for a 3 s stream. Far above any pause of a stream that works (MIN_GAP_GUEST_S).
STALL_STOP_S = 10.0
#: how long the run waits for a daemon that stopped or restarted to answer again
COMEBACK_S = 60.0
#: how often a sample's daemons, objects and guests are checked while its tools run: a fault
#: stops the wait for the tools then (SampleWatch.stop), instead of at their timeout, a
#: minute or more later (the checks are pidfile reads, a link lookup or two, a console read)
CHECK_EVERY_S = 1.0

LIBVIRT_PIDFILES = {"libvirtd": ("/run/libvirtd.pid", "/var/run/libvirtd.pid"),
                    "virtqemud": ("/run/virtqemud.pid", "/var/run/virtqemud.pid")}


class DaemonLost(TestbedError):
    """A daemon the run depends on stopped and did not come back in time: the run stops,
    its finished cells kept, and `--resume` goes on once the daemon runs again."""

    exit_status = 4


@dataclass(frozen=True)
class Seen:
    """One daemon as found at one instant: its pid and start time (None: not running)."""

    name: str
    pid: int | None
    started: float | None


@dataclass(frozen=True)
class Daemon:
    """A daemon to watch, found through its pidfiles (the host's own: a private instance of
    another session has other pidfiles and is never mistaken for it)."""

    name: str
    pidfiles: tuple[str, ...]

    def seen(self) -> Seen:
        for f in self.pidfiles:
            try:
                pid = int(Path(f).read_text().split()[0])
                p = psutil.Process(pid)
                # a stale pidfile whose pid was reused by something else is no daemon
                if p.name() != self.name[:15] and not p.name().startswith(self.name[:15]):
                    continue
                return Seen(self.name, pid, p.create_time())
            except (OSError, ValueError, IndexError, psutil.Error):
                continue
        return Seen(self.name, None, None)


def ovs_daemons(rundir: str | os.PathLike | None = None) -> tuple[Daemon, ...]:
    from testbed.host.net import ovsd
    # $OVS_RUNDIR, as OVS's own tools read it: a host whose switch runs elsewhere says so there
    d = Path(rundir) if rundir else Path(os.environ.get("OVS_RUNDIR") or ovsd.RUNDIR)
    return tuple(Daemon(n, (str(d / f"{n}.pid"),)) for n in ("ovsdb-server", "ovs-vswitchd"))


def libvirt_daemons() -> tuple[Daemon, ...]:
    """The libvirt daemon that serves qemu:///system here: libvirtd, or the modular
    virtqemud (whichever has a pidfile naming a live process)."""
    found = tuple(Daemon(n, f) for n, f in LIBVIRT_PIDFILES.items())
    return tuple(d for d in found if d.seen().pid) or found[:1]


def changes(before: Sequence[Seen], after: Sequence[Seen]) -> list[str]:
    """Pure: what happened to each daemon between two readings, in words."""
    now = {s.name: s for s in after}
    out = []
    for b in before:
        a = now.get(b.name)
        if a is None:
            continue
        if b.pid is None and a.pid is None:
            out.append(f"{b.name} was not running during the sample")
        elif b.pid is not None and a.pid is None:
            out.append(f"{b.name} stopped during the sample (pid {b.pid} gone)")
        elif b.pid is None:
            out.append(f"{b.name} started during the sample (pid {a.pid})")
        elif (a.pid, a.started) != (b.pid, b.started):
            out.append(f"{b.name} restarted during the sample (pid {b.pid} -> {a.pid})")
    return out


@dataclass(frozen=True)
class Gap:
    at_s: float           # from the first reading of the window
    length_s: float


def gaps(readings: Sequence[tuple[float, int]], min_gap_s: float = MIN_GAP_S,
         min_after_bytes: int = MIN_AFTER_BYTES) -> list[Gap]:
    """Pure: stretches with no byte counted between two readings that did count bytes,
    lasting at least ``min_gap_s``. ``readings``: (monotonic time, cumulative bytes). A quiet
    start or end (connection set-up, the tool winding down) is not a gap: traffic must be
    seen on both sides of it, and after it at least ``min_after_bytes`` to the window's end
    (a few frames after a quiet end are the kernel's, not traffic: MIN_AFTER_BYTES)."""
    out = []
    if len(readings) < 3:
        return out
    t0, end_bytes = readings[0][0], readings[-1][1]
    last_moving: float | None = None      # when bytes were last seen to move
    for (ta, ba), (tb, bb) in zip(readings, readings[1:]):
        if bb != ba:
            if last_moving is not None and ta - last_moving >= min_gap_s and end_bytes - ba >= min_after_bytes:
                out.append(Gap(round(last_moving - t0, 2), round(ta - last_moving, 2)))
            last_moving = tb
    return out


def ongoing_gap(readings: Sequence[tuple[float, int]], stall_s: float = STALL_STOP_S,
                since: float | None = None) -> Gap | None:
    """Pure: the silence at the end of ``readings`` (no byte since the last reading that
    counted some), when traffic was seen before it and it has lasted at least ``stall_s``.
    ``since``: only bytes counted from then on are traffic. Times are from the first reading,
    as :func:`gaps` gives them."""
    if len(readings) < 2:
        return None
    last_moving: float | None = None
    for (ta, ba), (tb, bb) in zip(readings, readings[1:]):
        if bb != ba and (since is None or ta >= since):
            last_moving = tb
    now = readings[-1][0]
    if last_moving is None or now - last_moving < stall_s:
        return None
    return Gap(round(last_moving - readings[0][0], 2), round(now - last_moving, 2))


class Sampler:
    """A thread reading cumulative bytes every ``interval`` s until stopped."""

    def __init__(self, read: Callable[[], int], interval: float = INTERVAL_S) -> None:
        self.read, self.interval = read, interval
        self.readings: list[tuple[float, int]] = []
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="tb-counter-sampler", daemon=True)

    def _run(self) -> None:
        nxt = time.monotonic()
        while not self._stop.is_set():
            try:
                self.readings.append((time.monotonic(), self.read()))
            except Exception as e:      # a device gone mid-window: the object check names it
                self.errors.append(str(e))
            nxt += self.interval
            self._stop.wait(max(0.0, nxt - time.monotonic()))

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        with contextlib.suppress(Exception):
            self.readings.append((time.monotonic(), self.read()))


@dataclass
class SampleWatch:
    """One sample's watch: ``reason`` once finished (None: nothing happened)."""

    guard: Guard
    before: list[Seen]
    sampler: Sampler | None
    reason: str | None = None
    done: bool = False
    #: set (with why) as soon as a check during the window finds a fault: the sample has
    #: failed already, so whoever waits for its tools may stop them
    stop: proc.Stop = field(default_factory=proc.Stop)
    #: when the tools were started (monotonic): only bytes counted from then on are traffic
    #: for the stall stop (a stray frame before a slow start is no traffic of theirs)
    tools_from: float | None = None
    #: a silence beginning before this (monotonic) is the tool's own pause at its start
    #: (ToolDriver.quiet_start_s), not a gap
    quiet_until: float | None = None
    _over: threading.Event = field(default_factory=threading.Event)
    _checker: threading.Thread | None = None

    def start(self, every_s: float = CHECK_EVERY_S) -> None:
        self._checker = threading.Thread(target=self._check, args=(every_s,), name="tb-host-check", daemon=True)
        self._checker.start()

    def _check(self, every_s: float) -> None:
        while not self._over.wait(every_s):
            try:
                why = changes(self.before, [d.seen() for d in self.guard.daemons]) + self.guard.missing()
            except Exception:       # judged again, in full, by finish
                continue
            if why:
                self.stop.stop("; ".join(why))
                return
            if self.sampler is None or self.tools_from is None:
                continue
            stall_s = self.guard.stall_stop_s if self.guard.stall_stop_s is not None else STALL_STOP_S
            g = ongoing_gap(list(self.sampler.readings), stall_s, since=self.tools_from)
            if g is not None:
                self.stop.stop(f"wire counters stopped for {g.length_s:.2f} s at {g.at_s:.2f} s into the window "
                               f"and had not resumed (no byte on {self.guard.device_list()} while the tools "
                               f"ran: a stall)")
                return

    def finish(self) -> str | None:
        """Stop the counter and check threads and judge the sample (idempotent)."""
        if self.done:
            return self.reason
        self.done = True
        self._over.set()
        if self._checker is not None:
            self._checker.join(timeout=30)
        if self.sampler is not None:
            self.sampler.__exit__(None, None, None)
        why = changes(self.before, [d.seen() for d in self.guard.daemons])
        missing = self.guard.missing()
        if why or missing:
            self.guard.fault = "; ".join([*why, *missing])
        if self.sampler is not None and not missing:
            t0 = self.sampler.readings[0][0] if self.sampler.readings else 0.0
            for g in gaps(self.sampler.readings, self.guard.min_gap_s):
                if self.quiet_until is not None and t0 + g.at_s < self.quiet_until:
                    continue
                why.append(f"wire counters stopped for {g.length_s:.2f} s at {g.at_s:.2f} s into the window "
                           f"(no byte on {self.guard.device_list()} "
                           f"between traffic before and after: a link flap or a stall)")
        self.reason = "; ".join([*why, *missing]) or None
        return self.reason


#: a look at an object that failed (an ssh login refused or cut short on a busy host, not
#: an answer "it is not there") is taken again this many times, this far apart
LOOK_TRIES = 3
LOOK_PAUSE_S = 0.6
#: how long a missing device waits for a watched guest's domain to read as stopped (libvirt
#: marks it a moment after QEMU has closed the guest's taps)
GUEST_SETTLE_S = 3.0


class LookFailed(TestbedError):
    """An object's check could not look (the far host's reading failed): it says nothing
    of the object. Any other error of a check means the object is not there (a local
    device's counters that cannot be read: it is gone)."""


def _look_for(what: str, exists: Callable[[], bool]) -> str | None:
    """Why the object fails the sample, or None: it is gone, or it could not be looked at
    after LOOK_TRIES tries. A look that failed is never called a removal."""
    error = ""
    for n in range(LOOK_TRIES):
        if n:
            time.sleep(LOOK_PAUSE_S)
        try:
            ok = exists()
        except LookFailed as e:
            error = str(e).splitlines()[0] if str(e) else type(e).__name__
            continue
        except Exception:               # noqa: BLE001 - the check's own way to say "not there"
            ok = False
        return None if ok else f"{what} went missing (removed from outside the run)"
    return f"{what} could not be checked ({LOOK_TRIES} looks failed: {error})"


@dataclass
class Guard:
    """What one test path is watched for (see the module's doc). ``objects``: (what, exists)
    pairs; ``read_bytes``: cumulative bytes on the devices under test (None: no gap check)."""

    daemons: tuple[Daemon, ...] = ()
    objects: tuple[tuple[str, Callable[[], bool]], ...] = ()
    read_bytes: Callable[[], int] | None = None
    devices: tuple[str, ...] = ()
    min_gap_s: float = MIN_GAP_S
    interval_s: float = INTERVAL_S
    #: None: STALL_STOP_S, read when the sample is checked
    stall_stop_s: float | None = None
    #: set when a sample saw a daemon change or a missing object: the segment is to be rebuilt
    fault: str | None = None
    #: the daemons as first seen (what they must come back to)
    baseline: list[Seen] = field(default_factory=list)
    #: guest name -> why it is lost or None (guest_check)
    guests: tuple[tuple[str, Callable[[], str | None]], ...] = ()
    #: guests found lost by a sample: name -> reason (the runner brings them back)
    lost: dict[str, str] = field(default_factory=dict)

    def device_list(self) -> str:
        return ", ".join(self.devices) or "the devices under test"

    def _lost_guests(self) -> list[str]:
        out = []
        for name, check in self.guests:
            why = check()
            if why:
                self.lost[name] = why
                out.append(why)
        return out

    def missing(self) -> list[str]:
        out = self._lost_guests()
        if out:
            return out          # a lost guest takes its NIC with it: that says enough
        for what, exists in self.objects:
            why = _look_for(what, exists)
            if why:
                out.append(why)
        if out and self.guests:
            # A guest destroyed between the two looks took its NIC: the guest is the cause.
            # QEMU closes its taps as it dies, before libvirt has read the monitor's EOF and
            # marked the domain stopped, so the device can be gone while the domain still
            # reads as running: give the domain's state a moment to settle before blaming
            # the device.
            deadline = time.monotonic() + GUEST_SETTLE_S
            while True:
                lost = self._lost_guests()
                if lost:
                    return lost
                if time.monotonic() >= deadline:
                    break
                time.sleep(LOOK_PAUSE_S / 3)
        return out

    @contextlib.contextmanager
    def sample(self, gap_check: bool = True) -> Iterator[SampleWatch]:
        before = [d.seen() for d in self.daemons]
        if not self.baseline:
            self.baseline = before
        sampler = Sampler(self.read_bytes, self.interval_s) if (gap_check and self.read_bytes) else None
        sw = SampleWatch(self, before, sampler)
        if sampler is not None:
            sampler.__enter__()
        sw.start()
        try:
            yield sw
        finally:
            sw.finish()

    def wait_back(self, timeout_s: float = COMEBACK_S, progress: Callable[[str], None] = lambda s: None,
                  answers: Callable[[], bool] | None = None) -> list[Seen]:
        """Wait for every watched daemon to run again (and ``answers`` to hold: the daemon
        serves requests, not only exists), at most ``timeout_s``. Raises DaemonLost."""
        deadline = time.monotonic() + timeout_s
        progress(f"waiting up to {timeout_s:.0f} s for {', '.join(d.name for d in self.daemons) or 'the host'} "
                 f"after: {self.fault}")
        while True:
            seen = [d.seen() for d in self.daemons]
            down = [s.name for s in seen if s.pid is None]
            if not down and (answers is None or answers()):
                self.fault = None
                return seen
            if time.monotonic() > deadline:
                raise DaemonLost(f"{', '.join(down) or 'a daemon'} did not come back within {timeout_s:.0f} s "
                                 f"(after: {self.fault}); the run stopped, its finished cells kept: once it "
                                 f"runs again, go on with `testbed run TOPOLOGY --resume RUN`")
            time.sleep(0.5)


def answers(daemons: Sequence[Daemon], uri: str = "qemu:///system") -> Callable[[], bool]:
    """Whether the watched daemons serve requests again, not only run: OVS answers on its
    database and its switch on its control socket; libvirt accepts a connection."""
    names = {d.name for d in daemons}

    def check() -> bool:
        if names & {"ovsdb-server", "ovs-vswitchd"}:
            from testbed.host.net import ovsd
            if not (ovsd._answers(ovsd.default_db(), 2) and ovsd._vswitchd_alive(ovsd.default_db(), ovsd.RUNDIR)):
                return False
        if names & set(LIBVIRT_PIDFILES):
            import libvirt
            try:
                libvirt.open(uri).close()
            except libvirt.libvirtError:
                return False
        return True
    return check


def reconnect(guests: Sequence, uri: str) -> None:
    """Guests' domain handles taken again on a new libvirt connection (a restarted daemon
    drops every client connection; the domains themselves keep running)."""
    import libvirt
    conn = libvirt.open(uri)
    for g in guests:
        if getattr(g, "shell", None) is None:
            g.dom = conn.lookupByName(g.name)


#: guests a run may lose (crash, destroyed from outside) and bring back before it stops
MAX_GUEST_LOSSES = 2


class GuestsLost(TestbedError):
    """More guests were lost than a run brings back: it stops, finished cells kept."""

    exit_status = 4


def _console_lines(g, since: int, n: int = 6) -> tuple[str, list[str]]:
    """(everything the console printed since byte ``since``, its last ``n`` non-empty lines)."""
    text = g.console_since(since)
    return text, [x.strip() for x in text.splitlines() if x.strip()][-n:]


def guest_check(g) -> Callable[[], str | None]:
    """Why guest ``g`` (virt.Guest on this host) is lost, or None: its domain stopped (a
    `virsh destroy` from outside), or its kernel panicked (the console says so; the domain
    of a panicked guest keeps running, hung)."""
    try:
        start = os.path.getsize(g.console_log)
    except OSError:
        start = 0
    who = g.spec.name if getattr(g, "spec", None) is not None else g.name

    def check() -> str | None:
        text, tail = _console_lines(g, start, 4)
        if "Kernel panic" in text:
            # the panic's own line first (the register dump after it says less)
            first = next((x.strip() for x in text.splitlines() if "Kernel panic" in x), "")
            shown = [first, *(x for x in tail if x != first)]
            return f"guest {who} crashed: kernel panic; last console lines: {' | '.join(shown)}"
        lines = f"; last console lines: {' | '.join(tail)}" if tail else ""
        return domain_lost(g, who, lines)
    return check


def domain_lost(g, who: str, lines: str = "") -> str | None:
    """Why guest ``who``'s domain (``g.dom``, on whichever host's libvirt) no longer runs,
    or None; ``lines`` ends the reason (the console's last lines)."""
    import libvirt
    try:
        if not g.dom.isActive():
            return f"guest {who} stopped from outside (domain {g.name} is not running){lines}"
    except libvirt.libvirtError as e:
        if e.get_error_code() == libvirt.VIR_ERR_NO_DOMAIN:
            # a transient domain destroyed (`virsh destroy`) is gone, not stopped
            return f"guest {who} stopped from outside (domain {g.name} is gone){lines}"
        return f"guest {who}: its domain cannot be asked ({e.get_error_message()}){lines}"
    return None


__all__ = ["GuestsLost", "MAX_GUEST_LOSSES", "guest_check", "domain_lost", "DaemonLost", "answers", "reconnect", "Daemon", "Gap", "Guard", "Sampler", "Seen", "changes", "gaps",
           "libvirt_daemons", "ovs_daemons"]
