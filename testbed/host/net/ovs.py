"""OVS bridges on a switch (the host's or a private one): their datapath, the userspace-TSO
setting, and a bridge with no uplink and no address, made and removed by the testbed. The
`ovs` mode and the namespace connections build on these.

Userspace (netdev) datapath, measured on this machine (OVS 3.1, Linux 6.18, no openvswitch
module), two namespaces joined by veth pairs through one netdev bridge, netperf TCP_STREAM:

* Without ``userspace-tso-enable`` ovs-vswitchd moves frames through plain AF_PACKET sockets,
  which carry no checksum metadata. A frame whose sender left the checksum to "hardware"
  (tx checksum offload on, the default on veth and tap) leaves OVS with a wrong checksum and
  the receiver drops it: ARP and ICMP work, no TCP connection ever opens. Turning tx
  checksumming off at the sender makes TCP work at 0.4-0.8 Gbit/s.
* With it set before ovs-vswitchd starts, ports carry a virtio-net header, so partial
  checksums and TSO super-frames pass: TCP works with every offload on, 5-10 Gbit/s, and
  still with tx checksumming off (about 0.7 Gbit/s). About a tenth of the bytes a sender
  puts on a veth port are retransmissions (netperf counts them; the veth counters on either
  side of OVS differ by as much): the switch's packet sockets drop under load. Internal
  ports (taps) showed no such loss.
* Setting it on a running daemon: it latches on (lib/userspace-tso.c, a one-way flag; the
  docs say changing it needs a restart). On a daemon that has not yet sent a packet that
  works. On one that has, every netdev port of the switch stops passing TCP, with checksum
  offload on or off, until the daemon restarts (most likely the packet socket it already
  opened for sending was made without the header that frames now carry; inferred from the
  behaviour, not read in the source). The coverage counter ``netdev_sent`` (0 or not)
  tells the two cases apart.

So this module never flips the key at runtime, which the first plan (set it, restore the old
value on exit) would have done. Restoring would not undo the latch either, only make the
database disagree with the daemon. ``ovsd.ensure_running()`` sets the key *before* it starts
an ovs-vswitchd itself on a netdev-only host. On a switch someone else runs without it, the
segment refuses with a reason, unless ``tso=False`` says the endpoints turn tx checksumming
off themselves. Their switch and its other tenants are left alone.
"""
from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator

from testbed import PREFIX
from testbed.errors import CapabilityError, CommandError, TestbedError
from testbed.host import proc
from testbed.host.net import links, ovsd

log = logging.getLogger(__name__)

TSO_KEY = ovsd.TSO_KEY


def check_ours(name: str) -> None:
    if not name.startswith(PREFIX):
        raise TestbedError(f"refusing to touch OVS object {name!r}: not a {PREFIX} object")


def switches(datapath: str | None) -> bool:
    """Whether a path's datapath (a fabric's: ovs-netdev, ovs-system, ovs-netdev-vxlan, ...)
    goes through Open vSwitch, whose daemons it then depends on."""
    return (datapath or "").startswith("ovs-")


def userspace(datapath: str | None) -> bool:
    """Whether an OVS path's datapath forwards in user space (netdev: ovs-vswitchd's own
    threads) rather than in the kernel (system)."""
    return switches(datapath) and "netdev" in (datapath or "")


def ovs_datapath(switch: ovsd.Ovs) -> str:
    """The datapath type bridges on ``switch`` get. A private switch always uses netdev: a
    kernel datapath would be shared with the host's switch."""
    return ovsd.datapath() if switch.netns is None else "netdev"


def other_config(switch: ovsd.Ovs, key: str) -> str | None:
    """One key of the global Open_vSwitch other_config, None when unset."""
    out = switch.vsctl("--if-exists", "get", "Open_vSwitch", ".", f"other_config:{key}",
                       wait=False).strip()
    return out.strip('"') if out else None


def userspace_tso(switch: ovsd.Ovs) -> bool:
    """Is userspace TSO configured on ``switch``? (See the module notes for why the
    configured value is trusted: only a value set before the daemon started works.)"""
    return other_config(switch, TSO_KEY) == "true"


def require_userspace_tso(switch: ovsd.Ovs) -> None:
    """Raise CapabilityError, saying what to do, unless TCP with offloads on can pass."""
    if ovs_datapath(switch) != "netdev" or userspace_tso(switch):
        return
    raise CapabilityError(
        f"ovs-vswitchd ({switch.db}) runs the userspace datapath without other_config:{TSO_KEY}"
        "=true, so TCP from senders with tx checksum offload on is dropped. Set it and restart "
        f"ovs-vswitchd (`ovs-vsctl set Open_vSwitch . other_config:{TSO_KEY}=true`; setting it "
        "on a running switch that has forwarded traffic breaks all its netdev ports until the "
        "restart), or pass tso=False and turn tx checksumming off at the endpoints")


@contextlib.contextmanager
def bridge(name: str, switch: ovsd.Ovs, mtu: int | None = None) -> Iterator[str]:
    """An OVS bridge with no uplink and no address; removed with --if-exists del-br on exit."""
    check_ours(name)
    if proc.ok(["ovs-vsctl", f"--db={switch.db}", "--timeout=10", "br-exists", name], timeout=20):
        # someone else's (a concurrent run with the same tag): neither reuse nor remove it
        raise TestbedError(f"OVS bridge {name} already exists; not created by this run")
    dp = ovs_datapath(switch)
    args = ["add-br", name, "--", "set", "Bridge", name, f"datapath_type={dp}"]
    if mtu:
        args += ["--", "set", "Interface", name, f"mtu_request={mtu}"]
    try:
        switch.vsctl(*args)
    except CommandError as e:
        # add-br may have half-succeeded (row written, vswitchd failed): remove what it wrote
        _del_br(name, switch)
        raise TestbedError(f"cannot create OVS bridge {name}: {e}") from None
    try:
        if switch.netns is None and links.exists(name):
            links.no_ipv6(name)   # the bridge's internal port gets no host address of any kind
        yield name
    finally:
        _del_br(name, switch)


def _del_br(name: str, switch: ovsd.Ovs) -> None:
    check_ours(name)
    try:
        switch.vsctl("--if-exists", "del-br", name)
    except CommandError as e:
        log.error("could not delete OVS bridge %s: %s", name, e)
        raise


def tb_bridges(shell=None) -> list[str]:
    """The tb- bridges on a host's switch (``shell``: an executor, None for this host); none
    when no switch answers, since then there is nothing of ours in it to remove."""
    from testbed import PREFIX
    from testbed.host import executor
    res = (shell or executor.local()).run(["ovs-vsctl", "--timeout=5", "list-br"], timeout=15, check=False)
    return sorted(b for b in res.stdout.split() if b.startswith(PREFIX)) if res.rc == 0 else []


def delete_bridge(shell, name: str) -> None:
    """Remove a tb- bridge (and its ports) from a host's switch; gone already is fine."""
    from testbed.host import executor
    check_ours(name)
    (shell or executor.local()).run(["ovs-vsctl", "--timeout=10", "--if-exists", "del-br", name],
                                    timeout=20, check=False)
