"""One ``udp_ndr`` cell on a test path: MLRsearch's trials through the cell loop (sampling.settled).

Each trial is a sample of the cell (the cell's own id and hash), measured like any other
(server, client, CPU collectors; the receiving device's byte ratio recorded, the trial's
loss check on both devices deciding) at the rate and duration the search asked for, with the trial's record under ``extra.trial``: the
offered and received rates, the loss ratio and the wire figures of both devices. The
cell's entry carries the answer under ``search``: NDR and PDR as lower and upper bounds,
trials and time.
"""
from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Mapping

from testbed.measure import ratesearch
from testbed.measure import sampling as measure
from testbed.measure.context import Arm, Context
from testbed.measure.crosscheck import Wire
from testbed.measure.endpoints import TestPath
from testbed.records import results
from testbed.records.records import CellRecord, SampleRecord
from testbed.tools.base import sizes
from testbed.topology.model import Cell


def trial_profile(cell: Cell, duration_s: float, load_pps: float):
    """The cell's profile as one trial: a whole number of seconds (the tools take those)
    at the load's payload bit rate."""
    size = sizes(cell.profile)[0]
    secs = max(1, math.ceil(duration_s - 1e-9))
    bps = max(1000, round(load_pps * 8 * size))
    return dataclasses.replace(cell.profile, duration_s=secs, rate_bps=bps, rate=f"{bps}bit", search=None)


def trial_of(s: SampleRecord, index: int, duration_s: float, load_pps: float, *, size: int, mtu: int,
             sender: str, receiver: str, guest_sends_as_rx: bool) -> ratesearch.Trial:
    """Pure: a measured sample -> the search's trial, with the loss checked on both devices."""
    base = dict(index=index, intended_duration_s=duration_s, intended_pps=load_pps, message_size=size)
    if s.status != "ok":
        return ratesearch.Trial(ok=False, reason=s.reason, **base)
    m = s.metrics
    if "udp_sent_msgs" not in m or "udp_recv_msgs" not in m:
        return ratesearch.Trial(ok=False, reason="the tool reported no datagram counts", **base)
    sent, received = int(m["udp_sent_msgs"]), int(m["udp_recv_msgs"])
    counters: Mapping = s.data.get("counters", {})
    if sender not in counters or receiver not in counters:
        return ratesearch.Trial(ok=False, reason="no device counters for the trial", **base)
    wire = ratesearch.loss_check(sent, received, Wire(**counters[sender]), Wire(**counters[receiver]),
                                 message_size=size, mtu=mtu, sender_sends_as_rx=guest_sends_as_rx,
                                 receiver_gets_as_tx=guest_sends_as_rx)
    ok = wire["verdict"] == "ok"
    return ratesearch.Trial(ok=ok, reason=None if ok else f"wire cross-check: {wire['reason']}",
                            duration_s=m.get("duration_s"), sent=sent, received=received, wire=wire, **base)


def search(ctx: Context, arm: Arm) -> ratesearch.Result | None:
    """The rate search of ``arm``'s cell on its one path, each trial a sample taken through
    the cell loop's :func:`sampling.settled` (the run's noise guard, host guard, placement
    check and hooks; a noisy trial is measured again once the host settled, at the same
    rate). The cell's entry carries the answer under ``search``."""
    cell = arm.cell
    spec = cell.profile.search
    if spec is None:
        raise ValueError(f"{cell.id} is not a rate-search cell")
    if cell.pairs > 1:
        measure.fail(ctx, cell, "a rate search measures one pair (pairs 1)")
        return None
    ready = measure.prepare(ctx, dataclasses.replace(arm, by_pair=False))
    if not isinstance(ready, Arm):
        return None
    path = ready.paths[0]
    size = sizes(cell.profile)[0]
    ctx.watch.begin_cell()

    def run_trial(index: int, duration_s: float, load_pps: float) -> ratesearch.Trial:
        tarm = dataclasses.replace(ready, cell=dataclasses.replace(
            cell, profile=trial_profile(cell, duration_s, load_pps)))
        t0 = time.monotonic()
        got: list[ratesearch.Trial] = []

        def as_trial(s: SampleRecord) -> SampleRecord:
            t = dataclasses.replace(trial_of(s, index, duration_s, load_pps, size=size, mtu=cell.mtu,
                                             sender=path.client.tap, receiver=path.server.tap,
                                             guest_sends_as_rx=path.guest_sends_as_rx),
                                    wall_s=round(time.monotonic() - t0, 3))
            got.append(t)
            # recorded as the search's cell (not the trial's paced one), with the trial's figures
            s = dataclasses.replace(s, cell=CellRecord.from_dict(cell.as_dict()), data={**s.data, "trial": t.as_dict()})
            if not t.ok and s.status != "noisy":
                s = dataclasses.replace(s, status="failed", reason=s.reason or t.reason, metrics={})
            return s
        # the trial's wire check is loss_check's, on both devices (the sample's byte ratio on
        # the receiver alone is kept in the sample as information)
        measure.settled(ctx, tarm, index, wire_fails=False, finish=as_trial)
        return got[-1]

    r = ratesearch.search(spec, size, run_trial)
    found = r.ndr.lower_pps is not None and r.pdr.lower_pps is not None
    status = "ok" if r.ok and found else ("partial" if found else "failed")
    reason = None if status == "ok" else (r.stopped or "the minimum rate already lost more than the goal allows")
    ctx.writer.add_cell(cell, status, reason, r.ok, {}, extra={"search": r.as_dict()})
    return r


def measure_cell(cell: Cell, path: TestPath, writer: results.RunWriter,
                 qemu_pids: Mapping[str, int], placement: Mapping[str, str],
                 clock_ghz: float | None = None) -> ratesearch.Result | None:
    """Older form of :func:`search`, for callers outside a run (benchmarks, tests)."""
    return search(Context(writer, qemu_pids=qemu_pids, placement=placement, clock_ghz=clock_ghz),
                  Arm(cell, (path,), by_pair=False))
