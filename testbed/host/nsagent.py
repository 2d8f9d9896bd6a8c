"""Network namespaces as measurement endpoints, behind the same interface as a guest's
agent, so the same tools, statistics and results format serve namespaces and guests."""
from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field

from testbed.host.executor import Netns
from testbed.topology.model import GuestSpec


class NsAgent(Netns):
    """spawn / wait / kill / run / read_file / write_file inside one namespace: the
    namespace executor (testbed.host.executor.Netns) with its processes' output kept in
    ``out_dir``, plus the agent's ``ping``."""

    def __init__(self, netns: str, out_dir: str) -> None:
        super().__init__(netns, out_dir)
        self.out_dir = out_dir

    def ping(self) -> bool:
        return True


@dataclass(frozen=True)
class NsHost:
    """What measurement code needs of a guest, for a namespace."""

    name: str
    agent: NsAgent
    spec: GuestSpec = field(default=None)  # type: ignore[assignment]

    @staticmethod
    def make(label: str, netns: str, out_dir: str) -> NsHost:
        return NsHost(netns, NsAgent(netns, out_dir), GuestSpec(name=label, host="local"))


@contextlib.contextmanager
def hosts(a_ns: str, b_ns: str, out_dir: str) -> Iterator[tuple[NsHost, NsHost]]:
    a, b = NsHost.make("ns-a", a_ns, out_dir), NsHost.make("ns-b", b_ns, out_dir)
    try:
        yield a, b
    finally:
        a.agent.stop_all()
        b.agent.stop_all()


class RemoteNsAgent:
    """The same interface for a namespace on a remote host: every command goes through the
    host's shell (testbed.host.remote.Shell, its own instance: stop_all stops only this
    namespace's processes) as ``ip netns exec NS ...``. Files whose content depends on the
    namespace are read inside it; the rest (/proc/stat) is the host's."""

    def __init__(self, shell, netns: str) -> None:
        from testbed.host.remote import Shell
        self.shell = Shell(shell.host)
        self.netns = netns
        self.name = f"{netns}@{shell.host.name}"
        self.out_dir = None

    def _in(self, argv) -> list[str]:
        return ["ip", "netns", "exec", self.netns, *[str(a) for a in argv]]

    def run(self, argv, *, timeout: float = 30, check: bool = True, input: str | None = None):
        from testbed.errors import CommandError
        from testbed.host import proc
        res = self.shell.run(self._in(argv), timeout=timeout, check=False, input=input)
        if check and res.rc != 0:
            raise CommandError([f"{self.name}:", *map(str, argv)], res.rc, res.stderr or res.stdout,
                               stdout=res.stdout)
        return proc.Completed(tuple(str(a) for a in argv), res.rc, res.stdout, res.stderr, res.seconds)

    def read_file(self, path: str, limit: int = 1 << 20) -> str:
        from testbed.host.executor import _PER_NETNS
        if path.startswith(_PER_NETNS):
            return self.run(["cat", "--", path], timeout=10).stdout[:limit]
        return self.shell.read_file(path, limit)

    def write_file(self, path: str, text: str) -> None:
        from testbed.host.executor import _PER_NETNS
        if path.startswith(_PER_NETNS):
            self.run(["tee", "--", path], timeout=10, input=text)
        else:
            self.shell.write_file(path, text)

    def spawn(self, argv) -> int:
        return self.shell.spawn(self._in(argv))

    def wait(self, pid: int, argv, timeout: float, expected_s: float = 0.0, stop=None):
        return self.shell.wait(pid, argv, timeout, expected_s, stop)

    def kill(self, pid: int, signal: str = "KILL") -> None:
        self.shell.kill(pid, signal)

    def stop_all(self) -> None:
        self.shell.stop_all()

    def ping(self) -> bool:
        return True


def remote_host(label: str, host_name: str, shell, netns: str) -> NsHost:
    """A namespace endpoint on a remote host, as measurement code sees a guest."""
    return NsHost(f"{netns}@{host_name}", RemoteNsAgent(shell, netns),  # type: ignore[arg-type]
                  GuestSpec(name=label, host=host_name))
