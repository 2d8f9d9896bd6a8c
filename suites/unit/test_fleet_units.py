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


# One inventory, one reader: every host carries one hostile setting, read and merged by
# Ansible (group vars included), then each host's variables go through the checks alone.
HOSTILE = {
    # host key checking, every spelling
    "h_args": ("ansible_ssh_args", "-o StrictHostKeyChecking=no", "replaces the fleet's own ssh options"),
    "h_common": ("ansible_ssh_common_args", "-oStrictHostKeyChecking=no", "StrictHostKeyChecking"),
    "h_common_case": ("ansible_ssh_common_args", "-o 'stricthostkeychecking no'", "stricthostkeychecking"),
    "h_common_eq": ("ansible_ssh_common_args", '-o "StrictHostKeyChecking = accept-new"', "StrictHostKeyChecking"),
    "h_common_quoted": ("ansible_ssh_common_args", """-o '"StrictHostKeyChecking" no'""", "StrictHostKeyChecking"),
    "h_combined": ("ansible_ssh_extra_args", "-Co StrictHostKeyChecking=no", "StrictHostKeyChecking"),
    "h_extra_kh": ("ansible_ssh_extra_args", "-o UserKnownHostsFile=/dev/null", "UserKnownHostsFile"),
    "h_global_kh": ("ansible_ssh_extra_args", "-o GlobalKnownHostsFile=/tmp/k", "GlobalKnownHostsFile"),
    "h_proxy": ("ansible_ssh_common_args", "-o ProxyCommand='nc %h %p'", "ProxyCommand"),
    "h_local": ("ansible_ssh_common_args", "-o PermitLocalCommand=yes -o LocalCommand=id", "PermitLocalCommand"),
    "h_khcmd": ("ansible_ssh_extra_args", "-oKnownHostsCommand=/bin/true", "KnownHostsCommand"),
    "h_alias": ("ansible_ssh_extra_args", "-o HostKeyAlias=trusted", "HostKeyAlias"),
    "h_tunnel": ("ansible_ssh_extra_args", "-L 8080:x:80", "-L"),
    "h_hkc": ("ansible_ssh_host_key_checking", False, "turns host key checking off"),
    "h_hkc_text": ("ansible_host_key_checking", "no", "turns host key checking off"),
    # options reaching ssh as options
    "h_host_dash": ("ansible_host", "-oProxyCommand=touch /tmp/x", "begins with '-'"),
    "h_user_dash": ("ansible_user", "-oProxyCommand=x", "begins with '-'"),
    "h_user_ctrl": ("ansible_user", "root\u001b[2J", "control characters"),
    "h_host_blank": ("ansible_host", "198.18.0.1 -p 2", "not a host name"),
    "h_port": ("ansible_port", 70000, "from 1 to 65535"),
    "h_port_text": ("ansible_ssh_port", "22 -o x", "from 1 to 65535"),
    "h_jump": ("ansible_ssh_common_args", "-J -oProxyCommand=x", "not allowed"),
    # inline key material, programs on the controller, templates
    "h_key_text": ("ansible_ssh_private_key_file", "-----BEGIN OPENSSH PRIVATE KEY-----\nAAAA", "key material"),
    "h_key_var": ("ansible_private_key", "AAAA", "holds the key itself"),
    "h_exe": ("ansible_ssh_executable", "/tmp/evil", "another program"),
    "h_conn": ("ansible_connection", "local", "over ssh only"),
    "h_pkcs": ("ansible_ssh_pkcs11_provider", "/tmp/x.so", "loads a library"),
    "h_template": ("ansible_host", "{{ lookup('pipe', 'id') }}", "Jinja2 template"),
    "h_template_deep": ("testbed_topology_overrides", {"name": "{% raw %}x"}, "Jinja2 template"),
    "h_unknown": ("ansible_become_exe", "/tmp/x", "not an Ansible connection variable"),
    "h_fleet_set": ("testbed_fleet_dir", "/tmp", "set by the fleet"),
    "h_home": ("testbed_home", "/var/../etc", "without '..'"),
    "h_machine": ("testbed_machine_id", "a b", "letters, digits"),
    "h_shared": ("testbed_shared_host", "yes please", "true or false"),
    "h_missing_key": ("ansible_ssh_private_key_file", "/nonexistent/key", "missing"),
}


@pytest.fixture(scope="module")
def hostile_hosts(tmp_path_factory):
    d = tmp_path_factory.mktemp("hostile")
    hosts = {name: {var: value} for name, (var, value, _) in HOSTILE.items()}
    (d / "inv.yml").write_text(json.dumps({"all": {"hosts": hosts}}))
    (d / "group_vars").mkdir()
    (d / "group_vars" / "all.yml").write_text("ansible_user: root\n")
    _settings, raw = inv.read(d / "inv.yml")
    return dict(raw)


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_each_hostile_host_setting_is_refused_naming_its_variable(hostile_hosts, name):
    from testbed.fleet import hostvars
    var, _, words = HOSTILE[name]
    hv = hostile_hosts[name]
    assert hv["ansible_user"] == "root" or var in ("ansible_user",)     # group_vars merged by Ansible
    with pytest.raises(hostvars.VarError) as e:
        hostvars.check_host(name, hv)
    assert e.value.var.startswith(var) and words in str(e.value), str(e.value)


def test_a_host_with_plain_settings_passes_and_keeps_only_the_roles_variables(tmp_path):
    from testbed.fleet import hostvars
    key = tmp_path / "id"
    key.write_text("not read\n")
    c = hostvars.check_host("hv1", {"ansible_host": "198.18.0.1", "ansible_port": "2222",
                                    "ansible_ssh_private_key_file": str(key), "site_var": "{{ x }}",
                                    "ansible_ssh_common_args": "-o ConnectTimeout=5 -4",
                                    "ansible_become_password": "s3cr3t-pw", "testbed_shared_host": "yes"})
    assert "site_var" not in c.run_vars and c.run_vars["ansible_port"] == 2222
    assert c.run_vars["ansible_connection"] == "ansible.builtin.ssh" and c.run_vars["testbed_shared_host"] is True
    assert c.secrets == ("s3cr3t-pw",)


@pytest.mark.parametrize("args,words", [
    ("-o StrictHostKeyChecking=no", "StrictHostKeyChecking"),
    ("-oStrictHostKeyChecking=no", "StrictHostKeyChecking"),
    ("-o 'StrictHostKeyChecking\tno'", "StrictHostKeyChecking"),
    ("-4Co stricthostkeychecking=off", "stricthostkeychecking"),
    ("-vvvo UserKnownHostsFile=/dev/null", "UserKnownHostsFile"),
    ("-o VerifyHostKeyDNS=yes", "VerifyHostKeyDNS"),
    ("-o NoHostAuthenticationForLocalhost=yes", "NoHostAuthenticationForLocalhost"),
    ("-o Include=/tmp/x", "Include"),
    ("-o ControlPath=/tmp/sock", "ControlPath"),
    ("-o SomethingNew=1", "not one a fleet allows"),
    ("-o", "missing its argument"),
    ("-- host", "ends ssh's options"),
    ("evil.example.com", "not an ssh option"),
    ("-o User=-oProxyCommand=x", "not allowed here"),
    ("-i -oProxyCommand=x", "not allowed here"),
    ("-S /tmp/sock", "does not allow"),
    ("-E /tmp/log", "does not allow"),
    ("-o 'ConnectTimeout 5' \"unterminated", "cannot be split"),
])
def test_ssh_arguments_are_read_as_ssh_reads_them(args, words):
    from testbed.fleet import sshopts
    with pytest.raises(sshopts.SshOptionError, match=words):
        sshopts.check_args(args)


def test_allowed_ssh_arguments_pass_and_name_their_config_files():
    from testbed.fleet import sshopts
    assert sshopts.check_args("-4 -C -o ConnectTimeout=10 -o 'ServerAliveInterval 5' -J root@jump:2222 "
                              "-F /etc/fleet/ssh_config -i ~/.ssh/id_ed25519") == ["/etc/fleet/ssh_config"]


@pytest.mark.parametrize("text,words", [
    ("Host *\n  StrictHostKeyChecking no\n", "line 2 (StrictHostKeyChecking)"),
    ("Host *\n  UserKnownHostsFile=/dev/null\n", "UserKnownHostsFile"),
    ('Match exec "true"\n  User x\n', "Match exec"),
    ("Host hv1\n  ProxyCommand ssh -W %h:%p bastion\n", "ProxyCommand"),
    ("Include ~/.ssh/other\n", "Include"),
    ("Host -oProxyCommand=x\n", "may not begin with '-'"),
    ("Host *\n  \"StrictHostKeyChecking\" no\n", "StrictHostKeyChecking"),
    ("Host *\n  KnownHostsCommand /bin/cat\n", "KnownHostsCommand"),
    ("just words\n", "not one a fleet allows"),
    ("Host *\n  =no\n", "not an ssh_config line"),
])
def test_an_ssh_config_is_checked_line_by_line(text, words):
    import re

    from testbed.fleet import sshopts
    with pytest.raises(sshopts.SshOptionError, match=re.escape(words)):
        sshopts.check_config(text)
    sshopts.check_config("# pinned\nHost hv*\n  User root\n  Port 2222\nMatch host a user b\n"
                         "  IdentityFile ~/.ssh/id\n  ConnectTimeout 5\n")


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
