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
