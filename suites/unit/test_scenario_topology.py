"""Scenarios build their runner topologies with the model's constructors. They are the same
Topology the YAML loader makes of the same fields (the text the scenarios used to generate and
parse back), defaults included, so a scenario's run.json and cell hashes did not change."""
from __future__ import annotations

import dataclasses

import pytest

from testbed.scenarios import c_ovs_analysis as c
from testbed.scenarios import e_macvtap_vs_ovs as e
from testbed.scenarios import session as ses
from testbed.topology import config
from testbed.topology.model import Attachment


def _e_text(name: str, attachments, quick: bool, two_hosts: bool, tool: str) -> str:
    secs = 3 if quick else 30
    sizes = {"large": 16384} if quick else {"small": 64, "medium": 1024, "large": 16384}
    rr = {"small": 1} if quick else {"small": 1, "medium": 1024, "large": 16384}
    profiles = [f"{{name: stream_{k}, tool: {tool}, pattern: stream, message_size: {v}, duration: {secs}}}"
                for k, v in sizes.items()]
    profiles += [f"{{name: rr_{k}, tool: {tool}, pattern: rr, message_size: {v}, response_size: {v}, "
                 f"duration: {secs}}}" for k, v in rr.items()]
    place = ("hosts: [{name: h1, transport: netns}, {name: h2, transport: netns}]\n"
             "guests: [{name: g1, host: h1}, {name: g2, host: h2}]\ntunnel: {underlay_mtu: 9050}"
             if two_hosts else "guests: [{name: g1}, {name: g2}]")
    conns = "[1]" if quick else "[1, 10, 50, 100, 250]"
    body = "\n".join(f"    - {p}" for p in profiles)
    return (f"name: {name}\n{place}\nmatrix:\n  attachments: [{', '.join(a.value for a in attachments)}]\n"
            f"  mtus: [1492, 9000]\n  connections: {conns}\n  profiles:\n{body}\n")


@pytest.mark.parametrize("quick", [True, False], ids=["quick", "full"])
@pytest.mark.parametrize("two_hosts", [False, True], ids=["one-host", "two-hosts"])
@pytest.mark.parametrize("tool", ["netperf", "uperf"])
def test_macvtap_vs_ovs_topology_is_what_the_loader_makes(quick, two_hosts, tool):
    atts = [Attachment("ovs-vxlan"), Attachment("macvtap")] if two_hosts else [Attachment("macvtap"), Attachment("ovs")]
    built = e._topology("scenario-x", atts, quick, two_hosts, None, tool)
    parsed = config.parse(_e_text("scenario-x", atts, quick, two_hosts, tool), f"<scenario {e.NAME}>")
    assert built == dataclasses.replace(parsed, source=built.source)


@pytest.mark.parametrize("off", [False, True], ids=["offloads-default", "offloads-off"])
def test_ovs_analysis_vxlan_topology_is_what_the_loader_makes(monkeypatch, off):
    seen = []

    class Stop(Exception):
        pass

    def execute(topo, progress):
        seen.append(topo)
        raise Stop

    monkeypatch.setattr("testbed.measure.runner.execute", execute)
    with pytest.raises(Stop):
        c._vxlan(True, lambda s: None, None, offloads_off=off)
    text = f"""\
name: scenario-ovs-analysis-vxlan{"-offloads-off" if off else ""}
hosts: [{{name: h1, transport: netns}}, {{name: h2, transport: netns}}]
guests: [{{name: g1, host: h1}}, {{name: g2, host: h2}}]
tunnel: {{underlay_mtu: 1650}}
{"offloads: off" if off else ""}
matrix:
  attachments: [ovs-vxlan]
  mtus: [1600]
  connections: [1]
  profiles:
    - {{name: tcp_stream, pattern: stream, message_size: 16384, duration: 3}}
    - {{name: udp_stream, protocol: udp, pattern: stream, message_size: 1400, duration: 3}}
    - {{name: tcp_maerts, pattern: maerts, message_size: 16384, duration: 3}}
    - {{name: tcp_rr, pattern: rr, message_size: 1, response_size: 1, duration: 3}}
    - {{name: udp_rr, protocol: udp, pattern: rr, message_size: 1, response_size: 1, duration: 3}}
"""
    [built] = seen
    assert built == dataclasses.replace(config.parse(text, "<x>"), source=built.source)


def test_scenarios_generate_no_yaml():
    import inspect
    for mod in (c, e, ses):
        src = inspect.getsource(mod)
        assert "config.parse" not in src and "config.load" not in src, mod.__name__
