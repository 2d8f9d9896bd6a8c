"""Find and remove tb- objects, and only those: domains, links, namespaces, OVS bridges,
per-run state. Used by `testbed cleanup` after a dead run, and by the leftovers check a
new run makes before it starts."""
from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import shutil
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import libvirt
from pyroute2 import IPRoute

from testbed import PREFIX, paths, proc
from testbed.errors import CommandError, LeftoversError
from testbed.hostnet import links

log = logging.getLogger(__name__)


@dataclass
class Leftovers:
    domains: list[str] = field(default_factory=list)
    links: list[str] = field(default_factory=list)
    netns: list[str] = field(default_factory=list)
    ovs_bridges: list[str] = field(default_factory=list)
    state: list[str] = field(default_factory=list)

    def empty(self) -> bool:
        return not any((self.domains, self.links, self.netns, self.ovs_bridges, self.state))

    def describe(self) -> str:
        parts = [f"{k}: {', '.join(v)}" for k, v in self.__dict__.items() if v]
        return "; ".join(parts) or "none"


def _domains(uri: str) -> list[str]:
    try:
        conn = libvirt.open(uri)
    except libvirt.libvirtError:
        return []
    try:
        return sorted(d.name() for d in conn.listAllDomains() if d.name().startswith(PREFIX))
    finally:
        conn.close()


def _ovs_bridges() -> list[str]:
    try:
        out = proc.run(["ovs-vsctl", "--timeout=5", "list-br"], timeout=10).stdout
    except CommandError:
        return []
    return sorted(b for b in out.split() if b.startswith(PREFIX))


def find(uri: str = "qemu:///system") -> Leftovers:
    with IPRoute() as ipr:
        names = [l.get("ifname") for l in ipr.get_links()]
    netns_dir = Path("/run/netns")
    state = paths.state_dir()
    return Leftovers(
        domains=_domains(uri),
        links=sorted(n for n in names if n and n.startswith(PREFIX)),
        netns=sorted(p.name for p in netns_dir.iterdir() if p.name.startswith(PREFIX))
        if netns_dir.is_dir() else [],
        ovs_bridges=_ovs_bridges(),
        state=sorted(p.name for p in state.iterdir() if p.name.startswith(PREFIX)) if state.is_dir() else [],
    )


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
    for br in found.ovs_bridges:
        with contextlib.suppress(CommandError):
            proc.run(["ovs-vsctl", "--timeout=10", "--if-exists", "del-br", br], timeout=20)
    for name in found.links:
        links.delete(name)
    for ns in found.netns:
        with contextlib.suppress(CommandError):
            proc.run(["ip", "netns", "delete", ns], timeout=20)
    for s in found.state:
        shutil.rmtree(paths.state_dir() / s, ignore_errors=True)


def lock_path() -> Path:
    return paths.state_dir() / "run.lock"


@contextlib.contextmanager
def host_lock(run_id: str) -> Iterator[None]:
    """One run per host at a time: a second one is told which run holds the host."""
    p = lock_path()
    p.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(p, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = Path(p).read_text().strip() or "unknown"
            raise LeftoversError(f"run {holder} in progress on this host (lock {p}); "
                                 "wait for it to finish") from None
        os.ftruncate(fd, 0)
        os.write(fd, f"{run_id} pid {os.getpid()}\n".encode())
        try:
            yield
        finally:
            os.ftruncate(fd, 0)
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


def refuse_if_leftovers(uri: str = "qemu:///system") -> None:
    """Called with the host lock held: anything tb- now belongs to a dead run."""
    found = find(uri)
    if not found.empty():
        raise LeftoversError(f"a dead run left testbed objects behind ({found.describe()}); "
                             "run `testbed cleanup` first")
