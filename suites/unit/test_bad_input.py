"""A corpus of hostile and careless topologies, one or more per class of hostile input.

Each goes through the real CLI entry (testbed.cli.main) and must give exit 2 and exactly one
stderr line naming the file and the field; `testbed run` must create nothing (it never gets
to runner.execute, the only thing that creates host objects, and leaves no state or results
folder).
"""
from __future__ import annotations

import contextlib
import io
import os
import subprocess
import time
import sys
from pathlib import Path

import pytest

from testbed import cli
from testbed.errors import ConfigError
from testbed.topology import config, yamlnode

G = "guests: [{name: g1}, {name: g2}]\n"
M = "matrix: {profiles: [{name: a}]}\n"
SSH_HOSTS = "hosts: [{name: ha}, {name: hb, uri: %s, ssh: %s}]\nguests: [{name: g1, host: ha}, {name: g2, host: hb}]\n"
MV = "matrix: {attachments: [macvtap], profiles: [{name: a}]}\n"


def ssh_host(uri: str = '"qemu+ssh://root@hb/system"', target: str = "root@hb") -> str:
    return SSH_HOSTS % (uri, target) + MV


# name -> (YAML text, field named in the message, words in the message)
CORPUS: dict[str, tuple[str, str, str]] = {
    # 1. loader crash paths
    "key_without_value": ("guests:\n" + M, "guests", "expected a list, got nothing"),
    "matrix_without_value": (G + "matrix:\n", "matrix", "expected a mapping, got nothing"),
    "only_document_markers": ("---\n...\n", "(top level)", "empty file"),
    "document_markers_twice": ("---\n...\n---\n...\n", "(yaml)", "more than one YAML document"),
    "two_documents": (G + M + "---\n" + G + M, "(yaml)", "more than one YAML document"),
    "custom_tag": ("name: !env X\n" + G + M, "name", "tag '!env' is not allowed"),
    "custom_tag_on_mapping": ("guests: !!python/object:os.system [{name: g1}, {name: g2}]\n" + M,
                              "guests", "is not allowed"),
    "python_tag_on_scalar": ("name: !!python/name:os.system ''\n" + G + M, "name", "is not allowed"),
    "binary_tag": ("name: !!binary aGVsbG8=\n" + G + M, "name", "is not allowed"),
    "set_tag": ("guests: !!set {a, b}\n" + M, "guests", "expected a list"),
    "deep_flow_nesting": ("name: " + "[" * 3000 + "]" * 3000 + "\n" + G + M, "(yaml)", "nested more than 32 levels"),
    "nesting_just_too_deep": ("name: " + "[" * 40 + "]" * 40 + "\n" + G + M, "(yaml)", "nested more than"),
    "ipv6_subnet": ('subnet: "2001:db8::/64"\n' + G + M, "subnet", "not an IPv4 network"),
    "subnet_host_bits": ("subnet: 198.18.0.1/24\n" + G + M, "subnet", "not an IPv4 network"),
    "subnet_not_text": ("subnet: [1]\n" + G + M, "subnet", "expected a single value"),
    "top_level_list": ("- a\n- b\n", "(top level)", "expected a mapping"),
    "top_level_scalar": ("hello\n", "(top level)", "expected a mapping"),
    "non_string_key": (G + M + "1: x\n", "(top level)", "keys must be plain text"),
    "list_key": (G + M + "? [a]\n: x\n", "(top level)", "keys must be plain text"),
    "null_key": (G + M + "~: x\n", "(top level)", "keys must be plain text"),
    "merge_key": ("base: &b {name: g1}\n" + G + M, "base", "unknown key"),
    "merge_into_guest": ("guests: [{<<: {name: g1}}, {name: g2}]\n" + M, "guests[0]", "keys must be plain text"),
    "bool_as_int": (G + "matrix: {mtus: [true], profiles: [{name: a}]}\n", "matrix.mtus[0]", "got True"),
    "bool_as_vcpus": ("guests: [{name: g1, vcpus: yes}, {name: g2}]\n" + M, "guests[0].vcpus", "got True"),
    "float_as_int": (G + "matrix: {mtus: [1500.0], profiles: [{name: a}]}\n", "matrix.mtus[0]", "integer"),
    "nan_rsd": (G + "matrix: {profiles: [{name: a}], repetitions: {rsd_target: .nan}}\n",
                "matrix.repetitions.rsd_target", "out of range"),
    "inf_rsd": (G + "matrix: {profiles: [{name: a}], repetitions: {rsd_target: .inf}}\n",
                "matrix.repetitions.rsd_target", "out of range"),
    "huge_int": (G + "matrix: {mtus: [" + "9" * 5000 + "], profiles: [{name: a}]}\n", "matrix.mtus[0]",
                 "unreadable value"),
    "huge_hex": (G + "matrix: {mtus: [0x" + "f" * 5000 + "], profiles: [{name: a}]}\n", "matrix.mtus[0]",
                 "out of range"),
    "explicit_bool_tag_bad_value": ("name: !!bool maybe\n" + G + M, "name", "unreadable value 'maybe'"),
    "explicit_timestamp_tag_bad_value": ("name: !!timestamp zz\n" + G + M, "name", "unreadable value 'zz'"),
    "explicit_float_tag_bad_value": ("name: !!float abc\n" + G + M, "name", "unreadable value 'abc'"),
    "explicit_int_tag_bad_value": (G + "matrix: {mtus: [!!int zz], profiles: [{name: a}]}\n", "matrix.mtus[0]",
                                   "unreadable value 'zz'"),
    "timestamp_as_name": ("name: 2026-01-01\n" + G + M, "name", "expected text"),
    "alias_to_list_as_mtu": (G + "matrix: {mtus: &m [1500, [*m]], profiles: [{name: a}]}\n", "matrix.mtus[1]",
                             "expected a single value"),
    "name_alias_of_mapping": ("x: &x {a: 1}\n" + G + M, "x", "unknown key"),
    "control_char_in_name": ('name: "t\\x1bz"\n' + G + M, "name", "invalid topology name"),
    "empty_image_path": ("guests: [{name: g1, image: ''}, {name: g2}]\n" + M, "guests[0].image", "invalid path"),
    "nul_in_image_path": ('guests: [{name: g1, image: "a\\0b"}, {name: g2}]\n' + M, "guests[0].image",
                          "invalid path"),
    "directory_as_image": ("guests: [{name: g1, image: /}, {name: g2}]\n" + M, "guests[0].image", "image not found"),
    # 2. trailing newlines never pass a pattern
    "newline_guest_name": ('guests: [{name: "g1\\n"}, {name: g2}]\n' + M, "guests[0].name", "'g1\\n'"),
    "newline_profile_name": (G + 'matrix: {profiles: [{name: "a\\n"}]}\n', "matrix.profiles[0].name",
                             "invalid profile name"),
    "newline_transport": ('hosts: [{name: ha, transport: "local\\n"}]\n' + G + M, "hosts[0].transport",
                          "invalid transport"),
    "newline_accelerator": ('accelerator: "tcg\\n"\n' + G + M, "accelerator", "invalid accelerator"),
    "newline_uri": ('hosts: [{name: ha, uri: "qemu:///system\\n"}]\n' + G + M, "hosts[0].uri",
                    "invalid libvirt URI"),
    "newline_ifname": ('macvtap: {lower: "eth1\\n"}\n' + G + M, "macvtap.lower", "invalid interface name"),
    "newline_ssh_target": (ssh_host(target='"root@hb\\n"'), "hosts[1].ssh", "invalid ssh target"),
    "newline_topology_name": ('name: "t\\n"\n' + G + M, "name", "invalid topology name"),
    "newline_host_name": ('hosts: [{name: "ha\\n"}]\n' + G + M, "hosts[0].name", "invalid host name"),
    # 3. ssh targets and URI parameters
    "ssh_target_leading_dash": (ssh_host(target='"-oProxyCommand=touch@x"'), "hosts[1].ssh", "begins with '-'"),
    "ssh_target_dash_e": (ssh_host(target='"-E/tmp/x@hb"'), "hosts[1].ssh", "begins with '-'"),
    "ssh_host_leading_dash": (ssh_host(target='"root@-oProxyCommand=x"'), "hosts[1].ssh", "invalid ssh target"),
    "no_verify_mixed_case": (ssh_host(uri='"qemu+ssh://root@hb/system?No_Verify=1"'), "hosts[1].uri",
                             "no_verify is not allowed"),
    "no_verify_upper": (ssh_host(uri='"qemu+ssh://root@hb/system?mode=auto&NO_VERIFY=1"'), "hosts[1].uri",
                        "no_verify is not allowed"),
    "known_hosts_verify_ignore": (ssh_host(uri='"qemu+libssh2://root@hb/system?known_hosts_verify=ignore"'),
                                  "hosts[1].uri", "known_hosts_verify must be 'normal'"),
    "known_hosts_verify_ignore_case": (ssh_host(uri='"qemu+libssh2://root@hb/system?Known_Hosts_Verify=IGNORE"'),
                                       "hosts[1].uri", "known_hosts_verify must be 'normal'"),
    "known_hosts_verify_auto": (ssh_host(uri='"qemu+libssh2://root@hb/system?known_hosts_verify=auto"'),
                                "hosts[1].uri", "known_hosts_verify must be 'normal'"),
    "uri_command_param": (ssh_host(uri='"qemu+ssh://root@hb/system?command=/bin/sh"'), "hosts[1].uri",
                          "URI parameter 'command' is not allowed"),
    "uri_ext_transport": ('hosts: [{name: ha, uri: "qemu+ext:///system?command=/tmp/x"}]\n' + G + M,
                          "hosts[0].uri", "transport 'ext' is not allowed"),
    "uri_user_leading_dash": (ssh_host(uri='"qemu+ssh://-F@hb/system"'), "hosts[1].uri", "user '-F' begins with '-'"),
    "uri_port_out_of_range": (ssh_host(uri='"qemu+ssh://root@hb:99999/system"'), "hosts[1].uri", "port 1..65535"),
    "uri_port_empty": (ssh_host(uri='"qemu+ssh://root@hb:/system"'), "hosts[1].uri", "invalid host:port"),
    "uri_host_leading_dash": (ssh_host(uri='"qemu+ssh://-oProxyJump.x/system"'), "hosts[1].uri",
                              "begins with '-'"),
    # 4. one line, whatever the key or value holds
    "newline_in_key": (G + M + '"a\\nb": 1\n', "'a\\nb'", "unknown key"),
    "newline_in_nested_key": ('guests: [{name: g1, "x\\ny": 1}, {name: g2}]\n' + M, "guests[0].'x\\ny'",
                              "unknown key"),
    "newline_in_image_path": ('guests: [{name: g1, image: "/no\\nsuch"}, {name: g2}]\n' + M, "guests[0].image",
                              "image not found: '/no\\nsuch'"),
    "newline_in_enum": (G + 'matrix: {attachments: ["bridge\\n"], profiles: [{name: a}]}\n',
                        "matrix.attachments[0]", "unknown value 'bridge\\n'"),
    "bidi_override_in_key": (G + M + '"\\u202eab": 1\n', "'\\u202eab'", "unknown key"),
    # 5. interface names the kernel refuses
    "ifname_dot": ("macvtap: {lower: '.'}\n" + G + M, "macvtap.lower", "invalid interface name '.'"),
    "ifname_dotdot": ("macvtap: {lower: '..'}\n" + G + M, "macvtap.lower", "invalid interface name '..'"),
    "ifname_slash": ("macvtap: {lower: 'a/b'}\n" + G + M, "macvtap.lower", "invalid interface name"),
    "ifname_colon": ("macvtap: {lower: 'eth0:1'}\n" + G + M, "macvtap.lower", "invalid interface name"),
    "ifname_16_bytes": ("macvtap: {lower: abcdefghijklmnop}\n" + G + M, "macvtap.lower", "invalid interface name"),
    "ifname_empty": ("macvtap: {lower: ''}\n" + G + M, "macvtap.lower", "invalid interface name"),
    "ifname_leading_dash": ("macvtap: {lower: '-K'}\n" + G + M, "macvtap.lower", "invalid interface name"),
    "underlay_dotdot": ("hosts: [{name: ha, underlay: '..'}]\n" + G + M, "hosts[0].underlay",
                        "invalid interface name"),
    # 6. refused at validate time, not at run time
    "duplicate_mtus": (G + "matrix: {mtus: [1500, 1500], profiles: [{name: a}]}\n", "matrix.mtus[1]",
                       "duplicate value 1500"),
    "duplicate_by_alias": (G + "matrix: {connections: [&c 1, *c], profiles: [{name: a}]}\n",
                           "matrix.connections[1]", "duplicate value"),
    "duplicate_attachments": (G + "matrix: {attachments: [bridge, bridge], profiles: [{name: a}]}\n",
                              "matrix.attachments[1]", "duplicate value 'bridge'"),
    "duplicate_backends": (G + "matrix: {backends: [qemu, qemu], profiles: [{name: a}]}\n",
                           "matrix.backends[1]", "duplicate value"),
    "duplicate_queues": (G + "matrix: {queues: [2, 2], profiles: [{name: a}]}\n", "matrix.queues[1]",
                         "duplicate value"),
    "duplicate_profiles_by_alias": (G + "matrix: {profiles: [&p {name: a}, *p]}\n", "matrix.profiles[1]",
                                    "duplicate profile name"),
    "iperf3_rr": (G + "matrix: {profiles: [{name: a, tool: iperf3, pattern: rr}]}\n",
                  "matrix.profiles[0].pattern", "iperf3 cannot run tcp rr"),
    "iperf3_crr": (G + "matrix: {profiles: [{name: a, tool: iperf3, pattern: crr}]}\n",
                   "matrix.profiles[0].pattern", "iperf3 cannot run"),
    "uperf_udp_crr": (G + "matrix: {profiles: [{name: a, tool: uperf, protocol: udp, pattern: crr}]}\n",
                      "matrix.profiles[0].pattern", "uperf cannot run udp crr"),
    "netperf_udp_crr": (G + "matrix: {profiles: [{name: a, protocol: udp, pattern: crr}]}\n",
                        "matrix.profiles[0].pattern", "no UDP_CRR test"),
    "netperf_udp_maerts": (G + "matrix: {profiles: [{name: a, protocol: udp, pattern: maerts}]}\n",
                           "matrix.profiles[0].pattern", "no UDP_MAERTS test"),
    "netperf_bidirectional": (G + "matrix: {profiles: [{name: a, pattern: bidirectional}]}\n",
                              "matrix.profiles[0].pattern", "no bidirectional test"),
    "netperf_rate": (G + "matrix: {profiles: [{name: a, rate_bps: 1000000}]}\n", "matrix.profiles[0].rate_bps",
                     "cannot pace"),
    "uperf_rate": (G + "matrix: {profiles: [{name: a, tool: uperf, rate_bps: 1000000}]}\n",
                   "matrix.profiles[0].rate_bps", "uperf cannot run tcp stream at a bit rate"),
    "default_bridge_across_hosts": ("hosts: [{name: ha, transport: netns}, {name: hb, transport: netns}]\n"
                                    "guests: [{name: g1, host: ha}, {name: g2, host: hb}]\n" + M, "matrix",
                                    "attachment bridge joins guests on one host"),
    "alias_bomb_list": (G + "matrix: {profiles: [&p {name: a}, " + ", ".join(["*p"] * 2000) + "]}\n",
                        "matrix.profiles", "a list has at most 1000"),
    "subnet_32": ("subnet: 198.18.0.1/32\n" + G + M, "subnet", "too small"),
    "subnet_31": ("subnet: 198.18.0.0/31\n" + G + M, "subnet", "needs a /30 or larger"),
    "too_many_cells": (G + "matrix: {mtus: [" + ", ".join(str(1000 + i) for i in range(100)) + "], connections: ["
                       + ", ".join(str(i) for i in range(1, 31)) + "], profiles: [{name: a, duration: 1}]}\n",
                       "matrix", "3000 cells exceed the cap of 2000"),
    "too_long": (G + "matrix: {profiles: [{name: a, duration: 3600}, {name: b, duration: 3600}], "
                 "repetitions: {min: 1, max: 30}}\n", "matrix", "over the cap of 48 h"),
    "limits_beyond_ceiling": ("limits: {max_cells: 1000000}\n" + G + M, "limits.max_cells", "out of range"),
    "limits_unknown_key": ("limits: {cells: 5}\n" + G + M, "limits.cells", "unknown key"),
    # pairs and paced load
    "pairs_zero": (G + "matrix: {pairs: [0], profiles: [{name: a}]}\n", "matrix.pairs[0]", "out of range"),
    "pairs_beyond_memory": ("guests: [{name: g1, memory_mib: 16384}, {name: g2, memory_mib: 16384}]\n"
                            "matrix: {pairs: [1, 8], profiles: [{name: a}]}\n", "matrix.pairs",
                            "at most"),
    "pairs_subnet_too_small": ("subnet: 198.18.0.0/29\n" + G + "matrix: {pairs: [4], profiles: [{name: a}]}\n",
                               "matrix.pairs", "4 pairs need 8 addresses"),
    "pairs_on_ssh_host": (SSH_HOSTS % ('"qemu+ssh://root@hb/system"', "root@hb") + "tunnel: {underlay: tbu0}\n"
                          + "matrix: {attachments: [macvtap], pairs: [2], profiles: [{name: a}]}\n",
                          "matrix.pairs", "placement cannot be promised"),
    "pairs_across_emulated_hosts": ("hosts: [{name: ha, transport: netns}, {name: hb, transport: netns}]\n"
                                    "guests: [{name: g1, host: ha}, {name: g2, host: hb}]\n"
                                    "tunnel: {underlay_mtu: 1600}\n"
                                    "matrix: {attachments: [ovs-vxlan], pairs: [1, 2], profiles: [{name: a}]}\n",
                                    "matrix.pairs", "a two-host attachment joins one client/server pair"),
    "pairs_clone_name_taken": ("guests: [{name: g1}, {name: g2}, {name: g1-p2}]\n"
                               "matrix: {pairs: [2], profiles: [{name: a}]}\n", "matrix.pairs",
                               "is taken by another guest"),
    "pairs_macvtap_passthrough": (G + "macvtap: {mode: passthrough, lower: [tbx0, tbx1]}\n"
                                  "matrix: {attachments: [macvtap], pairs: [2], profiles: [{name: a}]}\n",
                                  "matrix.pairs", "2 pairs need 4"),
    "rate_not_a_rate": (G + "matrix: {profiles: [{name: a, tool: iperf3, rate: fast}]}\n",
                        "matrix.profiles[0].rate", "is not a rate"),
    "rate_tps_on_stream": (G + "matrix: {profiles: [{name: a, tool: iperf3, rate: 5000tps}]}\n",
                           "matrix.profiles[0].rate", "paced in bits per second"),
    "rate_bits_on_rr": (G + "matrix: {profiles: [{name: a, pattern: rr, rate: 2gbit}]}\n",
                        "matrix.profiles[0].rate", "in transactions per second"),
    "rate_netperf_crr": (G + "matrix: {profiles: [{name: a, pattern: crr, rate: 100tps}]}\n",
                         "matrix.profiles[0].rate", "does not cover TCP_CRR"),
    "rate_bits_on_uperf": (G + "matrix: {profiles: [{name: a, tool: uperf, rate: 1gbit}]}\n",
                           "matrix.profiles[0].rate", "uperf paces transactions per second"),
    "rate_and_rate_bps": (G + "matrix: {profiles: [{name: a, tool: iperf3, rate: 1gbit, rate_bps: 1000}]}\n",
                          "matrix.profiles[0].rate", "either rate or rate_bps"),
    # each connection sends a whole number a second: 6 across 4 would offer 4
    "rate_not_split": (G + "matrix: {connections: [1, 4], profiles: [{name: a, tool: sockperf, pattern: rr, "
                           "message_size: 64, rate: 6tps}]}\n",
                       "matrix.profiles[0]", "rate 6tps: split across 4 connections, each would send 1/s, 4/s in all"),
}


def _cli(argv: list[str]) -> tuple[int, str]:
    err, out = io.StringIO(), io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
        rc = cli.main(argv)
    return rc, err.getvalue()


@pytest.fixture
def no_execute(monkeypatch):
    """runner.execute is where a run creates things; a bad topology must never get there."""
    from testbed.measure import runner

    def refuse(*_a, **_k):
        raise AssertionError("runner.execute reached with a bad topology")
    monkeypatch.setattr(runner, "execute", refuse)


def _assert_one_line(rc: int, err: str, f: Path, field: str, words: str) -> None:
    lines = err.splitlines()
    assert rc == 2, err
    assert len(lines) == 1, err
    assert "Traceback" not in err
    assert lines[0].startswith(f"testbed: {f}"), lines[0]
    assert f": {field}: " in lines[0], lines[0]
    assert words in lines[0], lines[0]


@pytest.mark.parametrize("case", sorted(CORPUS))
def test_corpus_validate_and_run_exit_2_one_line(tmp_path, monkeypatch, no_execute, case):
    text, field, words = CORPUS[case]
    monkeypatch.setenv("TESTBED_STATE", str(tmp_path / "state"))
    monkeypatch.setenv("TESTBED_RESULTS", str(tmp_path / "results"))
    f = tmp_path / "bad.yaml"
    f.write_text(text)
    for cmd in ("validate", "run"):
        _assert_one_line(*_cli([cmd, str(f)]), f, field, words)
    assert not (tmp_path / "state").exists() and not (tmp_path / "results").exists()


def test_good_limits_raise_the_caps(tmp_path):
    text = CORPUS["too_many_cells"][0]
    t = config.parse("limits: {max_cells: 3000}\n" + text, "t.yaml")
    assert config.cell_count(t.matrix) == 3000
    long = CORPUS["too_long"][0]
    assert config.parse("limits: {max_hours: 61}\n" + long, "t.yaml").matrix.repetitions.max_samples == 30


def test_cell_count_matches_the_plan():
    from testbed.measure import runner
    t = config.parse(G + "matrix: {attachments: [bridge, netns-veth], backends: [qemu, vhost], queues: [1, 2], "
                     "mtus: [1500, 9000], profiles: [{name: a}, {name: b}]}\n", "t.yaml")
    assert config.cell_count(t.matrix) == len(runner.plan(t)) == 4 * 2 * 2 + 2 * 2


def test_the_smallest_subnet_is_the_one_the_runner_needs():
    t = config.parse("subnet: 198.18.0.0/30\n" + G + M, "t.yaml")
    import ipaddress
    net = ipaddress.ip_network(t.subnet)
    # the runner's endpoints: network+1 and network+2, both usable host addresses
    assert {net.network_address + 1, net.network_address + 2} <= set(net.hosts())


# -- file-system cases: each is one line naming the file ---------------------------------

def _fs_case(tmp_path: Path, make) -> tuple[Path, int, str]:
    f = make(tmp_path)
    rc, err = _cli(["validate", str(f)])
    return f, rc, err


@pytest.mark.parametrize("kind", ["symlink_loop", "directory", "binary", "latin1", "huge", "fifo", "missing",
                                  "newline_in_name", "unreadable"])
def test_files_that_cannot_be_read(tmp_path, kind):
    f = tmp_path / ("bad\nname.yaml" if kind == "newline_in_name" else "bad.yaml")
    words = "cannot read"
    if kind == "symlink_loop":
        os.symlink(tmp_path / "other.yaml", f)
        os.symlink(f, tmp_path / "other.yaml")
    elif kind == "directory":
        f.mkdir()
    elif kind == "binary":
        f.write_bytes(b"\xff\xfe\x00\x01" * 10)
        words = "not UTF-8"
    elif kind == "latin1":
        f.write_bytes("name: caf\u00e9\n".encode("latin-1"))
        words = "not UTF-8"
    elif kind == "huge":
        f.write_text("# " + "x" * (yamlnode.MAX_FILE_BYTES + 10) + "\n")
        words = "too large"
    elif kind == "fifo":
        os.mkfifo(f)
        words = "not a regular file"
    elif kind == "missing":
        words = "no such file"
    elif kind == "newline_in_name":
        f.write_text("guests: [\n")
        words = "malformed YAML"
    elif kind == "unreadable":
        if os.geteuid() == 0:
            pytest.skip("root reads any file")
        f.write_text(G + M)
        f.chmod(0)
    rc, err = _cli(["validate", str(f)])
    assert rc == 2, err
    assert len(err.splitlines()) == 1, err
    assert words in err, err
    shown = str(f).replace("\n", "\\n")
    assert err.startswith(f"testbed: {shown}"), err


def test_control_characters_in_yaml_text(tmp_path):
    f = tmp_path / "bad.yaml"
    f.write_text("name: a\x00b\n" + G + M)
    rc, err = _cli(["validate", str(f)])
    assert rc == 2 and len(err.splitlines()) == 1 and "(yaml)" in err, err


def test_a_text_file_is_not_a_qcow2_image(tmp_path):
    img = tmp_path / "disk.qcow2"
    img.write_text("not an image\n")
    f = tmp_path / "t.yaml"
    f.write_text(f"guests: [{{name: g1, image: {img}}}, {{name: g2}}]\n" + M)
    before = sorted(p.name for p in tmp_path.iterdir())
    _assert_one_line(*_cli(["validate", str(f)]), f, "guests[0].image", "not a qcow2 image")
    assert sorted(p.name for p in tmp_path.iterdir()) == before     # validate created nothing


def test_qcow2_images_pass_and_backing_files_do_not(tmp_path):
    base, over = tmp_path / "base.qcow2", tmp_path / "over.qcow2"
    try:
        subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2", str(base), "1M"], check=True, timeout=60)
        subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2", "-F", "qcow2", "-b", str(base), str(over)],
                       check=True, timeout=60)
    except FileNotFoundError:
        pytest.skip("qemu-img missing (package qemu-utils)")
    t = config.parse(f"guests: [{{name: g1, image: {base}}}, {{name: g2}}]\n" + M, str(tmp_path / "t.yaml"))
    assert t.guests[0].image == str(base)
    with pytest.raises(ConfigError, match="backing file"):
        config.parse(f"guests: [{{name: g1, image: {over}}}, {{name: g2}}]\n" + M, str(tmp_path / "t.yaml"))
    ext, data = tmp_path / "ext.qcow2", tmp_path / "ext.raw"
    subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2", "-o", f"data_file={data}", str(ext), "1M"],
                   check=True, timeout=60)
    with pytest.raises(ConfigError, match="data file"):
        config.parse(f"guests: [{{name: g1, image: {ext}}}, {{name: g2}}]\n" + M, str(tmp_path / "t.yaml"))


def test_aliases_that_multiply_work_are_refused_within_seconds(tmp_path):
    """A few KB of YAML aliases: a profile of 1,000 rates named 1,000 times made a million
    profiles before the duplicate names were seen (49 s), and one guest with an image
    aliased 1,000 times ran qemu-img 1,000 times (15 s)."""
    rates = ", ".join(f"{i + 1}tps" for i in range(1000))
    f = tmp_path / "t.yaml"
    f.write_text("name: x\nguests: [{name: g1}, {name: g2}]\nmatrix:\n  attachments: [bridge]\n  profiles:\n"
                 f"    - &p {{name: tcp_rr, pattern: rr, rates: [{rates}]}}\n" + "    - *p\n" * 999)
    t0 = time.monotonic()
    _assert_one_line(*_cli(["validate", str(f)]), f, "matrix.profiles", "expands to more than 4096 profiles")
    assert time.monotonic() - t0 < 10
    img = tmp_path / "disk.qcow2"
    try:
        subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2", str(img), "1M"], check=True, timeout=60)
    except FileNotFoundError:
        pytest.skip("qemu-img missing (package qemu-utils)")
    f.write_text(f"guests: [&g {{name: g1, image: {img}}}" + ", *g" * 999 + "]\n" + M)
    t0 = time.monotonic()
    _assert_one_line(*_cli(["validate", str(f)]), f, "guests[1]", "duplicate guest name 'g1'")
    assert time.monotonic() - t0 < 10


def test_run_refuses_bad_input_while_another_run_holds_the_host(tmp_path):
    """The host lock is taken by runner.execute; validation comes first, so bad input is
    exit 2 (not 4, 'host busy') even while another run holds the host."""
    from testbed.admin import cleanup
    state = tmp_path / "state"
    env = {**os.environ, "TESTBED_STATE": str(state), "TESTBED_RESULTS": str(tmp_path / "res")}
    f = tmp_path / "bad.yaml"
    f.write_text(CORPUS["iperf3_rr"][0])
    old = os.environ.get("TESTBED_STATE")
    os.environ["TESTBED_STATE"] = str(state)
    try:
        with cleanup.host_lock("20260101T000000Z-held", shared=False):
            held = cleanup.lock_path().read_text()
            p = subprocess.run([sys.executable, "-m", "testbed", "run", str(f)], capture_output=True, text=True,
                               timeout=120, env=env)
            assert cleanup.lock_path().read_text() == held
    finally:
        if old is None:
            del os.environ["TESTBED_STATE"]
        else:
            os.environ["TESTBED_STATE"] = old
    assert p.returncode == 2, p.stderr
    assert len(p.stderr.splitlines()) == 1 and str(f) in p.stderr and "matrix.profiles[0].pattern" in p.stderr
    assert not (tmp_path / "res").exists()


def test_ssh_and_scp_put_dashdash_before_the_host(tmp_path, monkeypatch):
    from testbed.host import proc, remote
    from testbed.topology.model import HostSpec
    h = HostSpec(name="hb", uri="qemu+ssh://root@hb/system", transport="ssh", ssh_target="root@hb")
    argv = remote.shell(h).argv(["true"])
    assert argv[argv.index("--") + 1] == "root@hb" and argv[-1] == "true"
    calls = []
    monkeypatch.setattr(proc, "run", lambda argv, **k: calls.append(list(argv)))   # the argv scp would get
    remote.shell(h).put(tmp_path / "-x", "/tmp/y")
    (scp,) = calls
    assert scp[0] == "scp" and scp[scp.index("--") + 1:] == [str(tmp_path / "-x"), "root@hb:/tmp/y"]


def test_ssh_never_reads_the_target_as_an_option(tmp_path):
    """Belt and braces behind config's refusal: even a target that slipped past it is a host
    name to the real ssh, not -oProxyCommand (which would run the command here)."""
    import shutil
    if not shutil.which("ssh"):
        pytest.skip("ssh missing (package openssh-client)")
    from testbed.host import remote
    from testbed.topology.model import HostSpec
    pwned = tmp_path / "pwned"
    h = HostSpec(name="hb", uri="qemu+ssh://root@hb/system", transport="ssh",
                 ssh_target=f"-oProxyCommand=touch {pwned}", known_hosts=str(tmp_path / "kh"))
    (tmp_path / "kh").write_text("")
    r = remote.shell(h).run(["true"], timeout=60, check=False)
    assert r.rc != 0 and not pwned.exists(), r


def test_a_missing_capability_names_the_file_and_field(tmp_path):
    """Exit 3 (a capability the host lacks) names the file and the field that asked for it."""
    from testbed.admin import capabilities
    from testbed.errors import CapabilityError
    from testbed.measure import runner
    ok, _ = capabilities.vhost_net()
    if ok:
        pytest.skip("this host has /dev/vhost-net: backend vhost is not a missing capability here")
    f = tmp_path / "t.yaml"
    f.write_text(G + "matrix: {backends: [qemu, vhost], profiles: [{name: a}]}\n")
    with pytest.raises(CapabilityError) as ei:
        runner.preflight(config.load(f))      # preflight creates nothing
    assert str(ei.value).startswith(f"{f}: matrix.backends[1]: backend vhost requested but unavailable")
    assert ei.value.exit_status == 3 and "\n" not in str(ei.value)


def test_accelerator_kvm_without_dev_kvm_names_the_field(tmp_path):
    from testbed.admin import capabilities
    from testbed.errors import CapabilityError
    from testbed.measure import runner
    if capabilities.kvm_device()[0]:
        pytest.skip("this host opens /dev/kvm: accelerator kvm is decided by a probe boot at run time")
    f = tmp_path / "t.yaml"
    f.write_text("accelerator: kvm\n" + G + M)
    with pytest.raises(CapabilityError) as ei:
        runner.preflight(config.load(f))
    assert str(ei.value).startswith(f"{f}: accelerator: accelerator kvm requested but unavailable")
