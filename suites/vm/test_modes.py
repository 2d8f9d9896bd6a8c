"""macvtap's vepa and passthrough modes, a lower device named by the user, and multiqueue
NICs, on the session's guest pair. Each test asserts what the host and the guests show:
frames on the lower device, queues the guest driver exposes, the user's device unchanged."""
from __future__ import annotations

import dataclasses

import pytest

from testbed import attachments
from testbed.analysis import stats
from testbed.attachments.macvtap import plumbing as macvtap
from testbed.host.net import links
from testbed.measure import sampling as measure
from testbed.measure import testpaths
from testbed.topology.config import default
from testbed.topology.model import (
    Attachment,
    Backend,
    Cell,
    MacvtapMode,
    MacvtapSpec,
    Offloads,
    Pattern,
    Profile,
    Repetitions,
)

STREAM = Profile("tcp_stream", pattern=Pattern.STREAM, message_size=16384, duration_s=3)
IFF_MULTI_QUEUE = 0x0100    # <linux/if_tun.h>


@pytest.fixture
def writer(run_writer):
    """The session's run record (pytest_plugin.run_writer): results/<run-id>, real environment."""
    return run_writer


@pytest.fixture(autouse=True)
def _macvtap_available():
    why = attachments.unavailable(Attachment("macvtap"))
    if why:
        pytest.skip(f"macvtap unavailable: {why}")


def _with(spec: MacvtapSpec):
    # the mode reads its `macvtap:` block from the topology
    return dataclasses.replace(default(), macvtap=spec)


def _measure(path, writer, cell):
    [s] = measure.measure_cell(cell, path, writer, stats.StoppingRule(Repetitions()), 0, {}, {})
    return s


@pytest.mark.attach("macvtap")
@pytest.mark.parametrize("mode", [MacvtapMode.VEPA, MacvtapMode.PASSTHROUGH], ids=lambda m: m.value)
def test_macvtap_mode_puts_traffic_on_the_lower_device(guest_pair, writer, mode):
    gp = guest_pair
    cell = Cell(Attachment("macvtap"), Backend.QEMU, 1500, 1, STREAM)
    with testpaths.mode(Attachment("macvtap"), Backend.QEMU, gp.tag, gp.client, gp.server, "198.18.0.0/24",
                     1500, topology=_with(MacvtapSpec(mode=mode))) as path:
        lw0 = f"tb-{gp.tag}-lw0"
        before = links.counters(lw0)
        s = _measure(path, writer, cell)
        after = links.counters(lw0)
    assert s.status == "ok", s.reason
    assert s.data["datapath"] == f"macvtap-{mode.value}"
    # Unlike bridge mode, vepa and passthrough send guest-to-guest frames out of the lower
    # device: it carried at least most of what netperf reported.
    moved = max(after[0] - before[0], after[1] - before[1]) * 8 / 1e6
    assert moved > 0.5 * s.metrics["throughput_mbps"] * STREAM.duration_s, (moved, s.metrics)


@pytest.mark.attach("macvtap")
def test_macvtap_on_a_lower_device_named_by_the_user(guest_pair, writer):
    """The lower is the user's: used as it is, its MTU never changed, nothing left on it."""
    gp = guest_pair
    lower, peer = f"tb-{gp.tag}-ul0", f"tb-{gp.tag}-ul1"
    with links.veth(lower, peer, 1500):
        # A matrix asking for more than the device allows is refused before anything is made.
        why = macvtap.check_lowers((lower,), MacvtapMode.BRIDGE, 9000)
        assert why and "below" in why and lower in why
        spec = MacvtapSpec(mode=MacvtapMode.BRIDGE, lower=(lower,))
        with testpaths.mode(Attachment("macvtap"), Backend.QEMU, gp.tag, gp.client, gp.server, "198.18.0.0/24",
                         1500, topology=_with(spec)) as path:
            assert set(macvtap.uppers(lower)) == {path.client.tap, path.server.tap}
            assert not links.exists(f"tb-{gp.tag}-lw0"), "a named lower must not get a testbed veth"
            s = _measure(path, writer, Cell(Attachment("macvtap"), Backend.QEMU, 1400, 1, STREAM))
            assert links.mtu_of(lower) == 1500
        assert s.status == "ok", s.reason
        assert macvtap.uppers(lower) == [], "libvirt left a macvtap on the user's device"
        assert links.mtu_of(lower) == 1500


@pytest.mark.attach("bridge")
def test_multiqueue_nic(guest_pair, writer):
    gp = guest_pair
    cell = Cell(Attachment("bridge"), Backend.QEMU, 1500, 2, STREAM, queues=2)
    with testpaths.mode(Attachment("bridge"), Backend.QEMU, gp.tag, gp.client, gp.server, "198.18.0.0/24",
                     1500, queues=2) as path:
        for ep in (path.client, path.server):
            with open(f"/sys/class/net/{ep.tap}/tun_flags") as f:
                assert int(f.read(), 16) & IFF_MULTI_QUEUE, f"{ep.tap} is not a multiqueue tap"
            qs = ep.guest.agent.run(["/usr/bin/ls", f"/sys/class/net/{ep.ifname}/queues"]).stdout.split()
            assert {"rx-0", "rx-1", "tx-0", "tx-1"} <= set(qs), qs
        s = _measure(path, writer, cell)
    assert s.status == "ok", s.reason
    assert s.cell.queues == 2 and s.cell.id.startswith("bridge-qemu-q2-")


@pytest.mark.attach("bridge")
def test_offloads_switched_in_the_guests(guest_pair):
    gp = guest_pair
    with testpaths.mode(Attachment("bridge"), Backend.QEMU, gp.tag, gp.client, gp.server, "198.18.0.0/24",
                     1500, offloads=Offloads(tso=False, gso=False)) as path:
        for ep in (path.client, path.server):
            states = path.offloads[ep.guest.spec.name]
            assert states["tso"].startswith("off") and states["gso"].startswith("off"), states
            # read back from the guest, not echoed from the request
            k = ep.guest.agent.run(["/usr/sbin/ethtool", "-k", ep.ifname]).stdout
            assert "generic-segmentation-offload: off" in k
