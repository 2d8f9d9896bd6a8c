"""The environment fingerprint every run records: enough to tell whether two runs may be compared."""
from __future__ import annotations

import os
import platform
import socket
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import psutil

from testbed import __version__
from testbed.errors import CommandError
from testbed.host import hostid, paths, probes, proc
from testbed.topology.model import Accelerator


def cpu_model() -> tuple[str, float | None]:
    model = "unknown"
    mhz: float | None = None
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name") and model == "unknown":
                model = line.split(":", 1)[1].strip()
            elif line.startswith("cpu MHz") and mhz is None:
                mhz = float(line.split(":", 1)[1])
    except OSError:
        pass
    freq = psutil.cpu_freq()
    if freq and freq.max:
        mhz = freq.max
    return model, mhz


def git_commit() -> str | None:
    try:
        return proc.run(["git", "-C", str(Path(__file__).parent), "rev-parse", "HEAD"],
                        timeout=5).stdout.strip() or None
    except CommandError:
        return None


def fingerprint(accel: Accelerator | None, *, image: Any = None, extra: dict | None = None,
                nics: tuple[str, ...] | list[str] = (), versions: Mapping[str, str | None] | None = None) -> dict:
    """None for accel: a run of namespace endpoints only, where no guest runs. ``nics``: the
    real NICs under test, whose IRQ affinity the tuning record gives. ``versions``: the
    programs' versions to record (a run's session passes the traffic tools' too:
    testbed.admin.capabilities.tool_versions); by default this host's QEMU, libvirt, OVS."""
    from testbed.host import tuning
    model, mhz = cpu_model()
    return {
        "host": socket.gethostname(),
        "kernel": platform.release(),
        "accelerator": accel.value if accel else "none",
        # TCG figures are functional checks: they must never be compared with KVM ones.
        "comparable_class": {Accelerator.KVM: "kvm", Accelerator.TCG: "tcg-functional-only",
                             None: "host-namespaces"}[accel],
        "cpu_model": model,
        "cpu_mhz": mhz,
        "cpus": os.cpu_count(),
        "memory_bytes": psutil.virtual_memory().total,
        "versions": dict(versions) if versions is not None else probes.host_versions(),
        "vhost_net": probes.vhost_net()[0],
        "image": None if image is None else {"name": image.name, "digest": image.digest,
                                             "kernel": image.kernel_version,
                                             # versions as the guest's own binaries report them
                                             "tools": getattr(image, "tools", None)},
        "testbed": __version__,
        "testbed_commit": git_commit(),
        # run beside other testbed runs (--shared-host): its figures had neighbours by design
        "shared_host": paths.shared_host(),
        # governor, turbo, C-states, SMT, NUMA, IRQ affinity, kernel command line, THP
        "tuning": tuning.local(nics),
        # machine_id, its source, host_class, inventory_host: which host measured (testbed.host.hostid)
        **hostid.identity(),
        **(extra or {}),
    }


_REMOTE_PROBE = r"""
echo "host=$(uname -n)"; echo "kernel=$(uname -r)"; echo "cpus=$(nproc)"
echo "cpu_model=$(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -1)"
echo "memory_kib=$(sed -n 's/^MemTotal:[[:space:]]*\([0-9]*\).*/\1/p' /proc/meminfo)"
echo "qemu=$(qemu-system-x86_64 --version 2>/dev/null | head -1)"
echo "libvirt=$(libvirtd --version 2>/dev/null | head -1)"
echo "ovs=$(ovs-vsctl --version 2>/dev/null | head -1)"
[ -c /dev/kvm ] && [ -w /dev/kvm ] && echo kvm_device=yes || echo kvm_device=no
[ -c /dev/vhost-net ] && echo vhost_net_device=yes || echo vhost_net_device=no
""" + hostid.REMOTE_PROBE


def parse_remote_probe(text: str) -> dict[str, str]:
    """Pure: the key=value lines of _REMOTE_PROBE."""
    return dict(line.split("=", 1) for line in text.splitlines() if "=" in line)


def remote_fingerprint(shell: Any, uri: str) -> dict:
    """A remote host's environment, read there in one ssh round trip. Device presence is
    what a file test can tell; whether KVM really boots there shows in the guest's domain."""
    kv = parse_remote_probe(shell.run(["sh", "-c", _REMOTE_PROBE], timeout=60).stdout)
    mem = kv.get("memory_kib", "")
    return {
        "host": kv.get("host"), "kernel": kv.get("kernel"),
        "cpus": int(kv["cpus"]) if kv.get("cpus", "").isdigit() else None,
        "cpu_model": kv.get("cpu_model"),
        "memory_bytes": int(mem) * 1024 if mem.isdigit() else None,
        "versions": {"qemu": kv.get("qemu") or None, "libvirt": kv.get("libvirt") or None,
                     "ovs": kv.get("ovs") or None},
        "kvm_device": kv.get("kvm_device") == "yes",
        "vhost_net_device": kv.get("vhost_net_device") == "yes",
        **hostid.peer_identity(shell.host.name, kv.get("machine_id") or None),
    }
