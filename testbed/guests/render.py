"""Pure renderers: model values in, text out. All markup lives in templates/.

One jinja2 Environment with StrictUndefined (a missing value is an error, never an empty
string) and autoescaping for XML templates, so no value can inject markup.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache

import jinja2

from testbed.host import paths


@cache
def env() -> jinja2.Environment:
    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(paths.templates_dir())),
        undefined=jinja2.StrictUndefined,
        autoescape=jinja2.select_autoescape(enabled_extensions=("xml.j2", "xml"),
                                            default_for_string=False, default=False),
        keep_trailing_newline=True,
    )


def render(template: str, **values) -> str:
    return env().get_template(template).render(**values)


@dataclass(frozen=True)
class DomainParams:
    name: str
    run_id: str
    domain_type: str           # kvm | qemu (TCG)
    memory_mib: int
    vcpus: int
    disk: str
    seed: str
    console_log: str
    kernel: str | None
    initrd: str | None
    cmdline: str
    emulator: str = "/usr/bin/qemu-system-x86_64"
    hotplug_slots: int = 4
    #: machine type; q35 (and pc-q35-*) get PCIe root ports for hot-plug, pc (i440fx)
    #: hot-plugs into its PCI root bus
    machine: str = "q35"
    #: placement (model.Placement), as libvirt writes it: one cpulist per vCPU (empty: not
    #: pinned), the emulator's and the IO threads' cpulists, the NUMA node the memory is
    #: bound to, the huge page size (KiB) and the CPU mode; see placement_params
    vcpupins: tuple[str, ...] = ()
    emulatorpin: str | None = None
    iothreads: int = 0
    iothreadpin: str | None = None
    numa_node: int | None = None
    hugepages_kib: int | None = None
    cpu_mode: str | None = None


def placement_params(p) -> dict:  # p: model.Placement
    """DomainParams' placement fields from a guest's placement."""
    from testbed.topology.model import cpulist
    return {"vcpupins": tuple(cpulist(s) for s in p.vcpus) if p.vcpus else (),
            "emulatorpin": cpulist(p.emulator) if p.emulator else None,
            "iothreads": p.iothread_count,
            "iothreadpin": cpulist(p.iothreads) if p.iothreads else None,
            "numa_node": p.numa_node, "hugepages_kib": p.hugepages_kib,
            "cpu_mode": p.cpu_mode.value if p.cpu_mode else None}


def domain_xml(p: DomainParams) -> str:
    return render("libvirt/domain.xml.j2", **p.__dict__)


@dataclass(frozen=True)
class NicParams:
    #: the libvirt interface kind: templates/libvirt/nic/<kind>.xml.j2 renders it (bridge,
    #: ovs, direct, ethernet today; a mode with a new kind of NIC adds its template)
    kind: str
    source: str                # bridge name, or macvtap lower device
    target: str                # host-side device name (tb- prefixed)
    mac: str
    driver: str                # vhost | qemu
    mtu: int
    queues: int = 1
    #: False: the virtio device offers no checksum/segmentation offload to the guest
    checksum_offload: bool = True
    #: what only this kind's template reads, as (name, value) pairs: direct's ``mode``,
    #: ethernet's ``managed`` ("no": the target exists already and libvirt opens it as it is)
    options: tuple[tuple[str, str], ...] = ()
    #: extra <driver> attributes from a variant (rx_queue_size, tx_queue_size, event_idx)
    driver_options: tuple[tuple[str, str], ...] = ()


def interface_xml(p: NicParams) -> str:
    return render(f"libvirt/nic/{p.kind}.xml.j2", **{**p.__dict__, "options": dict(p.options)})


@dataclass(frozen=True)
class BootNic:
    name: str
    mac: str
    mtu: int
    address: str               # CIDR


@dataclass(frozen=True)
class SeedUser:
    """A login user the seed asks cloud-init for: no password, its ssh keys authorized."""

    name: str
    ssh_keys: tuple[str, ...] = ()


@dataclass(frozen=True)
class SeedFiles:
    user_data: str
    meta_data: str
    network_config: str


def cloud_init(hostname: str, run_id: str, instance_id: str,
               nics: Sequence[BootNic] = (), users: Sequence[SeedUser] = ()) -> SeedFiles:
    return SeedFiles(
        user_data=render("cloud-init/user-data.j2", hostname=hostname, run_id=run_id, users=list(users)),
        meta_data=render("cloud-init/meta-data.j2", hostname=hostname, instance_id=instance_id),
        network_config=render("cloud-init/network-config.j2", nics=list(nics)),
    )
