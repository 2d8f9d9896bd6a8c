"""The host guard (testbed.host.hostwatch) on a remote host, over its executor.

A sample whose path crosses a remote host is judged by what happened there too: its
daemons (OVS for an OVS datapath, libvirt for a guest there: pid and start time from their
pidfiles), the fabric's objects on that host (its bridge, its tunnel device, its
namespaces), its guests (domain still running, no kernel panic on the console), and the
work of others on it (noise: the host's busy cores over the window, less interrupts and
the testbed's own processes there).

Everything about one host is read in one ssh round trip (:class:`Probe`), a shell script
built here with every name quoted; a reading is reused for a fraction of a second, so the
guard's once-a-second checks of daemons, objects and guests cost one login together.
"""
from __future__ import annotations

import contextlib
import shlex
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from testbed.errors import CommandError
from testbed.host import hostwatch

#: a reading younger than this serves every check of one round
MAX_AGE_S = 0.5
#: the testbed's own processes on a remote host, by command name (comm): its guests, its
#: switch, libvirt serving it, the tools, ssh carrying its commands, the kernel's workers
#: for its packets. Their CPU is not noise.
OWN_COMMS = ("qemu-system-x86", "qemu-system-x86_64", "ovs-vswitchd", "ovsdb-server", "libvirtd", "virtqemud",
             "virtlogd", "sshd", "netperf", "netserver", "iperf3", "uperf", "nuttcp", "sockperf", "ksoftirqd",
             "vhost", "ip", "sh", "ovs-vsctl", "tc", "cat", "sed", "grep", "ps", "awk")

_DAEMON_FN = r"""
d() { n=$1; shift
  for f in "$@"; do
    p=$(head -c 20 "$f" 2>/dev/null | tr -dc 0-9)
    [ -n "$p" ] && [ -r "/proc/$p/stat" ] || continue
    echo "daemon $n $p $(sed 's/^.*) //' "/proc/$p/stat" | cut -d' ' -f20) $(cat "/proc/$p/comm")"; return
  done
  echo "daemon $n - - -"; }
o() { if ip link show dev "$1" >/dev/null 2>&1 || [ -e "/run/netns/$1" ]; then echo "object $1 1"; else echo "object $1 0"; fi; }
c() { if [ -r "$2" ] && tail -c "+$(( $3 + 1 ))" "$2" | grep -q 'Kernel panic'; then echo "console $1 1"; else echo "console $1 0"; fi; }
"""
# per process: CPU ticks of its own and of its reaped children (an ssh session's commands
# end up in sshd's), then its command name (which may hold blanks). The files go through cat,
# not to awk by name: on a busy host a process ends between the glob and its read, and
# Debian's awk (mawk) stops at a file it cannot open and exits 2, which failed the whole
# reading (its objects then looked removed and its daemons stopped). cat goes on past it.
_NOISE = r"""
head -1 /proc/stat | sed 's/^/stat /'
sed -n 's/^procs_running /runq /p' /proc/stat
echo "clk $(getconf CLK_TCK)"
echo "boot $(cat /proc/sys/kernel/random/boot_id)"
cat /proc/[0-9]*/stat 2>/dev/null |
awk '{ c = $0; sub(/^[0-9]+ \(/, "", c); sub(/\) [^)]*$/, "", c); t = $0; sub(/^.*\) /, "", t);
       split(t, f, " "); print "own " f[12] + f[13] + f[14] + f[15] " " c }'
echo end
"""


@dataclass(frozen=True)
class Seen:
    name: str
    pid: int | None
    started: float | None


@dataclass
class Reading:
    at: float
    daemons: dict[str, Seen] = field(default_factory=dict)
    objects: dict[str, bool] = field(default_factory=dict)
    consoles: dict[str, bool] = field(default_factory=dict)
    #: /proc/stat's cpu line: (busy, irq+softirq) jiffies; run queue; clock ticks per second
    busy: int | None = None
    kernel: int | None = None
    runq: int | None = None
    clk: int = 100
    #: the host's boot id: the same as this machine's when the "remote" host is this one
    boot: str | None = None
    #: CPU ticks so far of the testbed's own processes there (and their reaped children)
    own_ticks: int = 0
    #: the script ran to its last line (a reading cut short is no reading)
    complete: bool = False

    @property
    def own_s(self) -> float:
        return self.own_ticks / self.clk


def parse(text: str, at: float = 0.0) -> Reading:
    """Pure: the probe's output."""
    r = Reading(at)
    own = 0
    for line in text.splitlines():
        w = line.split()
        if not w:
            continue
        if w[0] == "daemon" and len(w) >= 4:
            ok = w[2].isdigit() and w[3].isdigit()
            r.daemons[w[1]] = Seen(w[1], int(w[2]) if ok else None, float(w[3]) if ok else None)
        elif w[0] == "object" and len(w) == 3:
            r.objects[w[1]] = w[2] == "1"
        elif w[0] == "console" and len(w) == 3:
            r.consoles[w[1]] = w[2] == "1"
        elif w[0] == "stat" and len(w) >= 9 and all(x.isdigit() for x in w[2:9]):
            user, nice, system, idle, iowait, irq, softirq = (int(x) for x in w[2:9])
            steal = int(w[9]) if len(w) > 9 and w[9].isdigit() else 0
            r.busy = user + nice + system + irq + softirq + steal
            r.kernel = irq + softirq
        elif w[0] == "runq" and len(w) == 2 and w[1].isdigit():
            r.runq = int(w[1])
        elif w[0] == "clk" and len(w) == 2 and w[1].isdigit() and int(w[1]) > 0:
            r.clk = int(w[1])
        elif w[0] == "boot" and len(w) == 2:
            r.boot = w[1]
        elif w == ["end"]:
            r.complete = True
        elif w[0] == "own" and len(w) >= 3 and w[1].isdigit() and _own(line.split(" ", 2)[2]):
            own += int(w[1])
    r.own_ticks = own
    return r


def _own(comm: str) -> bool:
    return any(comm == c or comm.startswith(c + "/") or comm.startswith(c + "-") for c in OWN_COMMS)


def _file(path: str) -> str:
    """A pidfile for the script: quoted; one under the host's own OVS run folder expands
    $OVS_RUNDIR there (the rest of the name is the testbed's own)."""
    head = "${OVS_RUNDIR:-/var/run/openvswitch}/"
    if path.startswith(head):
        return f'"{head}"{shlex.quote(path[len(head):])}'
    return shlex.quote(path)


class Probe:
    """One remote host's facts for the guard, read together over its shell."""

    def __init__(self, shell) -> None:
        self.shell = shell
        self.name = shell.host.name
        self.daemons: dict[str, tuple[str, ...]] = {}
        self.objects: set[str] = set()
        self.consoles: dict[str, tuple[str, int]] = {}
        self._last: Reading | None = None
        self._lock = threading.Lock()

    def watch_daemon(self, name: str, pidfiles: Iterable[str]) -> None:
        self.daemons[name] = tuple(pidfiles)

    def script(self) -> str:
        q = shlex.quote
        lines = [_DAEMON_FN]
        lines += [f"d {q(n)} {' '.join(_file(f) for f in files)}" for n, files in sorted(self.daemons.items())]
        lines += [f"o {q(n)}" for n in sorted(self.objects)]
        lines += [f"c {q(n)} {q(path)} {int(off)}" for n, (path, off) in sorted(self.consoles.items())]
        return "\n".join(lines) + _NOISE

    def read(self, max_age: float = MAX_AGE_S) -> Reading:
        with self._lock:
            now = time.monotonic()
            if self._last is not None and now - self._last.at < max_age:
                return self._last
            argv = ["sh", "-c", self.script()]
            out = self.shell.run(argv, timeout=30).stdout
            r = parse(out, time.monotonic())
            if not r.complete:
                raise CommandError(["sh", "-c", "<host probe>"], 0, f"the reading of host {self.name} was cut short",
                                   stdout=out[-500:])
            self._last = r
            return self._last


class RemoteDaemon:
    """hostwatch.Daemon's interface for a daemon on a remote host."""

    def __init__(self, probe: Probe, name: str) -> None:
        self.probe, self.name = probe, name

    def seen(self) -> Seen:
        """As hostwatch.Daemon.seen: what hostwatch.changes compares (name, pid, start)."""
        s = None
        for n in range(hostwatch.LOOK_TRIES):      # a failed login is no stopped daemon: look again
            if n:
                time.sleep(hostwatch.LOOK_PAUSE_S)
            try:
                s = self.probe.read().daemons.get(self.name)
                break
            except CommandError as e:
                if e.timed_out:
                    break
        label = f"{self.name} on host {self.probe.name}"
        return Seen(label, s.pid if s else None, s.started if s else None)


def object_check(probe: Probe, name: str) -> Callable[[], bool]:
    """Whether the object is still on the probe's host. A reading that does not name it
    (cut short) raises: it says nothing about the object, and the guard looks again."""
    probe.objects.add(name)

    def check() -> bool:
        try:
            r = probe.read()
        except CommandError as e:
            raise hostwatch.LookFailed(f"host {probe.name} could not be read: {e}") from e
        if name not in r.objects:
            raise hostwatch.LookFailed(f"the reading of host {probe.name} named no {name}")
        return r.objects[name]
    return check


def guest_check(probe: Probe, g) -> Callable[[], str | None]:
    """Why a guest on a remote host is lost, or None: its domain stopped (asked through its
    host's libvirt), or its console shows a kernel panic (read there)."""
    try:
        start = int(probe.shell.run(["stat", "-c", "%s", str(g.console_log)], timeout=30, check=False).stdout.strip() or 0)
    except (CommandError, ValueError):
        start = 0
    who = g.spec.name
    probe.consoles[who] = (str(g.console_log), start)

    def check() -> str | None:
        with contextlib.suppress(CommandError):
            if probe.read().consoles.get(who):
                return f"guest {who} on host {probe.name} crashed: kernel panic (its console there)"
        return hostwatch.domain_lost(g, f"{who} on host {probe.name}")
    return check


#: pidfiles on a remote host, in its own OVS run folder ($OVS_RUNDIR there, else the default)
def ovs_pidfiles(name: str) -> tuple[str, ...]:
    return (f"${{OVS_RUNDIR:-/var/run/openvswitch}}/{name}.pid",)


LIBVIRT_PIDFILES = {"libvirtd": ("/run/libvirtd.pid", "/var/run/libvirtd.pid"),
                    "virtqemud": ("/run/virtqemud.pid", "/var/run/virtqemud.pid")}


@dataclass
class Noise:
    """Other work on a remote host over one window: busy cores less interrupts and the
    testbed's own processes there, and the run queue at its end."""

    probe: Probe
    start: Reading | None = None

    def begin(self) -> None:
        try:
            self.start = self.probe.read(max_age=0)
        except CommandError:
            self.start = None

    def end(self) -> dict | None:
        if self.start is None or self.start.busy is None:
            return None
        try:
            end = self.probe.read(max_age=0)
        except CommandError:
            return None
        return figure(self.start, end)


def figure(a: Reading, b: Reading) -> dict | None:
    """Pure: other cores on a host between two readings (never below 0)."""
    secs = b.at - a.at
    if secs <= 0 or a.busy is None or b.busy is None or a.kernel is None or b.kernel is None:
        return None
    busy = (b.busy - a.busy) / a.clk / secs
    kernel = (b.kernel - a.kernel) / a.clk / secs
    # the testbed's own processes there (and what they reaped) are not noise; a child
    # reaped in the window brings its whole life's CPU, so noise errs low, never high
    own = max(0.0, b.own_s - a.own_s) / secs
    return {"other_cores": round(max(0.0, busy - kernel - own), 4), "busy_cores": round(busy, 4),
            "own_cores": round(own, 4), "run_queue": b.runq, "window_s": round(secs, 3),
            "this_machine": b.boot is not None and b.boot == local_boot()}


def local_boot() -> str | None:
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip()
    except OSError:
        return None


def less_harness(f: dict, harness_cores: float) -> dict:
    """A remote host that is this machine (a test's loopback host, a fleet's namespace
    targets): the harness here is the testbed's own work there too."""
    if not f.get("this_machine"):
        return f
    return {**f, "other_cores": round(max(0.0, f["other_cores"] - harness_cores), 4)}


def judge(spec, per_host: Mapping[str, dict]) -> str | None:
    """Pure: why the remote hosts made a window noisy (NoiseSpec thresholds), or None."""
    why = []
    for host, f in sorted(per_host.items()):
        if f["other_cores"] > spec.threshold_cores:
            why.append(f"host {host}: {f['other_cores']:.2f} cores used by other work "
                       f"(threshold {spec.threshold_cores:g})")
        if spec.run_queue is not None and f.get("run_queue") is not None and f["run_queue"] > spec.run_queue:
            why.append(f"host {host}: run queue {f['run_queue']} (threshold {spec.run_queue:g})")
    return "; ".join(why) or None


def _exists(check: Callable[[], bool]) -> bool:
    try:
        return check()
    except Exception:          # an ssh failure now: the check during samples will say
        return True


def _remote(g) -> bool:
    sh = getattr(g, "shell", None)
    return sh is not None and sh.remote


def for_path(fabric, endpoints: Sequence[tuple[int, object]], *, guests: bool) -> tuple[tuple, tuple, tuple]:
    """The path guard's (hostwatch.Guard) daemons, objects and guests on the remote hosts a
    path crosses: ``fabric`` (attachments.Fabric) names its objects there
    (``remote_objects``), ``endpoints`` are (endpoint number, measure.Endpoint); each host is
    read in one ssh round trip per check."""
    from testbed.host.net import ovs
    probes: dict[str, Probe] = {}

    def probe(shell) -> Probe:
        return probes.setdefault(shell.host.name, Probe(shell))
    objects: list[tuple[str, Callable[[], bool]]] = []
    for shell, names in getattr(fabric, "remote_objects", lambda: ())():
        p = probe(shell)
        objects += [(f"{n} on host {p.name}", object_check(p, n)) for n in names]
    # only what exists there now (an OVS tunnel port is no device), as still_here does here
    objects = [(what, ok) for what, ok in objects if _exists(ok)]
    far = [ep.guest for _, ep in endpoints if _remote(ep.guest)]
    for g in far:
        probe(g.shell)
    for p in probes.values():
        if ovs.switches(fabric.datapath):
            for n in ("ovsdb-server", "ovs-vswitchd"):
                p.watch_daemon(n, ovs_pidfiles(n))
        if guests and any(g.shell.host.name == p.name for g in far):
            for n, files in LIBVIRT_PIDFILES.items():
                p.watch_daemon(n, files)
    daemons = tuple(RemoteDaemon(p, n) for p in probes.values() for n in p.daemons)
    # a daemon not running there now (libvirtd where virtqemud serves) is not judged by
    daemons = tuple(d for d in daemons if d.seen().pid)
    watched = tuple((g.spec.name, guest_check(probes[g.shell.host.name], g)) for g in far if guests)
    return daemons, tuple(objects), watched
