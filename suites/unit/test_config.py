"""Bad input is rejected before anything is created: one line naming file, field, problem."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from testbed.errors import ConfigError
from testbed.topology import config
from testbed.topology.model import Attachment, Pattern

GOOD = """\
guests:
  - {name: g1}
  - {name: g2}
matrix:
  mtus: [1500, 9000]
  connections: [1, 8]
  profiles:
    - {name: tcp_rr, pattern: rr, message_size: 1, response_size: 1}
"""


def test_good_topology_parses():
    t = config.parse(GOOD, "good.yaml")
    assert [g.name for g in t.guests] == ["g1", "g2"]
    assert t.client == "g1" and t.server == "g2"
    assert t.matrix.mtus == (1500, 9000)
    assert t.matrix.attachments == (Attachment("bridge"),)
    assert t.matrix.profiles[0].pattern is Pattern.RR


def test_default_topology_is_valid():
    t = config.default()
    assert len(t.guests) == 2 and t.matrix.profiles


TWO = ("hosts: [{name: ha, transport: netns}, {name: hb, transport: netns}]\n"
       "guests: [{name: g1, host: ha}, {name: g2, host: hb}]\n")
TWO_SSH = ("hosts: [{name: ha}, {name: hb, uri: \"qemu+ssh://root@hb/system\", ssh: root@hb}]\n"
           "guests: [{name: g1, host: ha}, {name: g2, host: hb}]\n")
VX = "matrix: {attachments: [bridge-vxlan], mtus: [1500], profiles: [{name: a}]}\n"

BAD = {
    "unknown_key": ("guests: [{name: g1}, {name: g2}]\nmatrix: {profiles: [{name: a}]}\nfoo: 1\n",
                    "foo", "unknown key"),
    "unknown_nested_key": ("guests: [{name: g1, memroy_mib: 5}, {name: g2}]\nmatrix: {profiles: [{name: a}]}\n",
                           "guests[0].memroy_mib", "unknown key"),
    "missing_image": ("guests: [{name: g1, image: /nonexistent/x.qcow2}, {name: g2}]\nmatrix: {profiles: [{name: a}]}\n",
                      "guests[0].image", "image not found"),
    "non_numeric_mtu": ("guests: [{name: g1}, {name: g2}]\nmatrix: {mtus: [jumbo], profiles: [{name: a}]}\n",
                        "matrix.mtus[0]", "must be an integer"),
    "mtu_too_small": ("guests: [{name: g1}, {name: g2}]\nmatrix: {mtus: [67], profiles: [{name: a}]}\n",
                      "matrix.mtus[0]", "out of range 68..65535"),
    "mtu_too_big": ("guests: [{name: g1}, {name: g2}]\nmatrix: {mtus: [65536], profiles: [{name: a}]}\n",
                    "matrix.mtus[0]", "out of range"),
    "duplicate_guest": ("guests: [{name: g1}, {name: g1}]\nmatrix: {profiles: [{name: a}]}\n",
                        "guests[1]", "duplicate guest name"),
    "malformed_yaml": ("guests: [{name: g1}\nmatrix: {\n", "(yaml)", "malformed YAML"),
    "wrong_type": ("guests: {name: g1}\nmatrix: {profiles: [{name: a}]}\n", "guests", "expected a list"),
    "unknown_attachment": ("guests: [{name: g1}, {name: g2}]\nmatrix: {attachments: [sriov], profiles: [{name: a}]}\n",
                           "matrix.attachments[0]", "unknown value 'sriov'"),
    "huge_integer_for_a_number": ("guests: [{name: g1}, {name: g2}]\nmatrix: {profiles: [{name: a}], "
                                  "repetitions: {rsd_target: 1" + "0" * 400 + "}}\n",
                                  "matrix.repetitions.rsd_target", "out of range"),
    "zero_connections": ("guests: [{name: g1}, {name: g2}]\nmatrix: {connections: [0], profiles: [{name: a}]}\n",
                         "matrix.connections[0]", "out of range"),
    "negative_connections": ("guests: [{name: g1}, {name: g2}]\nmatrix: {connections: [-4], profiles: [{name: a}]}\n",
                             "matrix.connections[0]", "out of range"),
    "quote_in_name": ("guests: [{name: \"g1'\"}, {name: g2}]\nmatrix: {profiles: [{name: a}]}\n",
                      "guests[0].name", "invalid guest name"),
    "angle_in_name": ("guests: [{name: \"<g>\"}, {name: g2}]\nmatrix: {profiles: [{name: a}]}\n",
                      "guests[0].name", "invalid guest name"),
    "space_in_name": ("guests: [{name: \"g 1\"}, {name: g2}]\nmatrix: {profiles: [{name: a}]}\n",
                      "guests[0].name", "invalid guest name"),
    "subshell_in_name": ("guests: [{name: \"$(reboot)\"}, {name: g2}]\nmatrix: {profiles: [{name: a}]}\n",
                         "guests[0].name", "invalid guest name"),
    "subshell_in_profile": ("guests: [{name: g1}, {name: g2}]\nmatrix: {profiles: [{name: \"a$(id)\"}]}\n",
                            "matrix.profiles[0].name", "invalid profile name"),
    "bad_uri": ("hosts: [{name: h1, uri: 'not a uri'}]\nguests: [{name: g1}, {name: g2}]\nmatrix: {profiles: [{name: a}]}\n",
                "hosts[0].uri", "invalid libvirt URI"),
    "uri_injection": ("hosts: [{name: h1, uri: \"qemu:///system'><x\"}]\nguests: [{name: g1}, {name: g2}]\nmatrix: {profiles: [{name: a}]}\n",
                      "hosts[0].uri", "invalid libvirt URI"),
    "ssh_host_key_not_checked": ("hosts: [{name: h1, uri: \"qemu+ssh://root@h1/system?no_verify=1\"}]\nguests: [{name: g1}, {name: g2}]\nmatrix: {profiles: [{name: a}]}\n",
                                 "hosts[0].uri", "host keys must be checked"),
    "subnet_outside_benchmark_range": ("subnet: 10.0.0.0/24\nguests: [{name: g1}, {name: g2}]\nmatrix: {profiles: [{name: a}]}\n",
                                       "subnet", "outside 198.18.0.0/15"),
    "netperf_bidirectional": ("guests: [{name: g1}, {name: g2}]\nmatrix: {profiles: [{name: a, pattern: bidirectional}]}\n",
                              "matrix.profiles[0].pattern", "no bidirectional"),
    "two_host_mode_on_one_host": ("guests: [{name: g1}, {name: g2}]\nmatrix: {attachments: [ovs-vxlan], profiles: [{name: a}]}\n",
                                  "matrix.attachments[0]", "two different hosts"),
    "zero_queues": ("guests: [{name: g1}, {name: g2}]\nmatrix: {queues: [0], profiles: [{name: a}]}\n",
                    "matrix.queues[0]", "out of range 1..256"),
    "unknown_macvtap_mode": ("macvtap: {mode: private}\nguests: [{name: g1}, {name: g2}]\nmatrix: {profiles: [{name: a}]}\n",
                             "macvtap.mode", "unknown value 'private'"),
    "passthrough_one_lower": ("macvtap: {mode: passthrough, lower: eth1}\nguests: [{name: g1}, {name: g2}]\n"
                              "matrix: {attachments: [macvtap], profiles: [{name: a}]}\n",
                              "macvtap.lower", "needs 2 lower device(s)"),
    "bridge_two_lowers": ("macvtap: {lower: [eth1, eth2]}\nguests: [{name: g1}, {name: g2}]\nmatrix: {profiles: [{name: a}]}\n",
                          "macvtap.lower", "needs 1 lower device(s)"),
    "lower_bad_ifname": ("macvtap: {lower: \"eth1;reboot\"}\nguests: [{name: g1}, {name: g2}]\nmatrix: {profiles: [{name: a}]}\n",
                         "macvtap.lower", "invalid interface name"),
    "offloads_unknown_feature": ("offloads: {tsoo: false}\nguests: [{name: g1}, {name: g2}]\nmatrix: {profiles: [{name: a}]}\n",
                                 "offloads.tsoo", "unknown key"),
    "offloads_not_bool": ("offloads: {tso: maybe}\nguests: [{name: g1}, {name: g2}]\nmatrix: {profiles: [{name: a}]}\n",
                          "offloads.tso", "expected true or false"),
    "empty": ("", "(top level)", "empty file"),
    "vxlan_mtu_does_not_fit": (TWO + VX, "matrix.mtus[0]", "50 bytes of VXLAN-over-IPv4 overhead"),
    "vxlan_mtu_does_not_fit_raised_too_little": (TWO + "tunnel: {underlay_mtu: 1549}\n" + VX, "matrix.mtus[0]",
                                                 "does not fit the underlay MTU 1549"),
    "vxlan_vni_out_of_range": (TWO + "tunnel: {vni: 16777216, underlay_mtu: 1600}\n" + VX, "tunnel.vni",
                               "out of range"),
    "vxlan_unknown_tunnel_key": (TWO + "tunnel: {mtu: 1600}\n" + VX, "tunnel.mtu", "unknown key"),
    "vxlan_underlay_on_emulated_hosts": (TWO + "tunnel: {underlay: eth1, underlay_mtu: 1600}\n" + VX,
                                         "tunnel.underlay", "testbed's own veth wire"),
    "vxlan_real_hosts_need_underlay": (TWO_SSH + "tunnel: {underlay_mtu: 1600}\n" + VX, "tunnel",
                                       "needs the underlay interface"),
    "vxlan_underlay_injection": (TWO_SSH + "tunnel: {underlay: \"eth1;reboot\", underlay_mtu: 1600}\n" + VX,
                                 "tunnel.underlay", "invalid interface name"),
    "bridge_across_hosts": (TWO + "matrix: {attachments: [bridge], profiles: [{name: a}]}\n",
                            "matrix.attachments[0]", "use bridge-vxlan"),
    "ssh_host_over_libssh": ("hosts: [{name: ha}, {name: hb, uri: \"qemu+libssh://root@hb/system\", ssh: root@hb}]\n"
                             "guests: [{name: g1}, {name: g2}]\nmatrix: {profiles: [{name: a}]}\n",
                             "hosts[1].uri", "stalls on large replies"),
    "ssh_port_on_local_host": ("hosts: [{name: ha, ssh_port: 22}]\nguests: [{name: g1}, {name: g2}]\n"
                               "matrix: {profiles: [{name: a}]}\n", "hosts[0].ssh_port", "is for transport ssh"),
    "mixed_emulated_and_real": ("hosts: [{name: ha, transport: netns}, {name: hb, uri: \"qemu+ssh://root@hb/system\", "
                                "ssh: root@hb}]\nguests: [{name: g1, host: ha}, {name: g2, host: hb}]\n"
                                "matrix: {attachments: [macvtap], profiles: [{name: a}]}\n", "hosts",
                                "both be emulated"),
    "netns_host_with_remote_uri": ("hosts: [{name: ha, transport: netns, uri: \"qemu+ssh://root@x/system\"}]\n"
                                   "guests: [{name: g1}, {name: g2}]\nmatrix: {profiles: [{name: a}]}\n",
                                   "hosts[0].uri", "needs a local libvirt URI"),
}


def test_offloads_parse():
    base = "guests: [{name: g1}, {name: g2}]\nmatrix: {profiles: [{name: a}]}\n"
    assert config.parse("offloads: off\n" + base, "t.yaml").offloads.requested() == [
        ("tx", False), ("tso", False), ("gso", False), ("gro", False), ("lro", False)]
    assert config.parse("offloads: {gro: true}\n" + base, "t.yaml").offloads.requested() == [("gro", True)]
    assert config.parse(base, "t.yaml").offloads is None


def test_macvtap_and_queues_parse():
    t = config.parse("macvtap: {mode: passthrough, lower: [eth1, eth2]}\n" + GOOD.replace(
        "  mtus:", "  queues: [1, 4]\n  mtus:"), "t.yaml")
    assert t.macvtap.mode.value == "passthrough" and t.macvtap.lower == ("eth1", "eth2")
    assert t.matrix.queues == (1, 4)


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_input_names_file_and_field(case):
    text, field, words = BAD[case]
    with pytest.raises(ConfigError) as ei:
        config.parse(text, "topo.yaml")
    msg = str(ei.value)
    assert msg.startswith("topo.yaml"), msg
    assert f": {field}: " in msg, msg
    assert words in msg, msg
    assert "\n" not in msg


def test_line_number_points_at_the_field():
    text = "guests:\n  - {name: g1}\n  - {name: g2}\nmatrix:\n  mtus: [1500, big]\n  profiles: [{name: a}]\n"
    with pytest.raises(ConfigError) as ei:
        config.parse(text, "t.yaml")
    assert ei.value.line == 5


def test_unreadable_file(tmp_path):
    with pytest.raises(ConfigError, match="no such file"):
        config.load(tmp_path / "missing.yaml")
    d = tmp_path / "adir.yaml"
    d.mkdir()
    with pytest.raises(ConfigError, match="cannot read"):
        config.load(d)


def _cli(*args: str, env=None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "testbed.cli", *args], capture_output=True, text=True,
                          timeout=60, env={**os.environ, **(env or {})})


def test_two_hosts_parse_with_tunnel_defaults_and_a_raised_underlay():
    t = config.parse(TWO + "tunnel: {underlay_mtu: 1550}\n" + VX, "two.yaml")
    assert [h.emulated for h in t.hosts] == [True, True]
    assert t.guest("g1").host == "ha" and t.guest("g2").host == "hb"
    assert (t.tunnel.vni, t.tunnel.udp_port, t.tunnel.underlay, t.tunnel.underlay_mtu) == (42, 4789, None, 1550)
    t = config.parse(TWO_SSH + "tunnel: {underlay: eth1, underlay_mtu: 9050, vni: 7, udp_port: 8472}\n"
                     + VX.replace("[1500]", "[9000]"), "two.yaml")
    assert t.tunnel.underlay == "eth1" and t.tunnel.udp_port == 8472


def test_which_host_pairs_can_cross():
    from testbed import attachments

    class twohost:      # what testbed/twohost.py answered, now each mode's own check
        @staticmethod
        def unavailable(t, a):
            c = attachments.get(a).check(t)
            return c.why if c else None

        @staticmethod
        def across(t, a):
            return attachments.get(a).across(t)
    # This machine plus one over ssh: runs (the ssh host is checked when the run starts).
    t = config.parse(TWO_SSH + "tunnel: {underlay: eth1, underlay_mtu: 1600}\n" + VX, "two.yaml")
    assert twohost.unavailable(t, Attachment("bridge-vxlan")) is None
    assert twohost.unavailable(config.parse(TWO + "tunnel: {underlay_mtu: 1550}\n" + VX, "t.yaml"),
                               Attachment("bridge-vxlan")) is None
    # macvtap across emulated hosts: no tunnel, so no underlay MTU rule.
    mv = config.parse(TWO + "matrix: {attachments: [macvtap], mtus: [9000], profiles: [{name: a}]}\n", "t.yaml")
    assert twohost.across(mv, Attachment("macvtap")) and twohost.unavailable(mv, Attachment("macvtap")) is None
    assert not twohost.across(config.default(), Attachment("macvtap"))
    # Two "real" hosts that are both this machine would share one root namespace.
    both_local = config.parse("hosts: [{name: ha}, {name: hb}]\nguests: [{name: g1, host: ha}, {name: g2, host: hb}]\n"
                              "tunnel: {underlay: eth1, underlay_mtu: 1600}\n" + VX, "t.yaml")
    assert "both this machine" in twohost.unavailable(both_local, Attachment("bridge-vxlan"))


def test_ssh_host_fields(tmp_path):
    kh = tmp_path / "known_hosts"
    kh.write_text("[hb]:2222 ssh-ed25519 AAAA\n")
    t = config.parse("hosts: [{name: ha, underlay: eth1}, {name: hb, uri: \"qemu+libssh2://root@hb:2222/system?"
                     "known_hosts=/k\", ssh: root@hb, ssh_port: 2222, known_hosts: known_hosts, underlay: ens5}]\n"
                     "guests: [{name: g1, host: ha}, {name: g2, host: hb}]\n"
                     "matrix: {attachments: [macvtap], profiles: [{name: a}]}\n", str(tmp_path / "t.yaml"))
    hb = t.hosts[1]
    assert hb.remote and hb.ssh_port == 2222 and hb.known_hosts == str(kh) and hb.underlay == "ens5"
    from testbed.host import remote
    argv = remote.shell(hb).argv(["ip", "link", "show", "dev", "a b"])
    assert argv[0] == "ssh" and "StrictHostKeyChecking=yes" in argv and "BatchMode=yes" in argv
    assert f"UserKnownHostsFile={kh}" in argv and argv[-1] == "ip link show dev 'a b'"
    assert remote.shell(t.hosts[0]).argv(["true"]) == ["true"]


@pytest.mark.parametrize("case", ["unknown_key", "missing_image", "non_numeric_mtu", "duplicate_guest",
                                  "vxlan_mtu_does_not_fit"])
def test_cli_rejects_with_one_line_and_exit_2(tmp_path, case):
    f = tmp_path / "topo.yaml"
    f.write_text(BAD[case][0])
    state = tmp_path / "state"
    for cmd in ("validate", "run"):
        p = _cli(cmd, str(f), env={"TESTBED_STATE": str(state), "TESTBED_RESULTS": str(tmp_path / "res")})
        assert p.returncode == 2, p.stderr
        lines = p.stderr.strip().splitlines()
        assert len(lines) == 1, p.stderr
        assert str(f) in lines[0] and BAD[case][1] in lines[0]
        assert "Traceback" not in p.stderr
        # Nothing created: no state folder, no result folder.
        assert not state.exists() and not (tmp_path / "res").exists()


def test_remote_probe_parses():
    from testbed.host import environment
    kv = environment.parse_remote_probe("host=hb\nkernel=6.1.0-26-amd64\ncpus=64\ncpu_model=AMD EPYC 7B13 = x\n"
                                        "qemu=QEMU emulator version 7.2.11\nkvm_device=yes\nnoise\n")
    assert kv["cpus"] == "64" and kv["cpu_model"] == "AMD EPYC 7B13 = x" and "noise" not in kv


def test_repetitions_gate_preset_and_the_default_says_it_is_not_gateable():
    t = config.parse(_with_repetitions("gate"), "gate.yaml")
    r = t.matrix.repetitions
    assert (r.warmup, r.min_samples, r.max_samples, r.rsd_target) == (1, 5, 10, 0.03)
    assert config.not_gateable(t) is None
    why = config.not_gateable(config.default())
    assert why and "repetitions: gate" in why and "1 sample" in why
    with pytest.raises(ConfigError, match="preset 'gate'"):
        config.parse(_with_repetitions("fast"), "x.yaml")


def _with_repetitions(value: str) -> str:
    return ("guests: [{name: g1}, {name: g2}]\nmatrix:\n  profiles: [{name: p}]\n"
            f"  repetitions: {value}\n")


def test_variants_are_validated_before_anything_is_created(tmp_path):
    base = "guests: [{name: g1}, {name: g2}]\nmatrix:\n  profiles: [{name: p}]\n  variants:\n"
    t = config.parse(base + "    - {name: a}\n    - {name: b, nic: {rx_queue_size: 512, event_idx: false}}\n",
                     "v.yaml")
    assert [v.name for v in t.matrix.variants] == ["a", "b"]
    assert dict(t.matrix.variants[1].nic) == {"rx_queue_size": "512", "event_idx": "off"}
    for bad, msg in [("- {name: b, emulator: /bin/true}", "not a QEMU"),
                     ("- {name: b, emulator: /nonexistent/qemu}", "does not exist"),
                     ("- {name: b, nic: {rx_queue_size: 300}}", "must be one of"),
                     ("- {name: a}", "duplicate variant"),
                     ("- {name: b, machine: nosuchmachine}", "not offered")]:
        with pytest.raises(ConfigError, match=msg) as ei:
            config.parse(base + "    - {name: a}\n    " + bad + "\n", "v.yaml")
        assert "matrix.variants" in str(ei.value)
