"""`ovs-vxlan`: guests on two hosts, each host an OVS bridge with a vxlan port. Emulated
hosts each run a private switch with userspace tunnelling (host/net/vxlan.py); real hosts
need the kernel datapath (attachments/_realhost.py). The fabric's shape is bridge-vxlan's; what each host gets is this module's."""
from __future__ import annotations

from testbed.attachments import _across
from testbed.attachments.base import Mode
from testbed.attachments.bridge_vxlan import VXLAN_OVERHEAD, vxlan_fabric
from testbed.errors import CapabilityError


def unavailable() -> str | None:
    # Each emulated host runs its own private switch (userspace tunnelling): OVS must be
    # installed; the host's own switch is not used.
    from testbed.host.net import ovsd
    try:
        ovsd.require_binaries()
    except CapabilityError as e:
        return str(e)
    return None


def real_segment():
    """On each real host: an OVS bridge on the host's own ovs-vswitchd with a vxlan port.
    That needs the kernel datapath: with the userspace datapath OVS would need the underlay
    address moved onto an OVS bridge ("userspace tunneling"), which the testbed does not do
    to an operator's NIC."""
    from testbed.guests import render
    from testbed.attachments import _realhost as realhost
    from testbed.host.net import ops, vxlan
    from testbed.topology.model import object_name

    def vsctl(shell, *args, check=True):
        return shell.run(["ovs-vsctl", "--timeout=20", *args], timeout=30, check=check)

    def build(stack, side):
        br, vx = object_name(side.tag, "ovs", side.ab), object_name(side.tag, "vx", side.ab)
        sh = side.shell
        vsctl(sh, "add-br", br, *vxlan.ovs_vxlan_port(br, vx, side.tunnel, side.ip, side.peer_ip))
        stack.callback(vsctl, sh, "--if-exists", "del-br", br, check=False)
        dp = vsctl(sh, "get", "Bridge", br, "datapath_type").stdout.strip().strip('"')
        err = vsctl(sh, "get", "Interface", br, "error", check=False).stdout.strip()
        if dp not in ("", "system") or (err and err != "[]"):
            raise CapabilityError(f"host {side.host.name}: OVS kernel datapath unavailable ({err or dp}); "
                                  "ovs-vxlan across real hosts needs it")
        vsctl(sh, "set", "Interface", br, f"mtu_request={side.mtu}")
        ops.on(sh).set_up(br)
        return br, vx

    def nic(side, target, mac, backend, mtu, queues):
        return render.NicParams(kind="ovs", source=side.bridge, target=target, mac=mac,
                                driver=backend.driver_name, mtu=mtu, queues=queues)

    def set_mtu(side, tap, mtu):
        ops.set_mtu(side.shell, tap, mtu)
        vsctl(side.shell, "set", "Interface", side.bridge, f"mtu_request={mtu}")

    return realhost.Segment("ovs-system-vxlan", VXLAN_OVERHEAD, build, nic, set_mtu)


MODES = (Mode("ovs-vxlan", vxlan_fabric(real_segment, private_switch=True), placement="two", needs_ovs=True,
              overhead=VXLAN_OVERHEAD, overhead_label="VXLAN-over-IPv4 overhead", unavailable=unavailable,
              check=_across.check),)
