"""What this host can do, found by trying: device nodes that open, links a scratch
namespace can make, the switch's database answering, the versions of the host's own
programs. testbed.admin.capabilities adds the probe boots and the traffic tools; the modes
(testbed/attachments) ask these for their own probes."""
from __future__ import annotations

import errno
import os
import re
from pathlib import Path

from testbed.errors import CapabilityError, CommandError
from testbed.host import proc


def _opens(path: str) -> tuple[bool, str]:
    """Does a device node open read-write? Only opening it proves it can be used."""
    try:
        fd = os.open(path, os.O_RDWR)
    except OSError as e:
        return False, f"{path}: {os.strerror(e.errno or errno.ENOENT)}"
    os.close(fd)
    return True, ""

def vhost_net() -> tuple[bool, str]:
    return _opens("/dev/vhost-net")

def kvm_device() -> tuple[bool, str]:
    return _opens("/dev/kvm")

def _try_link(kind: str, make) -> tuple[bool, str]:
    """Create a throwaway link of `kind` with ``make(links)`` (host.net.ops on a scratch
    namespace, where a veth ``tb-pl`` exists), so the root namespace is never touched by a
    probe; the namespace goes with everything in it."""
    from testbed.host.net import ops
    ns = f"tb-probe-{os.getpid()}"
    try:
        with ops.namespace(ns) as ex:
            try:
                links = ops.on(ex)
                links.add_veth("tb-pl", "tb-pl1")
                make(links)
            except CommandError as e:
                return False, f"{kind}: {e.stderr_tail or e}"
    except CommandError as e:
        return False, f"cannot create a network namespace: {e.stderr_tail}"
    return True, ""

def macvtap() -> tuple[bool, str]:
    return _try_link("macvtap", lambda links: links.add_macvtap("tb-pm", "tb-pl", "bridge"))

def vxlan() -> tuple[bool, str]:
    return _try_link("vxlan", lambda links: links.add_vxlan("tb-pv", vni=42, local="198.18.255.2",
                                                            remote="198.18.255.1", port=4789, dev="tb-pl"))

def ovs_kernel_datapath() -> tuple[bool, str]:
    """The OVS kernel datapath needs the openvswitch module: try to create an ovs-system dp
    through genetlink (the module's family exists only when it is loaded or loadable)."""
    if Path("/sys/module/openvswitch").exists():
        return True, ""
    if proc.ok(["modprobe", "-q", "openvswitch"], timeout=20) and Path("/sys/module/openvswitch").exists():
        return True, ""
    return False, "openvswitch kernel module not available (modprobe openvswitch failed)"

def ovs_running() -> tuple[bool, str]:
    try:
        proc.run(["ovs-vsctl", "--timeout=5", "show"], timeout=10)
        return True, ""
    except CommandError as e:
        return False, f"ovs-vsctl cannot reach ovsdb-server: {e.stderr_tail or e}"

def _version(argv: list[str], pattern: str) -> str | None:
    try:
        res = proc.run(argv, timeout=10, check=False)
    except CommandError:
        return None
    m = re.search(pattern, res.stdout + res.stderr)
    return m.group(1) if m else None

def require(ok_reason: tuple[bool, str], what: str) -> None:
    ok, reason = ok_reason
    if not ok:
        raise CapabilityError(f"{what} requested but unavailable: {reason}")


def host_versions() -> dict[str, str | None]:
    """QEMU, libvirt and Open vSwitch as this host's binaries report them."""
    return {
        "qemu": _version(["qemu-system-x86_64", "--version"], r"version ([\d.]+)"),
        "libvirt": _version(["libvirtd", "--version"], r"([\d.]+)\s*$"),
        "ovs": _version(["ovs-vswitchd", "--version"], r"\) ([\d.]+)"),
    }


__all__ = ["host_versions", "kvm_device", "macvtap", "ovs_kernel_datapath", "ovs_running", "require",
           "vhost_net", "vxlan"]
