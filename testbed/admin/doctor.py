"""`testbed doctor`: what this host can run, found by trying, in one report.

It sits above the host probes (testbed.admin.capabilities), the guest image and the mode registry:
each registered attachment mode answers for itself, so a new mode needs no line here."""
from __future__ import annotations

from pathlib import Path

from testbed import attachments
from testbed.admin.capabilities import Item, Report, accelerator_probe, hop_tracing, tool_versions, vhost_net
from testbed.guests import images


def probe_kernel() -> Path:
    """A stock Debian kernel to probe with: the guest image's own, built if needed."""
    img = images.ensure()
    assert img.kernel is not None
    return img.kernel


def doctor() -> Report:
    img = images.ensure()
    kernel = probe_kernel()
    kvm, tcg = accelerator_probe(str(kernel))
    vh = vhost_net()
    return Report(
        kvm=Item(kvm.ok, f"stock kernel booted in {kvm.seconds:.1f} s" if kvm.ok else kvm.reason),
        tcg=Item(tcg.ok, f"stock kernel booted in {tcg.seconds:.1f} s" if tcg.ok else tcg.reason),
        vhost_net=Item(*vh),
        host=host_facts(),
        versions=tool_versions(),
        probe_kernel=str(kernel),
        guest_tools=img.tools,
        guest_image=f"{img.name}-{img.digest}",
        attachments=attachment_modes(),
    )


def host_facts() -> dict:
    """What the registered modes depend on, each fact asked once (modes that share one, such
    as the two VXLAN modes, give the same key)."""
    out: dict = {}
    for m in attachments.modes():
        for k, v in m.doctor().items():
            out.setdefault(k, Item(*v) if isinstance(v, tuple) else v)
    out["hop-trace"] = Item(*hop_tracing())
    return out


def attachment_modes() -> dict[str, Item]:
    """Each registered attachment mode: whether this host can run it, found by trying."""
    out = {}
    for m in attachments.modes():
        why = m.unavailable()
        out[m.name] = Item(why is None, why or "")
    return out
