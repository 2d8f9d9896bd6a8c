"""A test path: two endpoints (guests or namespaces) joined by a mode's fabric, with their
tool servers, and what a cell does to it before its samples (MTU set and checked).
testbed.measure.testpaths builds them; the cell loop (testbed.measure.sampling) measures
over them."""
from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from testbed.errors import CommandError, GuestError, TestbedError
from testbed.guests.guest import Agent
from testbed.guests.virt import Guest
from testbed.host import hostwatch
from testbed.host.nsagent import NsHost
from testbed.measure import crosscheck
from testbed.tools.base import ToolDriver
from testbed.topology.model import Cell, Profile


@dataclass(frozen=True)
class Endpoint:
    guest: Guest | NsHost
    ifname: str               # NIC under test inside the guest
    address: str              # without prefix
    tap: str                  # host-side device of that NIC


class Servers:
    """The tool servers of one test path. A reusable server (ToolDriver.reusable_server) is
    started once, checked before every sample and restarted if it died; it is stopped when
    the path goes (testpaths.mode). Others are started and stopped per sample."""

    def __init__(self, reuse: bool = True) -> None:
        self.reuse = reuse
        self._running: dict[tuple[int, str, int], tuple[Guest | NsHost, int]] = {}

    def start(self, host: Guest | NsHost, driver: ToolDriver, profile: Profile, port: int) -> int:
        key = (id(host), driver.name.value, port)
        if key in self._running:
            _, pid = self._running[key]
            if host.agent.alive(pid):
                return pid
            del self._running[key]
        pid = host.agent.spawn(driver.server_argv(profile, port=port))
        _wait_listening(host, port)
        if self.reuse and driver.reusable_server:
            self._running[key] = (host, pid)
        return pid

    def release(self, host: Guest | NsHost, driver: ToolDriver, pid: int) -> str:
        """Stop a per-sample server; returns what it printed when the driver reads that."""
        if pid in {p for _, p in self._running.values()}:
            return ""
        if driver.reads_server_output:
            return host.agent.stop(pid)
        host.agent.kill(pid)
        return ""

    def stop_all(self) -> None:
        for host, pid in self._running.values():
            host.agent.kill(pid)
        self._running.clear()

    def __enter__(self) -> Servers:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop_all()


@dataclass(frozen=True)
class TestPath:
    client: Endpoint
    server: Endpoint
    set_host_mtu: Callable[[int], None]
    #: whether the devices read_counters reads count what the guest sends as rx (a tap:
    #: QEMU writes into it) or as tx: the fabric says (attachments.Fabric.guest_sends_as_rx)
    guest_sends_as_rx: bool = True
    #: byte and packet counters of an endpoint's device under test, read by the fabric
    #: that made it (attachments.Fabric.counters); testpaths.plug sets it
    read_counters: Callable[[Endpoint], crosscheck.Wire] | None = None
    #: servers kept across samples; None: one server per sample, stopped after it
    servers: Servers | None = None
    #: what forwards between the endpoints, as the fabric names it (attachments.Fabric.datapath)
    datapath: str | None = None
    #: per endpoint, the offload states its NIC reports (ethtool -k), after the run's requests
    offloads: Mapping[str, Mapping[str, str]] = field(default_factory=dict)
    #: what the host does to the path from outside (daemon restarts, objects removed, wire
    #: gaps), judged per sample: testbed.host.hostwatch; None: not watched
    guard: hostwatch.Guard | None = None
    #: the devices from the client's to the server's, as the fabric lists them
    #: (attachments.Fabric.path_devices): where per-hop tracing looks (testbed.measure.hops)
    devices: tuple[tuple[str, str | None, str], ...] = ()

    def counters(self) -> dict[str, crosscheck.Wire]:
        if self.read_counters is None:
            raise TestbedError("test path without device counters (build it with testpaths.plug)")
        return {ep.tap: self.read_counters(ep) for ep in (self.client, self.server)}


def primary_metric(p: Profile) -> str:
    return p.pattern.primary_metric


def set_mtu(path: TestPath, mtu: int) -> None:
    path.set_host_mtu(mtu)
    # Both guests at once: each agent round trip costs tens of milliseconds under TCG,
    # and this runs before every cell.
    started = []
    for ep in (path.client, path.server):
        argv = ["/usr/sbin/ip", "link", "set", "dev", ep.ifname, "mtu", str(mtu)]
        started.append((ep, argv, ep.guest.agent.spawn(argv)))
    for ep, argv, pid in started:
        res = ep.guest.agent.wait(pid, argv, 30)
        if res.rc != 0:
            raise CommandError([f"{ep.guest.name}:", *argv], res.rc, res.stderr or res.stdout)


def check_mtu(path: TestPath, mtu: int) -> str | None:
    """A don't-fragment ping of exactly `mtu` bytes; returns why it failed, or None."""
    size = mtu - 28   # IPv4 + ICMP headers
    # One probe is enough: a don't-fragment datagram of exactly the MTU either crosses every
    # hop or is refused (the kernel holds it while ARP resolves, so it is not lost to that).
    argv = ["/usr/bin/ping", "-n", "-M", "do", "-s", str(size), "-c", "1", "-W", "5",
            path.server.address]
    try:
        res = path.client.guest.agent.run(argv, check=False, timeout=30)
    except (CommandError, GuestError) as e:
        return f"MTU {mtu} check could not run: {e}"
    if res.rc != 0:
        out = (res.stdout + res.stderr).strip().splitlines()
        return f"MTU {mtu} path check failed (ping -M do -s {size}): {' | '.join(out[-2:])}"
    return None


def _wait_listening(g: Guest | NsHost, port: int, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while True:
        res = g.agent.run(["/usr/bin/ss", "-Hltn", f"sport = :{port}"], check=False, timeout=10)
        if res.stdout.strip():
            return
        if time.monotonic() > deadline:
            raise TestbedError(f"server in {g.name} not listening on port {port} after {timeout:.0f} s")
        time.sleep(0.05)


def client_plan(driver: ToolDriver, cell: Cell, server_addr: str, port: int,
                client: Agent) -> tuple[list[str], int]:
    """(argv, number of client processes) realising the cell's connection count: the tool
    driver decides how (ToolDriver.client_plan); files it needs go to the client."""
    return driver.client_plan(cell.profile, server_addr, port=port, connections=cell.connections,
                              write_file=client.write_file)
