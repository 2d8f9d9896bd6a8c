"""placement.endpoints on real namespaces: a run's netperf and netserver are kept on the
CPUs the topology gives them (taskset before the tool starts), every sample records the
CPUs each tool thread was allowed and ran on, read from /proc during the window, and a pin
that did not hold (the tools moved from outside mid-sample) fails the sample with both the
asked and the seen CPUs in the reason."""
from __future__ import annotations

import contextlib
import json
import os
import shutil
import threading

import pytest

from testbed import cli
from testbed.analysis import stats
from testbed.host import placement
from testbed.measure import sampling as measure
from testbed.measure import testpaths, window
from testbed.measure.session import claim_tag
from testbed.records import results
from testbed.topology import config
from testbed.topology.model import Attachment, Backend, Cell, EndpointPins, Pattern, Profile, Repetitions

pytestmark = [pytest.mark.netns, pytest.mark.attach("netns")]

CPUS = sorted(os.sched_getaffinity(0))


@pytest.fixture(autouse=True)
def _needs():
    if os.geteuid() != 0:
        pytest.skip("needs root: creates namespaces")
    if len(CPUS) < 2:
        pytest.skip(f"needs two CPUs to pin the client and server apart; this process may use {CPUS}")
    for tool in ("netperf", "netserver", "taskset"):
        if not shutil.which(tool):
            pytest.skip(f"{tool} missing")


def test_a_run_keeps_each_endpoints_tools_on_its_cpus(tmp_path, capsys):
    c, s = CPUS[0], CPUS[1]
    topo = tmp_path / "pins.yaml"
    topo.write_text(f"name: pins\nplacement:\n  endpoints: {{client: [{c}], server: [{s}]}}\n"
                    "matrix:\n  attachments: [netns-veth]\n  profiles:\n"
                    "    - {name: tcp_rr, pattern: rr, message_size: 1, response_size: 1, duration: 2}\n"
                    "  repetitions: {warmup: 0, min: 3, max: 3}\n")
    rc = cli.main(["--results", str(tmp_path / "res"), "run", str(topo)])
    [run_dir] = [p for p in (tmp_path / "res").iterdir() if p.is_dir()]
    samples = [json.loads(line) for line in (run_dir / "samples.jsonl").read_text().splitlines()]
    why = (capsys.readouterr().err, [(smp["status"], smp["reason"]) for smp in samples])
    # The pins are the subject: no sample may fail them. A sample failed by another check
    # (a second source that disagreed on a host busy with other tests) still records its
    # placement, which must have held; that check has its own tests.
    assert rc in (0, 1) and len(samples) == 3, why
    assert not any((smp["reason"] or "").startswith("placement did not hold") for smp in samples), why
    assert any(smp["status"] == "ok" for smp in samples), why
    for smp in samples:
        ends = smp["extra"]["endpoint_placement"]
        by_role = {e["role"]: e for e in ends.values()}
        assert set(by_role) == {"client", "server"}, ends
        for role, cpu, comm in (("client", c, "netperf"), ("server", s, "netserver")):
            e = by_role[role]
            assert e["requested"] == str(cpu) and e["held"] is True, e
            tools = [t for t in e["threads"] if t["comm"] == comm]
            assert tools, e          # the tool was seen in its namespace during the window
            for t in e["threads"]:
                # what /proc said each thread was allowed and where it ran most
                assert t["allowed"] == [str(cpu)] and t["ran_most_on"] == cpu, (role, t)


def test_every_process_a_pinned_namespace_starts_has_its_cpus_from_the_start(tmp_path):
    # Short helpers (a sysfs counter read with cat) run in the namespace too, and the
    # launcher (`ip netns exec`) is in it before it execs the tool: each must already have
    # the endpoint's CPUs, or the window sees a thread allowed elsewhere and fails the sample.
    s = CPUS[1]
    with testpaths.own_endpoints_path(Attachment("netns-veth"), claim_tag(), "198.18.252.4/30", 1500,
                                      str(tmp_path / "ep")) as path:
        agent = path.server.guest.agent
        agent.pin((s,))
        ran = agent.run(["sh", "-c", "grep Cpus_allowed_list /proc/self/status; readlink /proc/self/ns/net"])
        allowed, ns = ran.stdout.split("\n")[:2]
        assert allowed.split()[-1] == str(s), ran.stdout
        assert ns == f"net:[{placement.netns_inode(agent.netns)}]", ran.stdout
        pid = agent.spawn(["sleep", "5"])
        try:
            # the spawned process's own pid is the outermost launcher (taskset, exec'd in place)
            for _ in range(50):
                if open(f"/proc/{pid}/comm").read().strip() == "sleep":
                    break
                threading.Event().wait(0.02)
            status = open(f"/proc/{pid}/status").read()
            assert f"Cpus_allowed_list:\t{s}\n" in status, status
        finally:
            agent.kill(pid)


def test_a_pin_moved_mid_sample_fails_the_sample_naming_both_cpus(tmp_path):
    c, s = CPUS[0], CPUS[1]
    cell = Cell(Attachment("netns-veth"), Backend.QEMU, 1500, 1,
                Profile("tcp_rr", pattern=Pattern.RR, message_size=1, response_size=1, duration_s=3))
    moved: dict = {}

    @contextlib.contextmanager
    def on_window(cell_id: str, rep: int, attempt: int):
        if rep != 0:
            yield
            return
        ino = placement.netns_inode(moved["netns"])
        stop = threading.Event()

        def move() -> None:
            # an outside hand: once netperf runs in the client's namespace (its start may
            # lag on a busy host), every process there onto the server's CPU
            stop.wait(0.5)
            while not stop.is_set() and not any(
                    t.comm == "netperf" for pid in placement.processes_in({ino: "a"})["a"]
                    for t in placement.tool_threads(pid)):
                stop.wait(0.05)
            stop.wait(0.3)
            for pid in placement.processes_in({ino: "a"})["a"]:
                for tid in os.listdir(f"/proc/{pid}/task"):
                    with contextlib.suppress(OSError):
                        os.sched_setaffinity(int(tid), {s})
                        moved.setdefault("tids", []).append(int(tid))
        th = threading.Thread(target=move)
        th.start()
        try:
            yield
        finally:
            stop.set()
            th.join()

    watch = window.Watch(on_window=on_window)
    topo = config.parse("name: pins\nmatrix:\n  attachments: [netns-veth]\n  profiles:\n"
                        "    - {name: tcp_rr, pattern: rr, message_size: 1, response_size: 1, duration: 3}\n",
                        "<pins test>")
    with results.RunWriter(tmp_path / "res", "20260101T000000Z-pins", topo, {"accelerator": "none"}) as w, \
            testpaths.own_endpoints_path(Attachment("netns-veth"), claim_tag(), "198.18.252.0/30", 1500,
                                         str(tmp_path / "ep")) as path:
        testpaths.pin_endpoints([(path.client.guest, path.server.guest)], EndpointPins((c,), (s,)))
        moved["netns"] = path.client.guest.agent.netns
        measure.measure_cell(cell, path, w, stats.StoppingRule(Repetitions(min_samples=2, max_samples=2, rsd_target=0)), 0, {}, {},
                             watch=watch)
    first, second = results.read_run(w.dir).samples
    assert moved.get("tids"), "nothing was moved: the client's tool was not found in its namespace"
    assert first.status == "failed", (first.status, first.reason)
    assert first.reason.startswith("placement did not hold: "), first.reason
    assert f"placement.endpoints.client asked CPUs {c}," in first.reason and f"was allowed {s}" in first.reason, \
        first.reason
    assert first.data["endpoint_placement"][moved["netns"]]["held"] is False
    # the next sample's tools start pinned again and hold
    assert second.status == "ok" and all(e["held"] for e in second.data["endpoint_placement"].values()), \
        (second.status, second.reason)
