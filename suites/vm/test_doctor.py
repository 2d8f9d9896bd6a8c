"""`testbed doctor` against facts established independently here."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from testbed.admin import capabilities
from testbed.guests import images
from testbed.topology.model import Accelerator


def test_doctor_matches_independent_facts(accelerator):
    p = subprocess.run([sys.executable, "-m", "testbed.cli", "doctor", "--json"], capture_output=True,
                       text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    d = json.loads(p.stdout)
    # vhost-net: usable exactly when the device node opens.
    try:
        os.close(os.open("/dev/vhost-net", os.O_RDWR))
        vhost = True
    except OSError:
        vhost = False
    assert d["vhost_net"]["ok"] is vhost
    # The OVS kernel datapath needs the openvswitch module.
    if d["ovs"]["ok"]:
        assert d["ovs_datapath"] == ("kernel" if Path("/sys/module/openvswitch").exists() else "userspace")
    # TCG must boot a stock kernel anywhere QEMU runs; the accelerator matches the session's probe.
    assert d["tcg"]["ok"] is True
    assert d["accelerator"] == accelerator.value
    # KVM: the doctor's verdict equals a fresh probe boot of the same stock kernel.
    kernel = images.ensure().kernel
    fresh = capabilities.probe_boot(kernel, Accelerator.KVM, timeout=30)
    assert d["kvm"]["ok"] is fresh.ok, (d["kvm"], fresh)
    for tool in ("qemu", "libvirt", "netperf", "iperf3"):
        assert d["versions"][tool], tool
    # The guest image's tools are the ones its manifest recorded from its own binaries.
    img = images.ensure()
    assert d["guest_tools"] == img.tools and d["guest_image"] == f"{img.name}-{img.digest}"
    if img.tools is not None:
        assert {"netperf", "iperf3"} <= set(img.tools)
