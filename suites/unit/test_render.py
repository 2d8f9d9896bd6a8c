"""Templates: golden files, libvirt's own schema, and escaping of hostile values."""
from __future__ import annotations

import os
import shutil
import subprocess
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
import yaml

from testbed.guests import render

GOLDEN = Path(__file__).parent / "golden"
UPDATE = os.environ.get("UPDATE_GOLDEN") == "1"

DOMAIN = render.DomainParams(
    name="tb-ab12-g1", run_id="20260101T000000Z-ab12", domain_type="qemu", memory_mib=1024, vcpus=1,
    disk="/var/lib/testbed/tb-ab12/tb-ab12-g1.qcow2", seed="/var/lib/testbed/tb-ab12/tb-ab12-g1-seed.iso",
    console_log="/var/lib/testbed/tb-ab12/tb-ab12-g1.console.log", kernel="/var/cache/testbed/images/x/vmlinuz",
    initrd="/var/cache/testbed/images/x/initrd.img", cmdline="root=/dev/vda rw console=ttyS0")

NICS = {
    "bridge": render.NicParams("bridge", "tb-ab12-br", "tb-ab12-t0", "52:54:ab:12:00:00", "qemu", 9000),
    "ovs": render.NicParams("ovs", "tb-ab12-ovs", "tb-ab12-t0", "52:54:ab:12:00:00", "vhost", 1500, queues=4),
    "direct": render.NicParams("direct", "tb-ab12-lw0", "tb-ab12-m0", "52:54:ab:12:00:00", "qemu", 1500,
                               options=(("mode", "vepa"),)),
    "ethernet": render.NicParams("ethernet", "", "tb-ab12-t0", "52:54:ab:12:00:00", "qemu", 1500,
                                 checksum_offload=False),
    # A macvtap the testbed made on an emulated host's wire end; libvirt only opens it.
    "ethernet-macvtap": render.NicParams("ethernet", "", "tb-ab12-t1", "52:54:ab:12:00:01", "qemu", 1500,
                                         options=(("managed", "no"),)),
}


def golden(name: str, text: str) -> None:
    path = GOLDEN / name
    if UPDATE:
        path.write_text(text)
    assert path.read_text() == text, f"{name} differs from golden file (UPDATE_GOLDEN=1 to refresh)"


def _validate(tmp_path: Path, text: str, kind: str) -> None:
    if not shutil.which("virt-xml-validate"):
        pytest.skip("virt-xml-validate missing (package libvirt-clients)")
    f = tmp_path / f"{kind}.xml"
    f.write_text(text)
    p = subprocess.run(["virt-xml-validate", str(f), kind], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stdout + p.stderr


def test_domain_golden_and_schema(tmp_path):
    xml = render.domain_xml(DOMAIN)
    golden("domain.xml", xml)
    _validate(tmp_path, xml, "domain")


def test_domain_user_image_boots_from_disk(tmp_path):
    import dataclasses
    xml = render.domain_xml(dataclasses.replace(DOMAIN, kernel=None, initrd=None, cmdline="", domain_type="kvm"))
    root = ET.fromstring(xml)
    assert root.find("os/kernel") is None and root.find("os/boot").get("dev") == "hd"
    assert root.find("cpu").get("mode") == "host-passthrough"
    _validate(tmp_path, xml, "domain")


def test_domain_has_spare_hotplug_ports():
    root = ET.fromstring(render.domain_xml(DOMAIN))
    ports = [c for c in root.iter("controller") if c.get("model") == "pcie-root-port"]
    assert len(ports) == 4 + DOMAIN.hotplug_slots


@pytest.mark.parametrize("kind", sorted(NICS))
def test_interface_golden_and_schema(tmp_path, kind):
    xml = render.interface_xml(NICS[kind])
    golden(f"interface-{kind}.xml", xml)
    # An interface is validated inside a domain: libvirt's schema has no standalone interface root.
    dom = render.domain_xml(DOMAIN).replace("</devices>", xml + "</devices>")
    _validate(tmp_path, dom, "domain")


def test_values_are_escaped_in_xml():
    import dataclasses
    hostile = dataclasses.replace(DOMAIN, cmdline="root=/dev/vda x='</cmdline><evil/>' & y")
    root = ET.fromstring(render.domain_xml(hostile))
    assert root.find("os/cmdline").text == "root=/dev/vda x='</cmdline><evil/>' & y"
    assert root.find(".//evil") is None


def test_cloud_init_golden():
    files = render.cloud_init("g1", "20260101T000000Z-ab12", "tb-ab12-g1-20260101T000000Z-ab12")
    golden("user-data", files.user_data)
    golden("meta-data", files.meta_data)
    golden("network-config", files.network_config)
    ud = yaml.safe_load(files.user_data)
    assert files.user_data.startswith("#cloud-config\n")
    assert ud["ssh_pwauth"] is False and ud["users"] == [] and "password" not in files.user_data
    assert yaml.safe_load(files.network_config) == {"config": "disabled"}


def test_cloud_init_boot_nics_and_hostile_values():
    nic = render.BootNic("eth1", "52:54:00:00:00:01", 9000, "198.18.0.1/24")
    files = render.cloud_init("g1\nruncmd: [reboot]", "r", "i", [nic])
    golden("network-config-static", files.network_config)
    ud = yaml.safe_load(files.user_data)
    assert ud["hostname"] == "g1\nruncmd: [reboot]" and "runcmd" not in ud
    nc = yaml.safe_load(files.network_config)
    assert nc["ethernets"]["eth1"]["mtu"] == 9000
    assert nc["ethernets"]["eth1"]["addresses"] == ["198.18.0.1/24"]


def test_missing_value_is_an_error():
    import jinja2
    with pytest.raises(jinja2.UndefinedError):
        render.render("libvirt/nic/bridge.xml.j2", kind="bridge")


def test_variant_machine_type_and_nic_driver_options():
    import dataclasses
    import xml.etree.ElementTree as ET
    pc = ET.fromstring(render.domain_xml(dataclasses.replace(DOMAIN, machine="pc",
                                                             emulator="/opt/q/qemu")))
    assert pc.find("os/type").get("machine") == "pc"
    assert pc.find("devices/emulator").text == "/opt/q/qemu"
    assert [c.get("model") for c in pc.findall("devices/controller[@type='pci']")] == ["pci-root"]
    q35 = ET.fromstring(render.domain_xml(DOMAIN))
    assert q35.find("os/type").get("machine") == "q35"
    assert "pcie-root-port" in {c.get("model") for c in q35.findall("devices/controller")}
    nic = dataclasses.replace(NICS["ovs"], driver_options=(("event_idx", "off"), ("rx_queue_size", "512")))
    drv = ET.fromstring(render.interface_xml(nic)).find("driver")
    assert (drv.get("queues"), drv.get("rx_queue_size"), drv.get("event_idx")) == ("4", "512", "off")
