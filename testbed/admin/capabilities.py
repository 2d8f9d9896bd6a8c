"""What this host can do, each item found by trying it.

The accelerator probe boots a stock kernel with a trivial init that prints a marker and
powers off. /dev/kvm existing proves nothing: on some hosts it only runs specially built
kernels, so a real boot is the only honest test. The same probe, timed, is the floor that
the boot benchmark compares a full guest against.
"""
from __future__ import annotations

import functools
import logging
import os
import shutil
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from testbed import tools
from testbed.errors import CapabilityError, CommandError, TestbedError
from testbed.host import paths, proc
from testbed.host.probes import (  # noqa: F401 (the host probes, under their old names here too)
    _opens,
    _version,
    host_versions,
    kvm_device,
    macvtap,
    ovs_kernel_datapath,
    ovs_running,
    require,
    vhost_net,
    vxlan,
)
from testbed.topology.model import Accelerator

log = logging.getLogger(__name__)

PROBE_MARKER = "TB-PROBE-OK"
PROBE_TIMEOUT_S = 60.0
_INIT = f"""#!/bin/busybox sh
/bin/busybox echo {PROBE_MARKER}
/bin/busybox poweroff -f
"""


def probe_initrd() -> Path:
    """A cpio initramfs with static busybox and an init that prints the marker and powers off."""
    out = paths.cache_dir() / "probe" / "init.cpio"
    if out.is_file():
        return out
    busybox = shutil.which("busybox")
    if not busybox:
        raise CapabilityError("busybox (static) is missing: install busybox-static")
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="tb-probe-") as d:
        root = Path(d)
        (root / "bin").mkdir()
        shutil.copy2(busybox, root / "bin" / "busybox")
        (root / "init").write_text(_INIT)
        os.chmod(root / "init", 0o755)
        listing = "\n".join(["bin", "bin/busybox", "init"]) + "\n"
        res = proc.run(["cpio", "--quiet", "-o", "-H", "newc", "-O", str(out) + ".tmp"],
                       cwd=d, input=listing, timeout=60)
        del res
    os.replace(str(out) + ".tmp", out)
    return out


@dataclass(frozen=True)
class ProbeBoot:
    accelerator: Accelerator
    ok: bool
    seconds: float
    reason: str = ""


def probe_boot(kernel: Path, accel: Accelerator, timeout: float = PROBE_TIMEOUT_S) -> ProbeBoot:
    """Boot `kernel` to the trivial init under `accel`; ok only if the marker came out."""
    argv = ["qemu-system-x86_64", "-accel", accel.value, "-machine", "q35", "-m", "256",
            "-display", "none", "-serial", "stdio", "-monitor", "none", "-no-reboot",
            "-nodefaults", "-kernel", str(kernel), "-initrd", str(probe_initrd()),
            "-append", "console=ttyS0 panic=-1 quiet rdinit=/init"]
    if accel is Accelerator.KVM:
        argv += ["-cpu", "host"]
    start = time.monotonic()
    try:
        res = proc.run(argv, timeout=timeout, check=False)
    except CommandError as e:
        if e.timed_out:
            return ProbeBoot(accel, False, timeout, f"no marker within {timeout:.0f} s (guest hung)")
        return ProbeBoot(accel, False, time.monotonic() - start, str(e))
    took = time.monotonic() - start
    if PROBE_MARKER in res.stdout:
        return ProbeBoot(accel, True, took)
    tail = " | ".join((res.stderr or res.stdout).strip().splitlines()[-3:])
    return ProbeBoot(accel, False, took, f"qemu exited {res.rc} without the marker: {tail}"[:300])


def tool_versions() -> dict[str, str | None]:
    return {
        **host_versions(),
        # the per-hop tracer (testbed.measure.hops)
        "bpftrace": _version(["bpftrace", "--version"], r"v([\d.]+)"),
        # each traffic tool the way its driver asks it
        **{d.name.value: _version([d.name.value, *d.version_args], d.version_re) for d in tools.drivers()},
    }


@dataclass(frozen=True)
class Item:
    ok: bool
    detail: str = ""


@dataclass(frozen=True)
class Report:
    kvm: Item
    tcg: Item
    vhost_net: Item
    #: what the attachment modes depend on (each mode's ``doctor``): ovs, its datapath,
    #: macvtap, vxlan, ... An Item, or a word; written beside the fixed keys in as_dict
    host: dict = field(default_factory=dict)
    versions: dict = field(default_factory=dict)
    probe_kernel: str = ""
    #: traffic tools in the guest image, with the versions the image's own binaries report
    #: (recorded in its manifest at build time); None: the image records none
    guest_tools: dict | None = None
    guest_image: str = ""
    #: every registered attachment mode (testbed/attachments): can this host run it, and if
    #: not, why (each found by trying)
    attachments: dict = field(default_factory=dict)

    @property
    def accelerator(self) -> Accelerator | None:
        if self.kvm.ok:
            return Accelerator.KVM
        return Accelerator.TCG if self.tcg.ok else None

    def as_dict(self) -> dict:
        d = asdict(self)
        d.update(d.pop("host"))
        d["accelerator"] = self.accelerator.value if self.accelerator else None
        return d


# Each probe boot is made once per process (a scenario runs the runner several times, a
# test worker many): what it found does not change while the process lives.
@functools.cache
def kvm_probe(kernel: str) -> ProbeBoot:
    dev_ok, dev_reason = kvm_device()
    return probe_boot(Path(kernel), Accelerator.KVM, timeout=30) if dev_ok else \
        ProbeBoot(Accelerator.KVM, False, 0, dev_reason)


@functools.cache
def tcg_probe(kernel: str) -> ProbeBoot:
    return probe_boot(Path(kernel), Accelerator.TCG)


def accelerator_probe(kernel: str) -> tuple[ProbeBoot, ProbeBoot]:
    return kvm_probe(kernel), tcg_probe(kernel)


def choose_accelerator(requested: str, kernel: Path) -> Accelerator:
    """kvm if a stock kernel really boots under it, else tcg; a requested one that is missing
    is an error. Only the boots the choice needs are tried: the TCG boot (seconds of CPU) is
    not made when KVM is asked for or works."""
    if requested != "tcg":
        kvm = kvm_probe(str(kernel))
        if kvm.ok:
            return Accelerator.KVM
        if requested == "kvm":
            raise CapabilityError(f"accelerator kvm requested but unusable: {kvm.reason}")
    tcg = tcg_probe(str(kernel))
    if tcg.ok:
        return Accelerator.TCG
    if requested == "tcg":
        raise CapabilityError(f"accelerator tcg requested but unusable: {tcg.reason}")
    raise CapabilityError(f"no guest can run here: kvm: {kvm.reason}; tcg: {tcg.reason}")


def hop_tracing() -> tuple[bool, str]:
    """Per-hop latency tracing (testbed.measure.hops): bpftrace, tracefs and the probes it
    attaches here, found by attaching them."""
    from testbed.host.bpftrace import host_flavour
    flavour, detail = host_flavour()
    return flavour is not None, detail


__all__ = ["choose_accelerator", "probe_boot", "vhost_net", "macvtap", "vxlan",
           "ovs_kernel_datapath", "Report", "TestbedError"]
