"""The guest side of a hot-plugged NIC under test, the same for every attachment mode:
its MAC, its address, its queues and offloads, set through the guest agent."""
from __future__ import annotations

from testbed.guests.guest import Agent
from testbed.host import offloads
from testbed.topology.model import Offloads


def mac(tag: str, guest_index: int, nic: int) -> str:
    # Locally administered, unicast; unique per run, guest and NIC.
    t = int(tag, 16)
    return f"52:54:{t >> 8:02x}:{t & 0xff:02x}:{guest_index:02x}:{nic:02x}"


def configure(agent: Agent, ifname: str, address: str, prefixlen: int, queues: int,
              offloads: Offloads | None) -> dict[str, str]:
    """Address the NIC (IPv4 only), bring it up, turn on its queues and switch the requested
    offloads; returns the offload states the NIC then reports."""
    agent.run(["/usr/sbin/sysctl", "-q", "-w", f"net.ipv6.conf.{ifname}.disable_ipv6=1"])
    agent.run(["/usr/sbin/ip", "addr", "flush", "dev", ifname])
    agent.run(["/usr/sbin/ip", "addr", "add", f"{address}/{prefixlen}", "dev", ifname])
    agent.run(["/usr/sbin/ip", "link", "set", "dev", ifname, "up"])
    if queues > 1:
        # virtio-net starts with as many queue pairs as the guest has vCPUs; ask for all of
        # them so the cell measures the multiqueue NIC it names.
        agent.run(["/usr/sbin/ethtool", "-L", ifname, "combined", str(queues)])
    return dict(_offloads(agent, ifname, offloads))


def _offloads(agent: Agent, ifname: str, want: Offloads | None) -> tuple[tuple[str, str], ...]:
    """Switch the requested offloads one by one (a fixed feature must not stop the others;
    the kernel also drags dependent features along), then read back what holds: the same
    code as for a host's links (testbed.host.offloads), run through the guest's agent."""
    return offloads.apply_offloads(agent, ifname, want, ethtool="/usr/sbin/ethtool", timeout=30)
