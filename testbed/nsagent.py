"""Network namespaces as measurement endpoints, behind the same interface as a guest's
agent, so the same tools, statistics and results format serve namespaces and guests."""
from __future__ import annotations

import contextlib
import itertools
import subprocess
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

from testbed import proc
from testbed.errors import CommandError
from testbed.guest import GuestResult
from testbed.model import GuestSpec


class NsAgent:
    """spawn / wait / kill / run / read_file / write_file inside one namespace."""

    def __init__(self, netns: str, out_dir: str) -> None:
        self.netns, self.out_dir = netns, out_dir
        self.name = netns
        self._procs: dict[int, proc.Background] = {}
        self._seq = itertools.count()

    def ping(self) -> bool:
        return True

    def spawn(self, argv: Sequence[str]) -> int:
        bg = proc.start(argv, out_dir=self.out_dir, name=f"{self.netns}-{next(self._seq)}", netns=self.netns)
        self._procs[bg.popen.pid] = bg
        return bg.popen.pid

    def alive(self, pid: int) -> bool:
        bg = self._procs.get(pid)
        return bg is not None and bg.popen.poll() is None

    def wait(self, pid: int, argv: Sequence[str], timeout: float,
             expected_s: float = 0.0) -> GuestResult:
        # expected_s only matters to the guest agent, which has to poll; a child is waited on.
        bg = self._procs[pid]
        start = time.monotonic()
        try:
            rc = bg.popen.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill(pid)
            raise CommandError([f"{self.netns}:", *argv], None, "", timed_out=True) from None
        self._procs.pop(pid, None)
        # `ip netns exec` reports a missing program as 255 with its own message.
        return GuestResult(tuple(argv), rc, bg.stdout(), bg.stderr(), time.monotonic() - start)

    def kill(self, pid: int, signal: str = "KILL") -> None:
        bg = self._procs.pop(pid, None)
        if bg is not None:
            bg.stop(grace=0.5 if signal == "KILL" else 3.0)

    def stop(self, pid: int) -> str:
        """Kill a process and return what it printed."""
        bg = self._procs.pop(pid, None)
        if bg is None:
            return ""
        bg.stop(grace=0.5)
        return bg.stdout() + bg.stderr()

    def stop_all(self) -> None:
        for pid in list(self._procs):
            self.kill(pid)

    def run(self, argv: Sequence[str], timeout: float = 30, check: bool = True) -> GuestResult:
        res = proc.run(argv, timeout=timeout, check=False, netns=self.netns)
        if check and res.rc != 0:
            raise CommandError([f"{self.netns}:", *argv], res.rc, res.stderr or res.stdout, stdout=res.stdout)
        return GuestResult(tuple(argv), res.rc, res.stdout, res.stderr, res.seconds)

    def read_file(self, path: str, limit: int = 1 << 20) -> str:
        # Namespaces share the host's kernel: /proc/stat here is the host's.
        with open(path, errors="replace") as f:
            return f.read(limit)

    def write_file(self, path: str, text: str) -> None:
        with open(path, "w") as f:
            f.write(text)


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
