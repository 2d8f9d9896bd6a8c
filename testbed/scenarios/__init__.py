"""`testbed scenario list|run NAME`: the five public studies (docs/studies.md) as named scenarios.

Each scenario writes a normal run (results/<run-id>: run.json + samples.jsonl, indexed like
any run) plus ``study.json``: the study-shaped table, the study's published figure beside each
measured one, the environment difference, and a verdict per finding. ``testbed report`` puts
that table into the HTML page. ``quick`` is a reduced version that runs here (TCG, 2 cores)
in a few minutes; full runs are meant for real KVM hosts.
"""
from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from testbed.errors import ConfigError


@dataclass(frozen=True)
class Scenario:
    name: str
    module: str
    summary: str


SCENARIOS = (
    Scenario("bridge-vs-ovs", "a_bridge_vs_ovs",
             "A: Linux bridge vs OVS with bonds and VLANs, nuttcp UDP at a constant rate, loss per second"),
    Scenario("ovs-chain", "b_ovs_chain", "B: 1-9 chained OVS bridges joined by patch ports or veth pairs"),
    Scenario("ovs-analysis", "c_ovs_analysis",
             "C: 64-byte packet rate, latency, flow cache on/off, ct(), VM-OVS-VXLAN-OVS-VM"),
    Scenario("netns-connect", "d_netns_connect",
             "D: four namespace connections, 1-16 streams, offloads on/off, Gbit/s per GHz"),
    Scenario("macvtap-vs-ovs", "e_macvtap_vs_ovs",
             "E: guests on macvtap vs OVS, MTU 1492/9000, stream and RR, 1-250 connections"),
)

#: scenarios without guests: they run on the local host whatever --hosts says
NAMESPACE_ONLY = ("bridge-vs-ovs", "ovs-chain", "netns-connect")


def get(name: str) -> Scenario:
    for s in SCENARIOS:
        if s.name == name:
            return s
    raise ConfigError("testbed scenario", "NAME",
                      f"unknown scenario {name!r}; one of {', '.join(s.name for s in SCENARIOS)}")


def run(name: str, *, quick: bool, hosts_file: str | None = None,
        progress: Callable[[str], None] = lambda s: None) -> tuple[Path, dict]:
    """Run one scenario; returns (its run directory, the study report as written)."""
    from testbed.host import paths
    from testbed.scenarios import study
    sc = get(name)
    hosts = None
    if hosts_file is not None:
        from testbed.topology import config
        hosts = config.load(hosts_file)      # validated before anything is created
    if hosts is not None and sc.name in NAMESPACE_ONLY:
        progress(f"--hosts: {sc.name} runs between namespaces on this host; {hosts_file} is not used")
    mod = importlib.import_module(f"testbed.scenarios.{sc.module}")
    rep = mod.run(quick, progress, hosts)
    run_dir = paths.results_dir() / rep.run_id
    study.write(run_dir, rep)
    return run_dir, rep.to_dict()
