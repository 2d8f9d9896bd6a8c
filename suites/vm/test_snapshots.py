"""Guests restored from the snapshot cache: a restored pair measures like a cold-booted one,
a changed spec boots cold and says why, and a run killed mid-restore leaves nothing but the
cache behind once `testbed cleanup` has run.

The session pair (pytest_plugin.guest_pair) goes through the same boot path: restored when
its snapshot matches, otherwise booted cold and its snapshot saved (after which it runs on
from that snapshot too)."""
from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import testbed
from testbed.admin import cleanup
from testbed.analysis import stats
from testbed.guests import guestcache, images, render, virt
from testbed.host import paths
from testbed.measure import sampling as measure
from testbed.measure import testpaths
from testbed.records import results
from testbed.topology.model import Attachment, Backend, Cell, GuestSpec, Pattern, Profile, Repetitions

STREAM = Profile("tcp_stream", pattern=Pattern.STREAM, message_size=16384, duration_s=5)
CELL = Cell(Attachment("bridge"), Backend.QEMU, 1500, 1, STREAM)


@pytest.fixture
def writer(run_writer):
    """The session's run record (pytest_plugin.run_writer): results/<run-id>, real environment."""
    return run_writer


def _throughput(client, server, tag, writer) -> float:
    with testpaths.mode(Attachment("bridge"), Backend.QEMU, tag, client, server, "198.18.0.0/24", 1500) as path:
        [s] = measure.measure_cell(CELL, path, writer, stats.StoppingRule(Repetitions()), 0, {}, {})
    assert s.status == "ok", s.reason
    return s.metrics["throughput_mbps"]


def _snapshot_of(gp, slot: str) -> guestcache.Snapshot:
    with virt.connect("qemu:///system") as conn:
        key = virt.snapshot_key(conn, GuestSpec(slot, "local"), images.ensure(), gp.accelerator)
    snap, why = guestcache.lookup(key)
    assert snap is not None, why
    return snap


def test_session_pair_runs_from_its_snapshots(guest_pair):
    for g in (guest_pair.client, guest_pair.server):
        assert g.snapshot_key, g.boot_reason
        assert g.boot == "restored" or g.snapshot_saved_s is not None, g.boot_reason
        # the clock was set from the host on restore (a cold guest keeps its own, synced at boot)
        guest_now = int(g.agent.run(["/bin/date", "+%s"]).stdout)
        assert abs(guest_now - time.time()) < 5


#: a login user with a key, for a seed that asks cloud-init for one
USER = render.SeedUser("tbseed", ("ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGvAbq3tG2lJ4xQ testbed-seed-check",))


def _applied_the_seed(g, run_id: str, users: tuple) -> None:
    """What the seed asked cloud-init for is there in the guest: its hostname, write_files'
    file, each login user with its key (locked, no password), and `cloud-init status` done
    with both of the image's units up (its cloud-init stages run in one process)."""
    status = g.agent.run(["/usr/bin/cloud-init", "status", "--long"], timeout=120).stdout
    assert "status: done" in status, status
    assert g.agent.run(["/bin/hostname"]).stdout.strip() == g.spec.name
    assert g.agent.read_file("/etc/testbed-run").strip() == run_id
    units = g.agent.run(["/bin/systemctl", "is-active", "cloud-init-local.service", "cloud-final.service"],
                        check=False).stdout.split()
    assert units == ["active", "active"], units
    for u in users:
        entry = g.agent.run(["/usr/bin/getent", "passwd", u.name]).stdout
        assert entry.startswith(f"{u.name}:"), entry
        home = entry.strip().split(":")[5]
        keys = g.agent.read_file(f"{home}/.ssh/authorized_keys")
        assert all(k in keys for k in u.ssh_keys), keys
        assert g.agent.run(["/usr/bin/passwd", "-S", u.name]).stdout.split()[1] == "L"


def test_restored_pair_measures_like_a_cold_pair(guest_pair, writer):
    gp = guest_pair
    restored = _throughput(gp.client, gp.server, gp.tag, writer)
    with contextlib.ExitStack() as stack:
        run_id, tag, state = stack.enter_context(cleanup.owned_fresh_state(results.new_run_id))
        conn = stack.enter_context(virt.connect("qemu:///system"))
        # The cold client's seed asks for a login user too: the image's trimmed cloud-init
        # applies all of it.
        cold = [stack.enter_context(virt.guest(conn, GuestSpec(n, "local"), images.ensure(), gp.accelerator,
                                               run_id, tag, state, snapshots="off", users=users))
                for n, users in (("g1", (USER,)), ("g2", ()))]
        for g in cold:
            g.wait_ready(900)
            assert g.boot == "cold" and g.boot_reason == "snapshots off"
        for g, users in zip(cold, ((USER,), ())):
            _applied_the_seed(g, run_id, users)
        cold_mbps = _throughput(cold[0], cold[1], tag, writer)
    # TCG: functional figures; same order of magnitude is the claim, not equality.
    assert restored > 0 and cold_mbps > 0
    assert 0.1 < restored / cold_mbps < 10, (restored, cold_mbps)


def test_changed_memory_boots_cold_and_says_why(guest_pair):
    _snapshot_of(guest_pair, "g1")
    with cleanup.owned_fresh_state(results.new_run_id) as (run_id, tag, state), virt.connect("qemu:///system") as conn:
        with virt.guest(conn, GuestSpec("g1", "local", memory_mib=1536), images.ensure(),
                        guest_pair.accelerator, run_id, tag, state) as g:
            assert g.boot == "cold"
            assert "memory_mib 1024 -> 1536" in g.boot_reason
            assert g.record()["boot"] == "cold" and g.record()["boot_reason"] == g.boot_reason
    # left before it was ready: nothing was saved under the new key
    with virt.connect("qemu:///system") as conn:
        key = virt.snapshot_key(conn, GuestSpec("g1", "local", memory_mib=1536), images.ensure(),
                                guest_pair.accelerator)
    assert guestcache.lookup(key)[0] is None


CHILD = """
import sys, time
from testbed.admin import cleanup, capabilities
from testbed.guests import images, virt
from testbed.records import results
from testbed.topology.model import Accelerator, GuestSpec
with cleanup.owned_fresh_state(results.new_run_id) as (run_id, tag, state), virt.connect("qemu:///system") as conn:
    print(tag, flush=True)
    with virt.guest(conn, GuestSpec("g1", "local"), images.ensure(), Accelerator(sys.argv[1]), run_id, tag, state) as g:
        print(g.boot, flush=True)
        time.sleep(600)
"""


def _files(snap: guestcache.Snapshot) -> dict:
    return {f.name: (f.stat().st_size, f.stat().st_mtime_ns) for f in snap.folder.iterdir()}


@pytest.mark.alone      # a dead run's objects and `testbed cleanup`, which removes every dead run's
def test_sigkill_mid_restore_then_cleanup_leaves_only_the_cache(guest_pair):
    snap = _snapshot_of(guest_pair, "g1")
    before = _files(snap)
    # The child imports this very checkout's package, wherever the test runs from.
    env = {**os.environ, "PYTHONPATH": str(Path(testbed.__file__).resolve().parents[1])}
    child = subprocess.Popen([sys.executable, "-c", CHILD, guest_pair.accelerator.value], stdout=subprocess.PIPE,
                             text=True, env=env)
    try:
        tag = child.stdout.readline().strip()
        assert tag, "child printed no tag"
        # Kill as soon as the restore is under way: its copy of the save image is there.
        image = paths.state_dir() / f"tb-{tag}" / f"tb-{tag}-g1.save"
        deadline = time.monotonic() + 120
        while not image.exists() and child.poll() is None and time.monotonic() < deadline:
            time.sleep(0.005)
        assert image.exists(), "restore never started"
        child.send_signal(signal.SIGKILL)
        child.wait(30)
    finally:
        with contextlib.suppress(ProcessLookupError):
            child.kill()
    time.sleep(1)
    mine = lambda names: [n for n in names if n.startswith(f"tb-{tag}")]  # noqa: E731
    # `testbed cleanup` itself, as a user would run it: it removes only dead runs' objects, so
    # this session's live guest pair stays. libvirtd may still be finishing the restore it
    # was asked for, so cleanup is repeated until nothing of the killed run is left.
    deadline = time.monotonic() + 60
    while True:
        p = subprocess.run([sys.executable, "-m", "testbed", "cleanup"], env=env, text=True,
                           capture_output=True, timeout=300)
        left = cleanup.find(include_live=True)
        if not any(mine(names) for names in left.kinds().values()):
            break
        assert time.monotonic() < deadline, (p.returncode, p.stderr)
        time.sleep(1)
    left = cleanup.find(include_live=True)
    assert "ovs_bridges" in left.kinds()       # the ovs mode's own kind is looked for too
    for f, names in left.kinds().items():
        assert not mine(names), (f, names)
    with virt.connect("qemu:///system") as conn:
        assert not [d.name() for d in conn.listAllDomains() if d.name().startswith(f"tb-{tag}")]
    assert _files(snap) == before, "the cache was touched"
    assert guestcache.lookup(snap.key)[0] == snap
