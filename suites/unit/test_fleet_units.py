"""testbed fleet without hosts: the inventory read by Ansible itself and checked before any
work, the fleet record and its exit statuses, the report's outliers within a host class, and
the shipped playbook as Ansible parses it."""
from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from test_compare import RR, STREAM, cell, cpu, rr_metrics, stream_metrics, write_run

from testbed.fleet import record, report
from testbed.fleet.record import FleetRun, HostOutcome
from testbed.host.safeio import UserFileError

pytestmark = pytest.mark.unit

inv = pytest.importorskip("testbed.fleet.inventory")
pytest.importorskip("ansible_runner", reason="ansible-runner not installed (extra: fleet)")

TOPOLOGY = """\
name: t
matrix:
  attachments: [netns-veth]
  mtus: [1500]
  connections: [1]
  profiles:
    - {name: tcp_rr, pattern: rr, message_size: 1, response_size: 1, duration: 1}
"""


def _inv(tmp_path: Path, text: str, name: str = "inv.yml") -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


def test_hosts_groups_vars_and_limit_come_from_ansible(tmp_path):
    p = _inv(tmp_path, "[gen3]\nhv1 ansible_host=198.18.0.1\nhv2 ansible_host=198.18.0.2\n"
                       "[gen3:vars]\ntestbed_host_class=gen3\n[old]\nhv9\n")
    hosts = inv.list_hosts(p)
    assert [h.name for h in hosts] == ["hv1", "hv2", "hv9"]
    assert hosts[0].host_class == "gen3" and hosts[2].host_class is None
    assert [h.name for h in inv.list_hosts(p, "gen3:!hv2")] == ["hv1"]
    with pytest.raises(UserFileError, match="--limit nope: matches no host"):
        inv.list_hosts(p, "nope")
    with pytest.raises(UserFileError, match="no such inventory"):
        inv.list_hosts(tmp_path / "missing.yml")


@pytest.mark.parametrize("var", ["ansible_host_key_checking=false",
                                 "ansible_ssh_common_args='-o StrictHostKeyChecking=no'",
                                 "ansible_ssh_extra_args='-o UserKnownHostsFile=/dev/null'"])
def test_a_host_that_turns_host_key_checking_off_is_refused(tmp_path, var):
    p = _inv(tmp_path, f"hv1 {var}\n", "inv.ini")
    with pytest.raises(UserFileError, match="hv1.*host key"):
        inv.check_trust(p, inv.list_hosts(p))


def test_the_testbeds_own_host_vars_are_checked(tmp_path):
    p = _inv(tmp_path, "all:\n  hosts:\n    hv1: {testbed_host_class: 'EPYC gen 3'}\n"
                       "    hv2: {testbed_machine_id: 'a b'}\n")
    with pytest.raises(UserFileError, match="hv2: testbed_machine_id"):
        inv.check_vars(p, inv.list_hosts(p))
    inv.check_vars(p, inv.list_hosts(p, "hv1"))
    p = _inv(tmp_path, "all:\n  hosts:\n    hv1: {testbed_shared_host: true}\n"
                       "    hv2: {testbed_shared_host: 'yes please'}\n")
    with pytest.raises(UserFileError, match="hv2: testbed_shared_host must be true or false"):
        inv.check_vars(p, inv.list_hosts(p))
    inv.check_vars(p, inv.list_hosts(p, "hv1"))


def test_each_hosts_topology_overrides_are_validated(tmp_path):
    topo = tmp_path / "t.yaml"
    topo.write_text(TOPOLOGY)
    data = inv.topology_data(topo)
    good = inv.list_hosts(_inv(tmp_path, "all:\n  hosts:\n    hv1:\n      testbed_topology_overrides: "
                                         "{matrix: {mtus: [9000]}}\n"))
    inv.check_topologies(topo, data, good)
    assert inv.merge(data, good[0].overrides)["matrix"]["mtus"] == [9000]
    assert inv.merge(data, good[0].overrides)["matrix"]["attachments"] == ["netns-veth"]
    bad = inv.list_hosts(_inv(tmp_path, "all:\n  hosts:\n    hv1:\n      testbed_topology_overrides: "
                                        "{matrix: {mtus: [12]}}\n"))
    with pytest.raises(Exception, match="hv1.*mtus"):
        inv.check_topologies(topo, data, bad)


def test_credentials_are_blanked_out_of_reasons(tmp_path):
    hosts = inv.list_hosts(_inv(tmp_path, "hv1 ansible_become_password=s3cr3t-pw\n", "inv.ini"))
    assert inv.scrub("su: s3cr3t-pw rejected", hosts) == "su: ******** rejected"


def test_exit_status_says_all_some_or_none(tmp_path):
    def fleet(*statuses):
        return FleetRun("f", tmp_path, "i", "t", None, 1, None, "now",
                        tuple(HostOutcome(f"h{i}", status=s) for i, s in enumerate(statuses)))
    assert fleet("done", "done").exit_status == record.ALL_OK == 0
    assert fleet("done", "failed").exit_status == record.SOME_FAILED == 6
    assert fleet("failed", "failed").exit_status == record.NONE_OK == 7
    f = fleet("done", "failed")
    f.write()
    assert record.read(tmp_path, tmp_path) == f
    (tmp_path / "fleet.json").write_text(json.dumps({"format_version": 99}))
    with pytest.raises(UserFileError, match="fleet.json"):
        record.read(tmp_path, tmp_path)


def _fleet_with_runs(tmp_path: Path, rates: dict[str, tuple[str, float]]) -> FleetRun:
    hosts = []
    for name, (cls, tps) in rates.items():
        d = tmp_path / "hosts" / name
        d.mkdir(parents=True)
        write_run(d, f"run-{name}", {cell(RR): [(rr_metrics(tps * k), cpu(1.6, 1.4, 1.6))
                                               for k in (0.99, 1.0, 1.01)],
                                     cell(STREAM): [(stream_metrics(2000), cpu(1.6, 1.4, 1.6))] * 3},
                  host=name, machine_id=f"id-{name}", host_class=cls)
        rec = json.loads((d / f"run-{name}" / "run.json").read_text())
        for c in rec["cells"]:           # the writer in test_compare leaves summaries empty
            m = "transactions_per_s" if c["profile"] == "tcp_rr" else "throughput_mbps"
            c["summary"] = {m: {"n": 3, "mean": tps if m == "transactions_per_s" else 2000.0}}
        (d / f"run-{name}" / "run.json").write_text(json.dumps(rec))
        hosts.append(HostOutcome(name, status="done", run_dir=f"hosts/{name}/run-{name}",
                                 run_id=f"run-{name}", host_class=cls))
    hosts.append(HostOutcome("down", status="failed", reason="unreachable: connection refused"))
    return FleetRun("fleet-x", tmp_path, "i", "t", None, 5, None, "now", tuple(hosts))


def test_the_report_flags_a_host_far_from_its_class_median(tmp_path):
    f = _fleet_with_runs(tmp_path, {"a1": ("gen3", 10000), "a2": ("gen3", 10100),
                                    "a3": ("gen3", 9900), "a4": ("gen3", 6000),
                                    "b1": ("gen2", 6000)})
    r = report.build(f)
    (o,) = r.outliers
    assert (o.host, o.host_class, o.metric) == ("a4", "gen3", "transactions_per_s") and o.z < -3.5
    text = report.render_text(r)
    assert "OUTLIER a4 (class gen3)" in text and "6000 !" in text
    assert "FAILED down: unreachable" in text and "id-a1" in text
    assert "class gen2: 1 host(s) done" in text          # too few to judge
    assert json.loads(report.render_json(r))["outliers"][0]["host"] == "a4"


def test_the_shipped_playbook_passes_ansibles_syntax_check(tmp_path):
    from importlib import resources

    from testbed.fleet import engine
    src = Path(str(resources.files("testbed.fleet") / "ansible"))
    p = subprocess.run([inv.ansible_binary("ansible-playbook"), "--syntax-check", "-i", "localhost,",
                        str(src / "fleet.yml")], capture_output=True, text=True, timeout=120,
                       env={"ANSIBLE_ROLES_PATH": str(src / "roles"), "PATH": "/usr/bin:/bin",
                            "ANSIBLE_LOCAL_TEMP": str(tmp_path), "HOME": str(tmp_path)})
    assert p.returncode == 0, p.stderr + p.stdout
    assert "StrictHostKeyChecking=yes" in engine.SSH_ARGS


def test_capacity_per_class_plans_by_the_weakest_host(tmp_path):
    from testbed.analysis import capacity
    f = _fleet_with_runs(tmp_path, {"a1": ("gen3", 10000), "a2": ("gen3", 5000),
                                    "b1": ("gen2", 8000)})
    r = report.build(f, demand=capacity.parse_demand("rr:500tps"))
    by = {(c.host_class, c.mode): c for c in r.capacity}
    gen3 = by[("gen3", "bridge/qemu")]
    assert set(gen3.vms_by_host) == {"a1", "a2"} and gen3.vms == min(gen3.vms_by_host.values())
    assert ("gen2", "bridge/qemu") in by and gen3.vms_by_host["a1"] > gen3.vms_by_host["a2"]
    assert f"CAPACITY class gen3 bridge/qemu: {gen3.vms} VMs per host" in report.render_text(r)
