"""Find and remove tb- objects, and only those: domains, links, namespaces, OVS bridges,
per-run state. Used by `testbed cleanup` after a dead run, and by the leftovers check a
new run makes before it starts.

Every object name carries its run's tag (tb-<tag>-...). A live run registers its tag in
its state folder (tb-<tag>/owner.json with its pid), so the objects of a run that is still
going are never mistaken for leftovers, and cleanup never pulls the rug from under it.
"""
from __future__ import annotations

import contextlib
import dataclasses
import errno
import fcntl
import json
import logging
import os
import re
import shutil
import signal
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from pyroute2 import IPRoute

from testbed import PREFIX
from testbed.errors import CommandError, LeftoversError, TestbedError
from testbed.guests import guestcache, images
from testbed.guests.lazy import libvirt
from testbed.host import paths, proc, shareduse
from testbed.host.net import links, ops

log = logging.getLogger(__name__)


@dataclass
class Leftovers:
    domains: list[str] = field(default_factory=list)
    links: list[str] = field(default_factory=list)
    netns: list[str] = field(default_factory=list)
    state: list[str] = field(default_factory=list)
    #: guest snapshots whose writer died half-way (tb-snap-* in the cache); finished
    #: snapshots and images are never cleanup's business (`testbed cache prune`)
    partial_snapshots: list[str] = field(default_factory=list)
    #: image builds whose builder died half-way (tb-build-* beside the cached images)
    partial_builds: list[str] = field(default_factory=list)
    #: objects of the kinds the modes make (attachments Mode.object_kinds), by kind name
    objects: dict[str, list[str]] = field(default_factory=dict)
    #: libvirt's logs of tb- domains (paths.QEMU_LOG_DIR), which libvirt keeps after the domain
    domain_logs: list[str] = field(default_factory=list)

    def kinds(self) -> dict[str, list[str]]:
        """Every kind with its names, the modes' own kinds among them (ovs_bridges, ...)."""
        return {"domains": self.domains, "links": self.links, "netns": self.netns, **self.objects,
                "state": self.state, "partial_snapshots": self.partial_snapshots,
                "partial_builds": self.partial_builds, "domain_logs": self.domain_logs}

    def empty(self) -> bool:
        return not any(self.kinds().values())

    def describe(self) -> str:
        parts = [f"{k}: {', '.join(v)}" for k, v in self.kinds().items() if v]
        return "; ".join(parts) or "none"


def _object_kinds() -> list:
    """The kinds of object the registered modes make, each once (by name)."""
    from testbed import attachments
    found: dict = {}
    for m in attachments.modes():
        for k in m.object_kinds:
            found.setdefault(k.name, k)
    return list(found.values())


def _remove_objects(shell, found: Leftovers) -> None:
    for k in _object_kinds():
        for name in found.objects.get(k.name, ()):
            with contextlib.suppress(CommandError):
                k.delete(shell, name)


def _domains(uri: str) -> list[str]:
    try:
        conn = libvirt.open(uri)
    except libvirt.libvirtError:
        return []
    try:
        return sorted(d.name() for d in conn.listAllDomains() if d.name().startswith(PREFIX))
    finally:
        conn.close()


TAG_RE = re.compile(rf"^{PREFIX}([0-9a-f]{{4}})(-|$)")
#: a capability probe's scratch namespace (testbed.admin.capabilities), owned by the pid it names
PROBE_RE = re.compile(rf"^{PREFIX}probe-(\d+)(?![0-9])")


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _owners() -> Iterator[tuple[str, int, dict]]:
    """(tag, pid, owner.json) of every registered state folder whose owner file reads."""
    state = paths.state_dir()
    for owner in sorted(state.glob(f"{PREFIX}*/owner.json")) if state.is_dir() else ():
        try:
            info = json.loads(owner.read_text())
            yield owner.parent.name[len(PREFIX):], int(info.get("pid", 0)), info
        except (OSError, ValueError, TypeError, AttributeError):
            continue


def live_tags(foreign: bool = False) -> set[str]:
    """Tags of runs whose owning process is still alive; ``foreign``: only those another
    process owns (runs and test sessions beside this one)."""
    return {tag for tag, pid, _ in _owners() if _pid_alive(pid) and not (foreign and pid == os.getpid())}


def _owned(name: str, live: set[str]) -> bool:
    """Whether a tb- name belongs to a live tag, or is a capability probe whose process lives
    (a probe lives for milliseconds: only its process's death makes it a leftover)."""
    m, p = TAG_RE.match(name), PROBE_RE.match(name)
    return bool((m and m.group(1) in live) or (p and _pid_alive(int(p.group(1)))))


_NAME_RE = re.compile(rf"{PREFIX}[A-Za-z0-9_.-]+")
#: Open vSwitch's own datapath devices: ovs-vswitchd makes one with the first bridge of its
#: datapath and removes it with the last, whichever run's bridges those are
_DATAPATH_RE = re.compile(r"\bovs-(?:netdev|system)\b")


def _only_others(line: str, others: set[str]) -> bool:
    """Whether every tb- name on a line belongs to another live run (by tag) or to a live
    capability probe, or the line is about OVS's datapath device while other runs go on;
    False for a line without one."""
    names = _NAME_RE.findall(line)
    if not names:
        return bool(others) and bool(_DATAPATH_RE.search(line))
    return all(_owned(n, others) for n in names)


@dataclass(frozen=True)
class Baseline:
    """Host networking now, to say later what this process changed on the host while other
    runs (other processes' live tags) create and remove their own objects beside it.

    A line of the difference is left out when every tb- name on it belongs to a run another
    process owned at the start or owns at the end; everything else is this process's doing
    (or a leak, whose tag is dead by then), and so is any change to the host's own objects."""

    snapshot: object
    others: frozenset[str]

    @classmethod
    def take(cls) -> Baseline:
        from testbed.host import snapshot
        others = frozenset(live_tags(foreign=True))
        return cls(snapshot.take(), others)

    def changes(self) -> list[str]:
        from testbed.host import snapshot
        after = snapshot.take()
        others = set(self.others) | live_tags(foreign=True)
        return [line for line in snapshot.diff(self.snapshot, after)  # type: ignore[arg-type]
                if not _only_others(line, others)]


def _dead(names: list[str], live: set[str]) -> list[str]:
    out = []
    for n in names:
        if not n or not n.startswith(PREFIX):
            continue
        if not _owned(n, live):
            out.append(n)
    return sorted(out)


def find(uri: str = "qemu:///system", include_live: bool = False) -> Leftovers:
    """tb- objects on this host; those of live runs are left out unless include_live."""
    # Everything is listed before the live tags are read: a process registers its tag before
    # it makes an object, so every object listed has its owner registered by then (read the
    # other way round, a run starting in between would have its first objects taken for a
    # dead run's).
    with IPRoute() as ipr:
        names = [l.get("ifname") for l in ipr.get_links()]
    netns_dir = Path("/run/netns")
    state = paths.state_dir()
    listed = {"domains": _domains(uri), "links": names,
              "netns": [p.name for p in netns_dir.iterdir()] if netns_dir.is_dir() else [],
              "objects": {k.name: k.find(None) for k in _object_kinds()},
              "state": [p.name for p in state.iterdir()] if state.is_dir() else [],
              "domain_logs": _domain_logs()}
    live = set() if include_live else live_tags()
    return Leftovers(
        domains=_dead(listed["domains"], live),
        links=_dead(listed["links"], live),
        netns=_dead(listed["netns"], live),
        objects={k: _dead(v, live) for k, v in listed["objects"].items()},
        state=_dead(listed["state"], live),
        partial_snapshots=[str(p) for p in guestcache.partial() if guestcache.writer_dead(p)],
        partial_builds=[str(p) for p in images.partial_builds() if guestcache.writer_dead(p)],
        domain_logs=_dead(listed["domain_logs"], live),
    )


def confirmed(first: Leftovers, again) -> Leftovers:
    """What ``first`` found that a second look (``again()``, a new find) still finds: a run
    that ended between the listing and the live tags had removed its objects before its
    registration, so they are gone from the second look, while a dead run's stay."""
    if first.empty():
        return first
    second = again()

    def both(a: list[str], b: list[str]) -> list[str]:
        still = set(b)
        return [n for n in a if n in still]
    return Leftovers(domains=both(first.domains, second.domains), links=both(first.links, second.links),
                     netns=both(first.netns, second.netns), state=both(first.state, second.state),
                     partial_snapshots=both(first.partial_snapshots, second.partial_snapshots),
                     partial_builds=both(first.partial_builds, second.partial_builds),
                     objects={k: both(v, second.objects.get(k, [])) for k, v in first.objects.items()},
                     domain_logs=both(first.domain_logs, second.domain_logs))


def _domain_logs() -> list[str]:
    try:
        return [p.name for p in paths.QEMU_LOG_DIR.iterdir() if p.name.startswith(PREFIX)]
    except OSError:
        return []


def _umask() -> int:
    """This process's umask, read without setting it (os.umask would, for every thread)."""
    with contextlib.suppress(OSError, ValueError):
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    return 0o022


def register(tag: str, owner: dict) -> Path:
    """The state folder tb-<tag>, made with its owner.json already in it (written in a
    private folder, then renamed into place): another process never sees the folder
    without its owner, which would make it, and the first objects, a dead run's.
    FileExistsError when the tag is taken."""
    import tempfile
    state = paths.state_dir()
    state.mkdir(parents=True, exist_ok=True)
    d = state / f"{PREFIX}{tag}"
    tmp = Path(tempfile.mkdtemp(prefix=".owning-", dir=state))
    try:
        # as mkdir would make it: libvirt's QEMU (another user) reads overlays and seeds in it
        os.chmod(tmp, 0o777 & ~_umask())
        (tmp / "owner.json").write_text(json.dumps(owner))
        if d.exists():
            raise FileExistsError(str(d))
        os.rename(tmp, d)       # an existing, non-empty folder of that name makes this fail
    except OSError as e:
        shutil.rmtree(tmp, ignore_errors=True)
        if isinstance(e, FileExistsError) or e.errno in (errno.EEXIST, errno.ENOTEMPTY):
            raise FileExistsError(str(d)) from None
        raise
    return d


#: tags drawn before giving up on a fresh one: there are 65536, so only a state folder that
#: holds most of them runs out
TAG_DRAWS = 64


def register_fresh(draw: Callable[[], tuple[str, str]], owner: Callable[[str], dict]) -> tuple[str, str, Path]:
    """(run id, tag, state folder): the first (run id, tag) from ``draw`` whose tag no state
    folder has yet, registered with ``owner(run id)``. Tags are four hex digits drawn at
    random, so beside other runs (a shared host, a test suite's workers) or a dead run's
    folder, a draw is now and then taken: it is drawn again, never refused."""
    for _ in range(TAG_DRAWS):
        run_id, tag = draw()
        try:
            return run_id, tag, register(tag, owner(run_id))
        except FileExistsError:
            continue
    raise TestbedError(f"no free run tag in {TAG_DRAWS} draws: {paths.state_dir()} holds too many "
                       f"{PREFIX}<tag> folders (see `testbed cleanup`)")


def _run_owner(run_id: str) -> dict:
    # Where the run writes its results, so `testbed cleanup` from another directory can still
    # mark a killed run's record (results go to ./results or --results, not one fixed place).
    return {"pid": os.getpid(), "run_id": run_id, "results": str(paths.results_dir())}


@contextlib.contextmanager
def owned_state(tag: str, run_id: str) -> Iterator[Path]:
    """The run's state folder, registered as owned by this process while it lives
    (FileExistsError when the tag is taken: :func:`owned_fresh_state` draws again)."""
    d = register(tag, _run_owner(run_id))
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


@contextlib.contextmanager
def owned_fresh_state(draw: Callable[[], tuple[str, str]]) -> Iterator[tuple[str, str, Path]]:
    """(run id, tag, state folder) of a tag drawn until free (:func:`register_fresh`),
    registered as owned by this process while it lives."""
    run_id, tag, d = register_fresh(draw, _run_owner)
    try:
        yield run_id, tag, d
    finally:
        shutil.rmtree(d, ignore_errors=True)


def remove(found: Leftovers, uri: str = "qemu:///system") -> None:
    if found.domains:
        with contextlib.suppress(libvirt.libvirtError):
            conn = libvirt.open(uri)
            try:
                for name in found.domains:
                    with contextlib.suppress(libvirt.libvirtError):
                        dom = conn.lookupByName(name)
                        if dom.isActive():
                            dom.destroy()
                        if dom.isPersistent():
                            dom.undefine()
            finally:
                conn.close()
    for name in found.domain_logs:
        with contextlib.suppress(OSError):
            (paths.QEMU_LOG_DIR / name).unlink()
    # Mode-made objects (switch bridges) before links: ports leave a switch before their devices go.
    _remove_objects(None, found)
    for name in found.links:
        links.delete(name)
    for ns in found.netns:
        # A dead run's processes inside its own namespaces (private ovsdb-server and
        # ovs-vswitchd of an emulated host, tools) outlive it: they were started in their own
        # sessions. Everything in a tb- namespace is the testbed's, so they are stopped first.
        _stop_processes_in(ns)
        ops.delete_namespace(ns)
    for s in found.state:
        _mark_killed(paths.state_dir() / s)
        shutil.rmtree(paths.state_dir() / s, ignore_errors=True)
    for p in (*found.partial_snapshots, *found.partial_builds):
        _remove_tree(p)


def _remove_tree(path: str) -> None:
    """A cache folder whose writer died. A killed image build can leave mmdebstrap's mounts
    inside its root (proc, sys, devpts, a tmpfs): they are detached first, deepest first, and
    the removal never crosses into another file system, so nothing outside the folder is
    touched even if a mount could not be detached."""
    root = os.path.realpath(path)
    with open("/proc/self/mountinfo") as f:
        points = {line.split()[4] for line in f}
    for m in sorted((m for m in points if m == root or m.startswith(root + "/")), key=len, reverse=True):
        proc.run(["umount", "--lazy", m], check=False, timeout=30)
    proc.run(["rm", "-rf", "--one-file-system", "--", root], check=False, timeout=300)


def _stop_processes_in(ns: str) -> None:
    if not ns.startswith(PREFIX):
        return
    from testbed.host.net import ops
    pids = ops.pids_in(ns)
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, sig)
        deadline = time.monotonic() + 3
        while any(proc.running(p) for p in pids) and time.monotonic() < deadline:
            time.sleep(0.1)


def _mark_killed(state: Path) -> None:
    """A run whose process died without finishing still says `running`; say what happened.
    Only the status and end are set: its samples are kept as they are."""
    from testbed.records import results
    try:
        owner = json.loads((state / "owner.json").read_text())
        run_id = owner["run_id"]
    except (OSError, ValueError, KeyError, TypeError):
        return
    run_json = Path(owner.get("results") or paths.results_dir()) / run_id / "run.json"
    try:
        record = json.loads(run_json.read_text())
    except (OSError, ValueError):
        return
    if record.get("status") == "running":
        record.update(status="interrupted", ended=None,
                      notes=[*record.get("notes", []), "the run's process died; marked by testbed cleanup"])
        results.atomic_write(run_json, json.dumps(record, indent=2, sort_keys=True, default=str))


def lock_path() -> Path:
    return paths.state_dir() / "run.lock"


@contextlib.contextmanager
def measure_lock() -> Iterator[None]:
    """One cell measured at a time among this host's pytest sessions and their workers (a
    team's session under pytest-xdist's ``-n``: a worker measures while the others wait, so
    no sample has another worker's traffic beside it). Taken around each cell's samples, not
    for a session: the workers boot and plug their guests meanwhile. `testbed run` holds the
    host lock instead (host_lock)."""
    p = paths.state_dir() / "measure.lock"
    p.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(p, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)          # waits; Ctrl-C interrupts the wait
        try:
            yield
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


@contextlib.contextmanager
def host_lock(run_id: str, shared: bool | None = None) -> Iterator[None]:
    """One run per host at a time: a second one is told which run holds the host.

    A shared run (``shared``, default: paths.shared_host(), i.e. ``--shared-host``) holds the
    lock together with other shared runs; a run that wants the host alone is refused while
    any of them goes on, and a shared run is refused while one holds it alone. Only a run
    alone writes its line into the lock file (shared ones are named from their state folders)."""
    shared = paths.shared_host() if shared is None else shared
    p = lock_path()
    p.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(p, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, (fcntl.LOCK_SH if shared else fcntl.LOCK_EX) | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = Path(p).read_text().strip() or _shared_holders() or "unknown"
            raise LeftoversError(f"run {holder} in progress on this host (lock {p}); "
                                 "wait for it to finish") from None
        if not shared:
            os.ftruncate(fd, 0)
            os.write(fd, f"{run_id} pid {os.getpid()}\n".encode())
        try:
            yield
        finally:
            if not shared:
                os.ftruncate(fd, 0)
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


def _shared_holders() -> str:
    """The runs sharing the host: the owners of live state folders whose process holds the
    lock (their lock holds no line)."""
    pids = _lock_pids(lock_path()) or set()
    ids = [f"{info['run_id']} pid {pid}" for _, pid, info in _owners() if pid in pids and info.get("run_id")]
    return f"(shared) {', '.join(ids)}" if ids else ""


def _lock_pids(p: Path) -> set[int] | None:
    return shareduse.holders(p)


def wait_host_free(timeout: float, poll_s: float = 0.05) -> bool:
    """Wait (at most ``timeout`` s) until no live run holds the host lock; True once free.

    For callers told "in progress on this host" that want to go on as soon as the other
    run ends, not after a fixed pause. It looks at the lock (/proc/locks) and never takes it,
    so a run starting meanwhile is not refused because somebody waits; a lock dies with its
    process, so a run killed with SIGKILL counts as gone. Without /proc/locks it reads the
    holder line host_lock writes and clears (a line whose pid is dead counts as free)."""
    deadline = time.monotonic() + timeout
    while True:
        pids = _lock_pids(lock_path())
        if pids is not None:
            held = bool(pids)
        else:
            try:
                holder = lock_path().read_text().split()
            except OSError:
                holder = []
            pid = int(holder[2]) if len(holder) >= 3 and holder[1] == "pid" and holder[2].isdigit() else None
            held = bool(holder) and (pid is None or _pid_alive(pid))
        if not held:
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(poll_s)


def refuse_if_leftovers(uri: str = "qemu:///system") -> None:
    """Called with the host lock held: anything tb- now belongs to a dead run."""
    # A dead run's domain log is only a file: it does not disturb a run, which need not wait
    # for `testbed cleanup` because of it (cleanup and the test session remove it).
    found = dataclasses.replace(confirmed(find(uri), lambda: find(uri)), domain_logs=[])
    if not found.empty():
        raise LeftoversError(f"a dead run left testbed objects behind ({found.describe()}); "
                             "run `testbed cleanup` first")


def find_on(shell, uri: str, include_live: bool = False) -> Leftovers:
    """tb- objects on a remote host (remote.Shell), read over ssh and its libvirt. A run's
    liveness is known here, where it runs: its state folder on this machine."""
    from testbed.host.net import ops
    try:
        names = ops.on(shell).names()
    except CommandError:
        names = []
    state = shell.run(["ls", "-1", str(paths.state_dir())], timeout=30, check=False)
    logs = shell.run(["ls", "-1", str(paths.QEMU_LOG_DIR)], timeout=30, check=False)
    domains = _domains(uri)
    objects = {k.name: k.find(shell) for k in _object_kinds()}
    live = set() if include_live else live_tags()       # after the listing, as in find()
    return Leftovers(domains=_dead(domains, live), links=_dead(names, live),
                     objects={k: _dead(v, live) for k, v in objects.items()},
                     state=_dead(state.stdout.split() if state.rc == 0 else [], live),
                     domain_logs=_dead(logs.stdout.split() if logs.rc == 0 else [], live))


def remove_on(shell, found: Leftovers, uri: str) -> None:
    """Remove what find_on found, on that host."""
    remove(Leftovers(domains=found.domains), uri)
    _remove_objects(shell, found)
    for name in found.links:
        ops.on(shell).delete(name)
    for st in found.state:
        shell.run(["rm", "-rf", "--", str(paths.state_dir() / st)], timeout=60, check=False)
    for name in found.domain_logs:
        shell.run(["rm", "-f", "--", str(paths.QEMU_LOG_DIR / name)], timeout=60, check=False)


def refuse_if_leftovers_on(hosts) -> None:
    """The leftovers check for remote hosts (model.HostSpec with transport ssh)."""
    from testbed.host import remote
    for h in hosts:
        sh = remote.shell(h)
        found = dataclasses.replace(confirmed(find_on(sh, h.uri), lambda: find_on(sh, h.uri)),  # noqa: B023
                                    domain_logs=[])   # as refuse_if_leftovers
        if not found.empty():
            raise LeftoversError(f"host {h.name}: a dead run left testbed objects behind ({found.describe()}); "
                                 f"run `testbed cleanup --hosts TOPOLOGY` first")
