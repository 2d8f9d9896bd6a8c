"""A fleet pair for real: Ansible drives two sshd targets, each in its own tb- network
namespace with its own Open vSwitch (ovsdb-server and ovs-vswitchd in the namespace, with
pidfiles in their run folder, reached by the target's sessions through OVS_RUNDIR as a
host's own switch is), and the pair runs a two-host OVS+VXLAN topology: the first target
runs it, reaching the second over ssh at its data address with a key made for the fleet run.

The control plane (Ansible) and the data plane are apart: the controller reaches each
target over a veth of its own (198.19.77.0/24); the targets reach each other only over a
data wire (198.19.88.0/24) whose ends are ports of each target's underlay OVS bridge, which
holds the data address (as an OVS-DPDK host's br-phy does). The VXLAN frames cross only
that wire. One machine's targets share its libvirt, so the pair's endpoints are namespaces
(netns-ovs-vxlan), not guests.

The controller's cached guest image is shipped to both targets too (a small stand-in image
in a cache of the test's own): checksummed, resumed from a chunk already there, skipped on
a second look.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from test_fleet import SSHD, WORKTREE, Target, _keygen, controller, needs, target_netns

from testbed.host import proc
from testbed._suite_plugin import sshd_privsep_dir

# alone: its targets' sshd, OVS underlay and datapath must not meet other root tests' (a
# host snapshot taken beside it sees its ovs-netdev come and go)
pytestmark = [pytest.mark.alone, pytest.mark.netns, pytest.mark.attach("netns-ovs-vxlan")]

TOPOLOGY = """\
name: pair
hosts: [{name: ha}, {name: hb}]
guests: [{name: g1, host: ha}, {name: g2, host: hb}]
tunnel: {vni: 4242}
matrix:
  attachments: [netns-ovs-vxlan]
  mtus: [1400]
  connections: [1]
  profiles:
    - {name: tcp_stream, pattern: stream, message_size: 16384, duration: 2}
  repetitions: {warmup: 0, min: 1, max: 1}
"""


@dataclass
class Pair:
    tag: str
    ctl: str
    targets: list[Target]
    root: Path
    key: Path
    known_hosts: Path
    wheel: Path
    cache: Path
    image: Path


def _ip(*args: str, netns: str | None = None) -> None:
    proc.run(["ip", *args], netns=netns, timeout=30)


@pytest.fixture(scope="module")
def pair(tmp_path_factory) -> Iterator[Pair]:
    needs("netperf", "netserver", "ovs-vswitchd", "ovsdb-server", "ethtool")
    from testbed.host.net import ovsd
    root = tmp_path_factory.mktemp("pair")
    with contextlib.ExitStack() as stack:
        tag, ctl, key = controller(stack, root)
        targets, known = [], []
        for i in range(2):
            ns, addr = target_netns(stack, tag, ctl, i)
            data = f"198.19.88.{i + 1}"
            d = root / f"t{i}"
            d.mkdir()
            known.append(f"{addr} {_keygen(d / 'hostkey')}")
            # the target's own switch: run folder short enough for a unix socket path
            ovs_dir = Path(f"/tmp/tb-{tag}-o{i}")
            stack.callback(shutil.rmtree, ovs_dir, ignore_errors=True)
            sw = stack.enter_context(ovsd.private(ns, ovs_dir))
            ul, wire = f"tb-{tag}-u{i}", f"tb-{tag}-d{i}"
            targets.append((Target(f"t{i}", ns, addr, d / "home", d / "sshd_config", d / "sshd.log"),
                            d, sw, ul, wire, data))
        # the data wire between the targets, each end a port of its target's underlay bridge
        (t0, _, sw0, ul0, w0, _), (t1, _, sw1, ul1, w1, _) = targets
        _ip("-n", t0.netns, "link", "add", w0, "mtu", "1600", "type", "veth", "peer", "name", w1,
            "mtu", "1600", "netns", t1.netns)
        for t, d, sw, ul, wire, data in targets:
            sw.vsctl("add-br", ul, "--", "set", "Bridge", ul, "datapath_type=netdev", "--", "add-port", ul, wire,
                     "--", "set", "Interface", ul, "mtu_request=1600")
            proc.run(["ethtool", "-K", wire, "tx", "off"], netns=t.netns, timeout=10)
            _ip("-n", t.netns, "link", "set", wire, "up")
            _ip("-n", t.netns, "addr", "add", f"{data}/24", "dev", ul)
            _ip("-n", t.netns, "link", "set", ul, "up")
            listen = [t.address, data] if t.name == "t1" else [t.address]
            (d / "pair_keys").write_text("")
            (d / "sshd_config").write_text(
                "Port 22\n" + "".join(f"ListenAddress {x}\n" for x in listen)
                + f"HostKey {d / 'hostkey'}\nPidFile {d / 'sshd.pid'}\n"
                f"AuthorizedKeysFile {root / 'authorized_keys'} {d / 'pair_keys'}\n"
                f"SetEnv OVS_RUNDIR={sw.rundir} OVS_DBDIR={sw.rundir}\n"
                "PermitRootLogin prohibit-password\nPasswordAuthentication no\n"
                "KbdInteractiveAuthentication no\nUsePAM no\nStrictModes no\nSubsystem sftp internal-sftp\n")
        stack.enter_context(sshd_privsep_dir())
        for t, *_ in targets:
            stack.callback(t.kill)
            t.proc = subprocess.Popen(["ip", "netns", "exec", t.netns, SSHD, "-D", "-e", "-f", str(t.config)],
                                      stdout=subprocess.DEVNULL, stderr=open(t.log, "a"))
            proc.run(["sh", "-c", f"for i in $(seq 100); do ss -Htln | grep -q ':22 ' && exit 0; sleep 0.1; done; "
                                  f"exit 1"], netns=t.netns, timeout=30)
        kh = root / "known_hosts"
        kh.write_text("\n".join(known) + "\n")
        # a stand-in for the controller's cached image: its recipe's folder in a cache of our own
        from testbed.guests import images
        recipe = images.load_recipe()
        cache = root / "cache"
        img = cache / "images" / f"{recipe.name}-{recipe.digest()}"
        img.mkdir(parents=True)
        for name, size in (("root.qcow2", 3 << 20), ("vmlinuz", 1 << 20), ("initrd.img", 1 << 19)):
            (img / name).write_bytes(os.urandom(size))
        (img / "manifest.json").write_text(json.dumps({"name": recipe.name, "digest": recipe.digest()}))
        from testbed.fleet import engine
        wheel = engine.build_wheel(root / "wheel")
        yield Pair(tag, ctl, [t for t, *_ in targets], root, key, kh, wheel, cache, img)


def _inventory(p: Pair) -> Path:
    deps = next(x for x in sys.path if x.endswith("site-packages") and Path(x, "yaml").is_dir())
    common = {"ansible_user": "root", "ansible_ssh_private_key_file": str(p.key),
              "ansible_python_interpreter": "/usr/bin/python3", "ansible_become_method": "su",
              "testbed_python": "/usr/bin/python3", "testbed_deps_site": deps,
              "testbed_host_packages": False, "testbed_host_setup": False,
              "testbed_run_timeout": 1800, "testbed_lock_wait": 1500, "testbed_shared_host": True,
              "testbed_known_hosts": str(p.known_hosts), "testbed_ship_image": True}
    hosts = {}
    for i, t in enumerate(p.targets):
        hosts[t.name] = {"ansible_host": t.address, "testbed_home": str(t.home),
                         "testbed_cache": str(p.root / t.name / "cache"),
                         "testbed_authorized_keys": str(p.root / t.name / "pair_keys"),
                         "testbed_machine_id": f"fleet-pair-{t.name}", "testbed_host_class": "gen-p",
                         "testbed_data_address": f"198.19.88.{i + 1}", "testbed_data_interface": f"tb-{p.tag}-u{i}"}
    hosts["t0"]["testbed_peer"] = "t1"
    inv = p.root / "inventory.yml"
    inv.write_text(json.dumps({"all": {"vars": common, "hosts": hosts}}))
    return inv


def _cli(p: Pair, *argv: str) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", "netns", "exec", p.ctl, sys.executable, "-m", "testbed", *argv],
                          capture_output=True, text=True, timeout=1800, cwd=p.root,
                          env={**os.environ, "PYTHONPATH": str(WORKTREE), "TESTBED_CACHE": str(p.cache),
                               "TESTBED_RESULTS": str(p.root / "results")})


def _sums(folder: Path) -> dict[str, str]:
    return {f.name: hashlib.sha256(f.read_bytes()).hexdigest() for f in folder.iterdir() if f.is_file()}


def test_a_pair_runs_ovs_vxlan_across_its_two_targets(pair):
    p = pair
    topo = p.root / "topology.yaml"
    topo.write_text(TOPOLOGY)
    # a shipment cut off half way: one chunk already on t1, another there but damaged
    partial = p.root / "t1" / "cache" / "images" / f"tb-ship-{p.image.name}" / "chunks"
    partial.mkdir(parents=True)
    shutil.copy(p.image / "vmlinuz", partial / "vmlinuz.0000")
    (partial / "root.qcow2.0000").write_bytes(b"damaged")
    r = _cli(p, "fleet", "run", str(_inventory(p)), str(topo), "--wheel", str(p.wheel))
    (p.root / "fleet-run.stderr").write_text(r.stderr)
    fleet_dir = Path(r.stdout.strip().splitlines()[-1]) if r.stdout.strip() else None
    assert fleet_dir is not None, r.stderr[-3000:]
    rec = json.loads((fleet_dir / "fleet.json").read_text())
    hosts = {h["name"]: h for h in rec["hosts"]}
    if any("a dead run left testbed objects behind" in (h.get("reason") or "") for h in hosts.values()):
        pytest.skip(f"another session's leftovers on this machine: {hosts}")
    assert r.returncode == 0, r.stderr[-3000:]
    assert "1 pair(s)" in r.stderr and "fleet: t0 running" in r.stderr
    assert hosts["t0"]["role"] == "first" and hosts["t1"]["role"] == "second"
    assert hosts["t0"]["run_dir"] == hosts["t1"]["run_dir"] and hosts["t0"]["status"] == "done" == hosts["t1"]["status"]
    run = json.loads((fleet_dir / hosts["t0"]["run_dir"] / "run.json").read_text())
    env = run["environment"]
    # both hosts named: the first in the run's environment, the second in its host entry
    assert env["inventory_host"] == "t0" and env["machine_id"] == "fleet-pair-t0"
    far = run["hosts"]["hb"]
    assert far["inventory_host"] == "t1" and far["machine_id"] == "fleet-pair-t1", far
    assert far["machine_id_source"] == "TESTBED_PEER_MACHINE_ID" and far["transport"] == "ssh"
    samples = [json.loads(x) for x in (fleet_dir / hosts["t0"]["run_dir"] / "samples.jsonl").read_text().splitlines()]
    ok = [s for s in samples if s["status"] == "ok"]
    assert ok and ok[0]["metrics"]["throughput_mbps"] > 1, samples
    assert ok[0]["extra"]["datapath"] == "ovs-netdev-vxlan", ok[0]["extra"]
    # the second host was watched too: its noise over the window
    assert "hb" in ok[0]["extra"]["noise"].get("remote", {}), ok[0]["extra"]["noise"]
    # the pair's login is gone from the second target; nothing of the run is left on either
    assert (p.root / "t1" / "pair_keys").read_text().strip() == ""
    for i, t in enumerate(p.targets):
        links = proc.run(["ip", "-o", "link"], netns=t.netns, timeout=10).stdout
        names = [ln.split(":")[1].strip().split("@")[0] for ln in links.splitlines()]
        assert all(n.startswith(f"tb-{p.tag}-") for n in names if n.startswith("tb-")), names
        assert proc.run(["ovs-vsctl", f"--db=unix:/tmp/tb-{p.tag}-o{i}/db.sock", "list-br"],
                        timeout=20).stdout.split() == [f"tb-{p.tag}-u{i}"]
    # the image: on both targets, the controller's bytes, whole (t1's resumed from its chunks)
    for t in p.targets:
        got = p.root / t.name / "cache" / "images" / p.image.name
        assert {k: v for k, v in _sums(got).items() if k != "testbed-image.sha256"} == _sums(p.image)
    assert not (p.root / "t1" / "cache" / "images" / f"tb-ship-{p.image.name}").exists()
    # one run, indexed once, with the pair's two hosts in the fleet report
    r = _cli(p, "fleet", "report", str(fleet_dir))
    assert r.returncode == 0 and "t0" in r.stdout and "t1" in r.stdout, r.stderr
    r = _cli(p, "history", "--db", str(p.root / "results" / "index.sqlite"))
    assert r.returncode == 0 and r.stdout.count(" runs, ") == 1, r.stdout + r.stderr
