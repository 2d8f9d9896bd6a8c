"""One tool run across a namespace connection (host.net.netns.Connection), with the counters
of every hop on its path read around it: how far packets got when a path does not carry TCP,
and what the chain and OVS experiments (benchmarks, netns tests) measure.

Host networking builds the path; this module runs the traffic tool over it (the host layer runs no
traffic tool). The runner's measurement (testbed.measure.sampling) goes through a TestPath instead.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

from testbed.errors import CommandError, TestbedError
from testbed.host import proc
from testbed.host.net.netns import Connection
from testbed.tools.base import ToolResult
from testbed.tools.netperf import NetperfDriver
from testbed.topology.model import Profile


@dataclass(frozen=True)
class Transfer:
    result: ToolResult
    hop_bytes: tuple[int, ...]                # a-to-b counter movement per hop, in hop order
    seconds: float                            # wall time of the client run


def wait_listening(netns: str, port: int, server: proc.Background, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not proc.run(["ss", "-Hltn", f"sport = :{port}"], netns=netns, timeout=10).stdout.strip():
        if server.popen.poll() is not None:
            raise TestbedError(f"{' '.join(server.argv)} exited {server.popen.returncode}: "
                               f"{server.stderr()[-300:]}")
        if time.monotonic() > deadline:
            raise TestbedError(f"server in {netns} not listening on port {port} after {timeout_s:.0f} s")
        time.sleep(0.05)


def netperf(conn: Connection, profile: Profile, *, out_dir: str, port: int = 12865,
            timeout_s: float | None = None) -> Transfer:
    """netserver in namespace b, netperf in a, the hops' counters read around the run.
    A client that does not finish in time (no TCP through the path) is a failed result,
    not an exception; the hop bytes then say how far the packets got."""
    drv = NetperfDriver()
    timeout_s = timeout_s if timeout_s is not None else profile.duration_s + 30
    with proc.background(drv.server_argv(profile, port=port), out_dir=out_dir,
                         name=f"netserver-{conn.b.netns}", netns=conn.b.netns) as server:
        wait_listening(conn.b.netns, port, server)
        before = conn.counters()
        start = time.monotonic()
        try:
            res = proc.run(drv.client_argv(profile, conn.b.address, port=port), netns=conn.a.netns,
                           timeout=timeout_s, check=False)
            result = drv.parse(res.stdout, res.stderr, res.rc)
        except CommandError as e:
            if not e.timed_out:
                raise
            result = ToolResult.failed(f"netperf did not finish within {timeout_s:.0f} s")
        took = time.monotonic() - start
        after = conn.counters()
    return Transfer(result, tuple(y - x for x, y in zip(before, after)), took)
