"""The loss-bounded rate search between two guests on a Linux bridge: MLRsearch's trials
through iperf3 in the guests, each cross-checked on both taps, the cell's entry stating NDR
and PDR as bounds with its trials. TCG guests are slow senders: the figures are functional."""
from __future__ import annotations

import pytest

from testbed.guests import virt
from testbed.measure import ratesearch_cell, testpaths
from testbed.topology.model import Attachment, Backend, Cell, Profile, Protocol, RateSearch, Tool

pytestmark = pytest.mark.attach("bridge")

PROFILE = Profile("udp_ndr", tool=Tool("iperf3"), protocol=Protocol.UDP, message_size=1472, duration_s=2,
                  search=RateSearch(trial_s=(1, 2), precision=0.1, max_search_s=300,
                                    min_rate_bps=1_000_000, max_rate_bps=400_000_000))


def test_udp_ndr_between_guests_reports_bounds_with_cross_checked_trials(guest_pair, run_writer):
    gp = guest_pair
    cell = Cell(Attachment("bridge"), Backend.QEMU, 1500, 1, PROFILE)
    with testpaths.mode(cell.attachment, cell.backend, gp.tag, gp.client, gp.server, "198.18.0.0/24",
                     cell.mtu) as path:
        pids = {g.spec.name: virt.qemu_pid(g) for g in (gp.client, gp.server)}
        r = ratesearch_cell.measure_cell(cell, path, run_writer, pids, {"g1": "local", "g2": "local"})
        taps = (path.client.tap, path.server.tap)
    assert r is not None
    assert r.trials, "no trial ran"
    # every trial that counted was checked on both taps; a failed one stopped the search with its reason
    for t in r.trials:
        if t.ok:
            assert t.wire["verdict"] == "ok" and t.wire["sender_datagrams"] >= t.wire["receiver_datagrams"] > 0, t
    if r.stopped:
        assert "trial" in r.stopped or "cap" in r.stopped, r.stopped
    # the cell's entry states both goals as bounds, with trials and time
    out = next(c for c in run_writer.record["cells"] if c["id"].startswith(cell.id))
    search = out["search"]
    assert search["trials"] == len(r.trials) and search["wall_s"] > 0
    for goal in ("ndr", "pdr"):
        b = search[goal]
        assert b["lower_mbps"] is not None or b["upper_mbps"] is not None, search
        if b["lower_mbps"] and b["upper_mbps"]:
            assert b["lower_mbps"] <= b["upper_mbps"]
    assert set(taps) and search["ndr"]["loss_ratio"] == 0.0 and search["pdr"]["loss_ratio"] == 0.005
