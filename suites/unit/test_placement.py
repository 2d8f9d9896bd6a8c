"""Placement in the topology: read, checked against this host (its CPUs from
sched_getaffinity, its NUMA nodes from /sys/devices/system/node), rendered into libvirt's
cputune/numatune/memoryBacking (golden file, libvirt's own schema); and the pure checks of
what a sample observed."""
from __future__ import annotations

import dataclasses
import os
import shutil
import subprocess
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from testbed import cli
from testbed.errors import CapabilityError
from testbed.guests import render
from testbed.host import placement
from testbed.measure import runner
from testbed.topology import config
from testbed.topology.model import CpuMode, NoiseAction, Placement, cpulist, parse_cpulist

GOLDEN = Path(__file__).parent / "golden"
CPUS = sorted(os.sched_getaffinity(0))

BASE = """\
accelerator: tcg
guests:
  - name: g1
    placement:
{g1}
  - name: g2
{g2}
matrix:
  attachments: [bridge]
  profiles: [{{name: tcp_rr, pattern: rr, message_size: 1, response_size: 1, duration: 3}}]
{extra}
"""


def topo(g1: str, g2: str = "", extra: str = "") -> str:
    ind = lambda s, n: "\n".join(" " * n + line for line in s.strip().splitlines())  # noqa: E731
    return BASE.format(g1=ind(g1, 6), g2=ind(g2, 4) if g2 else "", extra=extra)


def run_validate(tmp_path: Path, text: str, capsys) -> tuple[int, str]:
    f = tmp_path / "t.yaml"
    f.write_text(text)
    rc = cli.main(["validate", str(f)])
    return rc, capsys.readouterr().err


# --------------------------------------------------------------------------- bad input

def test_cpu_the_host_lacks_is_exit_2_naming_the_field(tmp_path, capsys):
    rc, err = run_validate(tmp_path, topo("vcpus: {pin: [99]}"), capsys)
    assert rc == 2
    assert err.count("\n") == 1 and "Traceback" not in err
    assert "t.yaml:5: guests[0].placement.vcpus.pin: CPU 99 is not on this host" in err, err


def test_numa_node_the_host_lacks_is_exit_2_naming_the_field(tmp_path, capsys):
    nodes = placement.numa_nodes()
    assert 7 not in nodes, "this host has a node 7: the test needs a node it lacks"
    rc, err = run_validate(tmp_path, topo("numa: {node: 7}"), capsys)
    assert rc == 2 and err.count("\n") == 1
    assert "guests[0].placement.numa.node: NUMA node 7 is not on this host" in err, err


@pytest.mark.parametrize("field", ["emulator", "iothreads", "vhost"])
def test_other_pins_checked_too(tmp_path, capsys, field):
    rc, err = run_validate(tmp_path, topo(f"{field}: {{pin: \"0,99\"}}"), capsys)
    assert rc == 2 and f"guests[0].placement.{field}.pin: CPU 99 is not on this host" in err, err


@pytest.mark.parametrize("text, msg", [
    ("vcpus: {pin: [[0], [0]]}", "2 CPU sets for 1 vCPU(s)"),
    ("vcpus: {pin: \"1-0\"}", "not a CPU list"),
    ("vcpus: {pin: \"0\\n\"}", "not a CPU list"),
    ("vcpus: {pin: \"²\"}", "not a CPU list"),
    ("emulator: {pin: \"" + ",".join(["0-1"] * 400) + "\"}", "at most 1024 characters"),
    ("vcpus: {pin: []}", "needs at least 1 item"),
    ("vcpus: {pin: true}", "expected CPU numbers"),
    ("memory: {hugepages: 3M}", "not a power of two"),
    ("memory: {hugepages: lots}", "expected a size such as 2M"),
    ("cpu: {mode: host-passthrough}", "needs KVM"),
    ("cpu: {mode: turbo}", "unknown value 'turbo'"),
    ("numa: {node: -1}", "out of range"),
    ("vcpus: {cpus: [0]}", "unknown key"),
])
def test_bad_placement_values(tmp_path, capsys, text, msg):
    rc, err = run_validate(tmp_path, topo(text), capsys)
    assert rc == 2 and msg in err and "guests[0].placement" in err, err


def test_vcpu_overlap_refused_unless_allowed(tmp_path, capsys):
    text = topo("vcpus: {pin: [0]}", "placement: {vcpus: {pin: \"0\"}}")
    rc, err = run_validate(tmp_path, text, capsys)
    assert rc == 2 and "guests[1].placement.vcpus.pin: g2 vCPUs on CPU 0 overlaps g1 vCPUs" in err, err
    rc, err = run_validate(tmp_path, text + "placement: {allow_overlap: true}\n", capsys)
    assert rc == 0, err


def test_vcpu_and_emulator_overlap_refused_emulator_and_vhost_may_share(tmp_path, capsys):
    rc, err = run_validate(tmp_path, topo("vcpus: {pin: [0]}\nemulator: {pin: [0]}"), capsys)
    assert rc == 2 and "placement.emulator.pin" in err and "overlaps g1 vCPUs" in err, err
    if len(CPUS) >= 2:
        rc, err = run_validate(tmp_path, topo(f"vcpus: {{pin: [{CPUS[0]}]}}\nemulator: {{pin: [{CPUS[1]}]}}\n"
                                              f"vhost: {{pin: [{CPUS[1]}]}}"), capsys)
        assert rc == 0, err


def test_vhost_pin_within_the_emulator_pin(tmp_path, capsys):
    if len(CPUS) < 2:
        pytest.skip("needs two CPUs")
    rc, err = run_validate(tmp_path, topo(f"emulator: {{pin: [{CPUS[0]}]}}\nvhost: {{pin: [{CPUS[1]}]}}"), capsys)
    assert rc == 2 and "guests[0].placement.vhost.pin" in err and "within emulator.pin" in err, err


def test_harness_cpus_and_guest_pins(tmp_path, capsys):
    if len(CPUS) < 2:
        pytest.skip("needs two CPUs")
    a, b = CPUS[0], CPUS[1]
    rc, err = run_validate(tmp_path, topo(f"vcpus: {{pin: [{a}]}}", extra=f"placement: {{harness: [{a}]}}"), capsys)
    assert rc == 2 and f"CPU {a} is also in placement.harness" in err, err
    rc, err = run_validate(tmp_path, topo(f"vcpus: {{pin: [{b}]}}", extra=f"placement: {{harness: [{a}]}}"), capsys)
    assert rc == 0, err
    rc, err = run_validate(tmp_path, topo(f"vcpus: {{pin: [{b}]}}", extra=f"placement: {{harness: \"{cpulist(set(CPUS))}\"}}"),
                           capsys)
    assert rc == 2 and "placement.harness" in err and "every CPU" in err, err


NETNS = """\
matrix:
  attachments: [{att}]
  profiles: [{{name: tcp_rr, pattern: rr, message_size: 1, response_size: 1, duration: 3}}]
placement: {{{placement}}}
"""


def netns_topo(placement_text: str, att: str = "netns-bridge") -> str:
    return NETNS.format(att=att, placement=placement_text)


def test_endpoint_pins_read_and_checked(tmp_path, capsys):
    if len(CPUS) < 2:
        pytest.skip("needs two CPUs")
    a, b = CPUS[0], CPUS[1]
    f = tmp_path / "t.yaml"
    f.write_text(netns_topo(f"endpoints: {{client: [{a}], server: \"{b}\"}}"))
    t = config.load(f)
    assert t.endpoint_pins is not None and t.endpoint_pins.client == (a,) and t.endpoint_pins.server == (b,)
    for text, msg in [
        ("endpoints: {client: [99], server: [0]}", "placement.endpoints.client: CPU 99 is not on this host"),
        ("endpoints: {client: [0]}", "placement.endpoints: missing"),
        ("endpoints: {client: [0], server: [1], both: [0]}", "unknown key"),
        (f"endpoints: {{client: [{a}], server: [{a}]}}",
         f"placement.endpoints.server: CPU {a} is also the client's"),
        (f"harness: [{a}], endpoints: {{client: [{a}], server: [{b}]}}",
         f"placement.endpoints.client: CPU {a} is also in placement.harness"),
        (f"switch: [{b}], endpoints: {{client: [{a}], server: [{b}]}}",
         f"placement.endpoints.server: CPU {b} is also in placement.switch (ovs-vswitchd)"),
        ("switch: [99], endpoints: {client: [0], server: [1]}", "placement.switch: CPU 99 is not on this host"),
    ]:
        rc, err = run_validate(tmp_path, netns_topo(text), capsys)
        assert rc == 2 and msg in err and err.count("\n") == 1, (text, err)
    # the same CPU on purpose (the same-core path) when overlap is allowed
    rc, err = run_validate(tmp_path, netns_topo(f"allow_overlap: true, endpoints: {{client: [{a}], server: [{a}]}}"),
                           capsys)
    assert rc == 0, err


def test_endpoint_pins_without_namespace_endpoints_are_refused(tmp_path, capsys):
    text = netns_topo("endpoints: {client: [0], server: [0]}, allow_overlap: true", att="bridge")
    rc, err = run_validate(tmp_path, "accelerator: tcg\nguests: [{name: g1}, {name: g2}]\n" + text, capsys)
    assert rc == 2 and "placement.endpoints: pins the tools of namespace endpoints" in err \
        and "guests[].placement" in err, err


def test_endpoint_check_names_what_was_asked_and_seen():
    seen = {10: ("netperf", frozenset({(0,)})), 11: ("netperf", frozenset({(0,), (1,)}))}
    bad = placement.check_endpoint("tb-x-a", "client", (0,), seen, {10: 0, 11: 0})
    assert bad == ["tb-x-a: placement.endpoints.client asked CPUs 0, thread 11 (netperf) was allowed 1"]
    # allowed as asked but ran elsewhere (a pin /proc says held, the scheduler did not keep)
    assert placement.check_endpoint("tb-x-a", "client", (0,), {10: ("netperf", frozenset({(0,)}))}, {10: 1}) == \
        ["tb-x-a: placement.endpoints.client asked CPUs 0, thread 10 (netperf) ran mostly on CPU 1"]
    assert placement.check_endpoint("tb-x-a", "client", (0,), {10: ("netperf", frozenset({(0,)}))}, {10: 0}) == []


def test_pins_with_pairs_refused(tmp_path, capsys):
    text = topo("vcpus: {pin: [0]}").replace("attachments: [bridge]", "attachments: [bridge]\n  pairs: [1, 2]")
    rc, err = run_validate(tmp_path, text, capsys)
    assert rc == 2 and "matrix.pairs" in err and "clone" in err, err


def test_noise_fields(tmp_path, capsys):
    t = config.parse(topo("vcpus: {pin: [0]}", extra="noise: {threshold_cores: 0.3, action: keep, max_retries: 1, "
                                                      "quiet_start: {bound_cores: 0.2, for_s: 5, timeout_s: 60}}"))
    assert t.noise.threshold_cores == 0.3 and t.noise.action is NoiseAction.KEEP and t.noise.max_retries == 1
    assert t.noise.quiet_start.for_s == 5
    rc, err = run_validate(tmp_path, topo("vcpus: {pin: [0]}", extra="noise: {settle: {for_s: 10, timeout_s: 5}}"),
                           capsys)
    assert rc == 2 and "noise.settle.timeout_s" in err and "shorter than for_s" in err, err
    assert config.parse(topo("vcpus: {pin: [0]}")).noise.action is NoiseAction.RETRY    # the stated default


def test_one_set_repeats_per_vcpu_and_enters_the_cell_definition():
    t = config.parse(topo("vcpus: {pin: \"0\"}").replace("- name: g1", "- name: g1\n    vcpus: 2")
                     .replace("placement:\n      vcpus", "placement:\n      vcpus"))
    p = t.guest("g1").placement
    assert p.vcpus == ((0,), (0,))
    plain = config.parse(topo("{}").replace("placement:\n      {}", "memory_mib: 1024"))
    [c1], [c0] = runner.plan(t), runner.plan(plain)
    assert c1.id == c0.id and c1.hash != c0.hash
    assert dict(c1.context)["client.placement"] == "vcpus=0/0"


# --------------------------------------------------------------------------- rendering

DOMAIN = render.DomainParams(
    name="tb-ab12-g1", run_id="20260101T000000Z-ab12", domain_type="qemu", memory_mib=1024, vcpus=2,
    disk="/var/lib/testbed/tb-ab12/tb-ab12-g1.qcow2", seed="/var/lib/testbed/tb-ab12/tb-ab12-g1-seed.iso",
    console_log="/var/lib/testbed/tb-ab12/tb-ab12-g1.console.log", kernel="/var/cache/testbed/images/x/vmlinuz",
    initrd="/var/cache/testbed/images/x/initrd.img", cmdline="root=/dev/vda rw console=ttyS0")
PLACED = Placement(vcpus=((2,), (3,)), emulator=(1,), iothreads=(1,), iothread_count=1, vhost=(0, 1),
                   numa_node=0, hugepages_kib=2048, cpu_mode=CpuMode.MAXIMUM)


def _validate(tmp_path: Path, text: str) -> None:
    if not shutil.which("virt-xml-validate"):
        pytest.skip("virt-xml-validate missing (package libvirt-clients)")
    f = tmp_path / "d.xml"
    f.write_text(text)
    p = subprocess.run(["virt-xml-validate", str(f), "domain"], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stdout + p.stderr


def test_domain_with_placement_golden_and_schema(tmp_path):
    xml = render.domain_xml(dataclasses.replace(DOMAIN, **render.placement_params(PLACED)))
    path = GOLDEN / "domain-placement.xml"
    if os.environ.get("UPDATE_GOLDEN") == "1":
        path.write_text(xml)
    assert path.read_text() == xml, "domain-placement.xml differs from golden file (UPDATE_GOLDEN=1 to refresh)"
    _validate(tmp_path, xml)
    root = ET.fromstring(xml)
    assert [(v.get("vcpu"), v.get("cpuset")) for v in root.iter("vcpupin")] == [("0", "2"), ("1", "3")]
    assert root.find("cputune/emulatorpin").get("cpuset") == "1"
    assert root.find("cputune/iothreadpin").get("cpuset") == "1" and root.find("iothreads").text == "1"
    assert root.find("numatune/memory").attrib == {"mode": "strict", "nodeset": "0"}
    assert root.find("memoryBacking/hugepages/page").get("size") == "2048"
    assert root.find("cpu").get("mode") == "maximum"
    assert root.find("devices/disk/driver").get("iothread") == "1"


def test_unplaced_domain_has_no_placement_elements():
    root = ET.fromstring(render.domain_xml(DOMAIN))
    for tag in ("cputune", "numatune", "memoryBacking", "iothreads", "cpu"):
        assert root.find(tag) is None, tag


def test_numa_validated_against_this_host():
    """node 0 is honoured here when the host has it (every Linux host has node 0, NUMA or not)."""
    nodes = placement.numa_nodes()
    if 0 not in nodes:
        pytest.skip(f"this host has no NUMA node 0 (nodes: {sorted(nodes)})")
    t = config.parse(topo("numa: {node: 0}"))
    assert t.guest("g1").placement.numa_node == 0


def test_hugepages_validated_and_refused_when_none_free():
    """Rendered always; refused with exit 3 (before anything is created) when the host has
    no free pages of that size. Where the host has enough free, the run would honour them:
    that half is skipped here with the reason."""
    sizes = placement.hugepage_sizes()
    if 2048 not in sizes:
        pytest.skip(f"this host has no 2048 kB huge page pool ({sizes})")
    t = config.parse(topo("memory: {hugepages: 2M}"))
    assert t.guest("g1").placement.hugepages_kib == 2048
    need = 1024 * 1024 // 2048
    if sizes[2048] >= need:
        runner.placement_preflight(t)
        pytest.skip(f"this host has {sizes[2048]} free 2048 kB pages: the refusal cannot be shown here")
    with pytest.raises(CapabilityError) as e:
        runner.placement_preflight(t)
    assert e.value.exit_status == 3
    assert "guests[0].placement.memory.hugepages" in str(e.value) and "free 2048 kB huge pages" in str(e.value)


def test_hugepage_size_the_host_does_not_offer(tmp_path, capsys):
    sizes = placement.hugepage_sizes()
    if not sizes:
        pytest.skip("this host lists no huge page pools")
    rc, err = run_validate(tmp_path, topo("memory: {hugepages: 64K}"), capsys)
    assert rc == 2 and "offers no 64 kB huge pages" in err, err


def test_cpu_mode_under_tcg_chosen_at_run_time():
    from testbed.topology.model import Accelerator
    t = config.parse(topo("cpu: {mode: host-model}").replace("accelerator: tcg", "accelerator: auto"))
    with pytest.raises(CapabilityError, match=r"guests\[0\]\.placement\.cpu\.mode: host-model needs KVM"):
        runner.placement_accelerator(t, Accelerator.TCG)
    runner.placement_accelerator(t, Accelerator.KVM)


# --------------------------------------------------------------------------- pure parts

def test_cpulist_round_trip():
    assert parse_cpulist("0-3,6,8-9") == (0, 1, 2, 3, 6, 8, 9)
    assert cpulist({0, 1, 2, 3, 6, 8, 9}) == "0-3,6,8-9"
    assert parse_cpulist("\n") == ()
    with pytest.raises(ValueError):
        parse_cpulist("a-b")


def test_role_of_qemu_threads():
    assert placement.role_of("CPU 1/TCG", 11, 10) == ("vcpu", 1)
    assert placement.role_of("CPU 0/KVM", 11, 10) == ("vcpu", 0)
    assert placement.role_of("ALL CPUs/TCG", 11, 10) == ("vcpu", None)
    assert placement.role_of("IO iothread1", 11, 10) == ("iothread", 1)
    assert placement.role_of("vhost-10", 11, 10) == ("vhost", None)
    assert placement.role_of("qemu-system-x86", 10, 10) == ("main", None)
    assert placement.role_of("worker", 12, 10) == ("emulator", None)


def _t(tid, comm, role, index, allowed):
    return placement.Thread(tid, comm, role, index, allowed, allowed[0])


def test_check_pins_held_and_not():
    p = Placement(vcpus=((1,),), emulator=(0,), vhost=(0,))
    ts = [_t(10, "qemu-system-x86", "main", None, (0,)), _t(11, "CPU 0/TCG", "vcpu", 0, (1,)),
          _t(12, "worker", "emulator", None, (0,))]
    assert placement.check("g1", p, ts, {11: 1}, {0: (1,)}) == []
    # the thread's own affinity differs: both sets in the reason, and libvirt's view
    ts2 = [ts[0], _t(11, "CPU 0/TCG", "vcpu", 0, (0, 1)), ts[2]]
    [why] = placement.check("g1", p, ts2, {}, {0: (1,)})
    assert "placement.vcpus.pin[0] asked CPUs 1" in why and "allowed 0-1" in why and "libvirt says 1" in why
    # libvirt disagrees while the thread holds
    [why] = placement.check("g1", p, ts, {}, {0: (0, 1)})
    assert "libvirt reports 0-1" in why
    # ran on a CPU outside the pin
    [why] = placement.check("g1", p, ts, {11: 0}, {0: (1,)})
    assert "ran mostly on CPU 0" in why
    # userspace virtio-net: the main loop carries the vhost pin; a worker outside both pins fails
    ts3 = [ts[0], ts[1], _t(12, "worker", "emulator", None, (1,))]
    [why] = placement.check("g1", p, ts3, {}, {})
    assert "placement.emulator.pin asked CPUs 0" in why and "allowed 1" in why


def test_check_single_threaded_tcg():
    p = Placement(vcpus=((0,), (1,)))
    ts = [_t(10, "qemu-system-x86", "main", None, (0, 1)), _t(11, "ALL CPUs/TCG", "vcpu", None, (0, 1))]
    [why] = placement.check("g1", p, ts, {}, {})
    assert "one thread" in why


def test_hugepages_shortfall():
    assert placement.hugepages_shortfall(1024, 2048, {2048: 512}) is None
    assert "511 free 2048 kB huge pages" in placement.hugepages_shortfall(1024, 2048, {2048: 511})
    assert "no 1048576 kB huge page pool" in placement.hugepages_shortfall(1024, 1048576, {2048: 0})


RECORDED = Path(__file__).parent / "fixtures" / "proc-qemu"


def test_threads_of_a_recorded_qemu():
    """/proc/<pid>/task of a real TCG guest (QEMU 7.2 under libvirt 9.0, one vCPU pinned to
    CPU 1 with virDomainPinVcpuFlags), recorded on this testbed's CI host."""
    ts = placement.threads(4756, str(RECORDED))
    roles = {t.tid: (t.role, t.index) for t in ts}
    assert roles[4756] == ("main", None) and roles[4768] == ("vcpu", 0)
    assert roles[4765] == ("emulator", None)          # IO mon_iothread: QEMU's monitor thread
    assert roles[4761] == ("emulator", None)          # worker
    by = {t.tid: t for t in ts}
    assert by[4768].allowed == (1,) and by[4756].allowed == (0, 1)
    assert by[4768].last_cpu in (0, 1)
    p = Placement(vcpus=((1,),))
    assert placement.check("g1", p, ts, {4768: 1}, {0: (1,)}) == []
    [why] = placement.check("g1", Placement(vcpus=((0,),)), ts, {4768: 1}, {0: (1,)})
    assert "asked CPUs 0, thread 4768 (CPU 0/TCG) was allowed 1 (libvirt says 1)" in why


def test_endpoint_pins_are_part_of_each_cells_definition(tmp_path):
    from testbed.records import results
    from testbed.topology.model import context_of
    f = tmp_path / "t.yaml"
    f.write_text(netns_topo("allow_overlap: true, endpoints: {client: [0], server: [0]}"))
    pinned = context_of(results.topology_dict(config.load(f)))
    assert ("endpoints.placement", "client 0, server 0") in pinned
    f.write_text(netns_topo("allow_overlap: true, switch: [0]"))
    assert ("switch.placement", "0") in context_of(results.topology_dict(config.load(f)))
    f.write_text(netns_topo("allow_overlap: true"))
    assert not [k for k, _ in context_of(results.topology_dict(config.load(f))) if k.startswith("endpoints")]
