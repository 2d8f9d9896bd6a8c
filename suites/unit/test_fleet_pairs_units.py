"""Pairs of fleet hosts, the remote host guard's readings and the image shipment, without
hosts: pure functions on real shapes, and the image's chunks on real files."""
from __future__ import annotations

import hashlib
import subprocess
import threading

import pytest

from testbed.errors import CommandError
from testbed.fleet import pairs
from testbed.fleet.inventory import Host
from testbed.fleet.record import FleetRun, HostOutcome
from testbed.host import hostwatch, remotewatch
from testbed.host.hostwatch import Guard
from testbed.host.safeio import UserFileError
from testbed.topology.model import NoiseSpec

pytestmark = pytest.mark.unit


def host(name: str, addr: str, data: str | None = "auto", iface: str | None = "eth1", **kw) -> Host:
    v = {"ansible_host": addr, **kw}
    if data:
        v["testbed_data_address"] = f"198.19.1.{addr.rsplit('.', 1)[1]}" if data == "auto" else data
    if iface:
        v["testbed_data_interface"] = iface
    return Host(name, v, name)


def test_pairs_are_named_by_their_first_host():
    hs = [host("a", "10.0.0.1", testbed_peer="b"), host("b", "10.0.0.2"),
          host("c", "10.0.0.3", testbed_peer="d"), host("d", "10.0.0.4")]
    assert [p.name for p in pairs.find("inv", hs, True)] == ["a+b", "c+d"]


@pytest.mark.parametrize("hosts,words", [
    ([host("a", "10.0.0.1", testbed_peer="a")], "names the host itself"),
    ([host("a", "10.0.0.1", testbed_peer="z"), host("b", "10.0.0.2")], "not a host of this run"),
    ([host("a", "10.0.0.1", testbed_peer="b"), host("b", "10.0.0.2"), host("c", "10.0.0.3", testbed_peer="b")],
     "in two pairs"),
    ([host("a", "10.0.0.1", testbed_peer="b"), host("b", "10.0.0.2"), host("c", "10.0.0.3")], "in no pair"),
    ([host("a", "10.0.0.1", testbed_peer="b"), host("b", "10.0.0.2", data=None)], "testbed_data_address: missing"),
    ([host("a", "10.0.0.1", testbed_peer="b"), host("b", "10.0.0.2", iface=None)], "testbed_data_interface"),
    ([host("a", "10.0.0.1", data="198.19.1.9", testbed_peer="b"), host("b", "10.0.0.2", data="198.19.1.9")],
     "is also a's"),
    ([host("a", "10.0.0.1", data="10.0.0.2", testbed_peer="b"), host("b", "10.0.0.2")], "control address"),
    ([host("a", "10.0.0.1", testbed_peer="../b"), host("b", "10.0.0.2")], "is a path"),
    ([host("a", "10.0.0.1", testbed_peer="b"), host("b", "10.0.0.2"),
      host("c", "10.0.0.3", testbed_peer="d"), host("d", "10.0.0.4", data="198.19.1.1")], "d: testbed_data_address: "
                                                                                          "198.19.1.1 is also a's"),
])
def test_bad_pairs_are_refused_naming_host_and_variable(hosts, words):
    with pytest.raises(UserFileError, match=words):
        pairs.find("inv", hosts, True)


def test_two_hosts_that_name_each_other_are_one_pair():
    hs = [host("a", "10.0.0.1", testbed_peer="b"), host("b", "10.0.0.2", testbed_peer="a")]
    assert [p.name for p in pairs.find("inv", hs, True)] == ["a+b"]


def test_a_peer_on_a_one_host_topology_is_refused():
    with pytest.raises(UserFileError, match="runs on one host"):
        pairs.find("inv", [host("a", "10.0.0.1", testbed_peer="b"), host("b", "10.0.0.2")], False)


def test_a_pairs_topology_puts_the_peer_behind_ssh_at_its_data_address():
    data = {"name": "p", "hosts": [{"name": "ha", "transport": "netns"}, {"name": "hb", "transport": "netns"}],
            "guests": [{"name": "g1", "host": "ha"}, {"name": "g2", "host": "hb"}],
            "tunnel": {"vni": 7, "underlay_mtu": 1550}}
    a, b = host("a", "10.0.0.1", testbed_peer="b"), host("b", "10.0.0.2", ansible_port=2222)
    t = pairs.topology(data, a, b, known_hosts="/k", key="/id")
    ha, hb = t["hosts"]
    assert ha == {"name": "ha", "underlay": "eth1"}
    assert hb["ssh"] == "root@198.19.1.2" and hb["ssh_port"] == 2222 and hb["underlay"] == "eth1"
    assert "known_hosts=/k" in hb["uri"] and hb["uri"].startswith("qemu+libssh2://root@198.19.1.2/")
    assert t["tunnel"] == {"vni": 7, "underlay_mtu": 1550} and data["hosts"][0]["transport"] == "netns"


def test_a_pair_is_done_or_failed_as_one(tmp_path):
    from testbed.fleet import engine
    p = engine.Plan([], {}, [pairs.Pair("a", "b"), pairs.Pair("c", "d"), pairs.Pair("e", "f")])
    hosts = (HostOutcome("a", "done", run_dir="hosts/a/r", run_id="r", run_status="complete"),
             HostOutcome("b", "running"),
             HostOutcome("c", "failed", reason="run: testbed run: exited 4"), HostOutcome("d", "running"),
             HostOutcome("e", "done", run_dir="hosts/e/r", run_id="r2"), HostOutcome("f", "failed", reason="unreachable"))
    f = engine._pair_outcomes(FleetRun("x", tmp_path, "i", "t", None, 1, None, "now", hosts), p, list("abcdef"))
    got = {h.name: h for h in f.hosts}
    assert got["b"].status == "done" and got["b"].run_dir == "hosts/a/r"
    assert got["d"].status == "failed" and "first host c failed" in got["d"].reason
    assert got["e"].status == "failed" and "second host f failed: unreachable" in got["e"].reason
    assert got["c"].reason == "run: testbed run: exited 4"


PROBE = """\
daemon ovs-vswitchd 812 4521 ovs-vswitchd
daemon libvirtd - - -
object tb-ab12-ovsb 1
object tb-ab12-e1 0
console g2 0
stat cpu  1000 0 500 8000 10 20 30 0 0 0
runq 3
clk 100
own 150 ovs-vswitchd
own 50 sshd
own 400 stress-ng
own 7 qemu-system-x86
"""


def test_a_remote_hosts_reading_is_parsed():
    r = remotewatch.parse(PROBE, at=10.0)
    assert r.daemons["ovs-vswitchd"].pid == 812 and r.daemons["ovs-vswitchd"].started == 4521.0
    assert r.daemons["libvirtd"].pid is None
    assert r.objects == {"tb-ab12-ovsb": True, "tb-ab12-e1": False} and r.consoles == {"g2": False}
    assert (r.busy, r.kernel, r.runq, r.own_ticks) == (1550, 50, 3, 207)


def test_remote_noise_is_busy_less_interrupts_and_the_testbeds_own():
    a = remotewatch.parse(PROBE, at=10.0)
    b = remotewatch.parse(PROBE.replace("1000 0 500", "1400 0 700").replace("20 30", "40 60")
                          .replace("own 400 stress-ng", "own 500 stress-ng")
                          .replace("own 150 ovs-vswitchd", "own 250 ovs-vswitchd"), at=12.0)
    f = remotewatch.figure(a, b)
    # busy: (600 + 50) ticks / 100 / 2 s = 3.25 cores; interrupts 0.25; the testbed's 0.5
    assert f["busy_cores"] == 3.25 and f["own_cores"] == 0.5 and f["other_cores"] == 2.5
    why = remotewatch.judge(NoiseSpec(threshold_cores=1.0, run_queue=2), {"hb": f})
    assert "host hb: 2.50 cores used by other work" in why and "run queue 3" in why
    assert remotewatch.judge(NoiseSpec(threshold_cores=3.0), {"hb": f}) is None
    # a "remote" host that is this machine: this harness's own cores are not its noise
    assert f["this_machine"] is False and remotewatch.less_harness(f, 1.0) == f
    here = {**f, "this_machine": True}
    assert remotewatch.less_harness(here, 1.0)["other_cores"] == 1.5


def test_the_probe_script_quotes_every_name():
    class Sh:
        class host:
            name = "hb"
    p = remotewatch.Probe(Sh())
    p.watch_daemon("ovs-vswitchd", remotewatch.ovs_pidfiles("ovs-vswitchd"))
    remotewatch.object_check(p, "tb-x; rm -rf /")
    script = p.script()
    assert "o 'tb-x; rm -rf /'" in script and '"${OVS_RUNDIR:-/var/run/openvswitch}/"ovs-vswitchd.pid' in script
    out = subprocess.run(["sh", "-n", "-c", script], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr


def test_an_image_ships_in_chunks_with_its_sums(tmp_path, monkeypatch):
    from testbed.fleet import image
    monkeypatch.setattr(image, "CHUNK_BYTES", 1000)
    src = tmp_path / "debian12-abc"
    src.mkdir()
    (src / "root.qcow2").write_bytes(bytes(range(256)) * 10)      # 2560 bytes: three chunks
    (src / "manifest.json").write_text("{}")
    s = image.prepare(src, tmp_path / "store")
    assert [n for n, _ in s.chunks] == ["manifest.json.0000", "root.qcow2.0000", "root.qcow2.0001",
                                        "root.qcow2.0002"]
    assert f"{hashlib.sha256((src / 'root.qcow2').read_bytes()).hexdigest()}  root.qcow2" in s.sums
    joined = b"".join(open(path, "rb").read() for n, path in s.chunks if n.startswith("root"))
    assert joined == (src / "root.qcow2").read_bytes()
    assert image.prepare(src, tmp_path / "store") == s           # made once, then reused


def test_a_remote_hosts_reading_holds_while_its_processes_come_and_go():
    """The probe script, run for real on this machine's /proc while processes start and end
    beside it: a process that ends between the glob and its read must not cut the reading
    (Debian's awk stops at a file it cannot open; the objects then looked removed)."""
    class Sh:
        class host:
            name = "hb"

        def run(self, argv, timeout=30):
            r = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
            if r.returncode:
                raise CommandError(argv, r.returncode, r.stderr)
            return r
    p = remotewatch.Probe(Sh())
    there, gone = remotewatch.object_check(p, "lo"), remotewatch.object_check(p, "tb-nosuch-e1")
    stop = threading.Event()

    def churn():
        while not stop.is_set():
            subprocess.run(["true"])
    workers = [threading.Thread(target=churn) for _ in range(4)]
    for w in workers:
        w.start()
    try:
        readings = [p.read(max_age=0) for _ in range(30)]
    finally:
        stop.set()
        for w in workers:
            w.join()
    assert all(r.complete and r.busy and r.own_ticks > 0 for r in readings)
    assert there() is True and gone() is False


def test_a_look_that_fails_is_taken_again_and_never_called_a_removal(monkeypatch):
    monkeypatch.setattr(hostwatch, "LOOK_PAUSE_S", 0.0)
    tries = []

    class Sh:
        class host:
            name = "hb"

        def run(self, argv, timeout=30):
            tries.append(1)
            if len(tries) < 3 or broken:
                raise CommandError(["ssh", "hb"], 255, "Connection reset by peer")
            return subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    broken = False
    p = remotewatch.Probe(Sh())
    check = remotewatch.object_check(p, "lo")
    assert Guard(objects=(("lo on host hb", check),)).missing() == [] and len(tries) == 3
    broken = True
    p._last = None
    (why,) = Guard(objects=(("lo on host hb", check),)).missing()
    assert why.startswith("lo on host hb could not be checked (3 looks failed: host hb could not be read: ")
    assert "Connection reset" in why and "went missing" not in why
    # a local check's own error says the object is gone (its counters cannot be read)

    def gone():
        raise CommandError(["netlink", "link", "show", "tb-x-a1"], 19, "link tb-x-a1 not found")
    assert Guard(objects=(("device tb-x-a1", gone),)).missing() == ["device tb-x-a1 went missing (removed from "
                                                                    "outside the run)"]
    # a reading cut short names no object: that is a failed look too, not "not there"
    p = remotewatch.Probe(type("Sh", (), {"host": type("H", (), {"name": "hb"}),
                                          "run": lambda self, argv, timeout=30: type("R", (), {"stdout": "clk 100\n"})})())
    check = remotewatch.object_check(p, "tb-x-e1")
    with pytest.raises(hostwatch.LookFailed, match="cut short"):
        check()
