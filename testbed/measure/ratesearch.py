"""Loss-bounded rate search (profile kind ``udp_ndr``): NDR and PDR of one cell.

The loads are chosen by FD.io CSIT's MLRsearch (the ``MLRsearch`` package, RFC 9971's
reference implementation); the testbed only implements its ``AbstractMeasurer.measure
(intended_duration, intended_load)`` as one trial through the tool. The load unit is
datagrams per second of the profile's message size; the tool is given the same rate as
payload bits per second.

Every trial is cross-checked against the wire: the datagrams the sender's device carried
out and the receiver's device carried in, counted from their byte counters (a datagram's
frames have a known size, control packets are small), against what the tool says it sent,
received and lost. A trial the wire contradicts stops the search: bounds resting on a count
the counters deny would be no answer.

Pure parts (``loss_check``, ``summarize``) are tested on their own; ``search`` runs any
``run_trial(duration_s, load_pps) -> Trial`` (a namespace pair, a guest pair, a simulator).
"""
from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field

from testbed.measure.crosscheck import ETHERNET, IPV4, UDP, Wire
from testbed.topology.model import RateSearch

log = logging.getLogger(__name__)

#: datagrams the two counts may differ by before the wire contradicts the tool: a few for the
#: tool's control connection (its packets are small, but a byte count rounds them into
#: datagrams) and 0.1 % for datagrams still in flight when a counter was read
SLACK_DATAGRAMS = 3
SLACK_SHARE = 0.001


class TrialFailed(Exception):
    """A trial that gave no trustworthy count: the search stops with this reason."""


@dataclass(frozen=True)
class Trial:
    """One trial: what the search asked for, what the tool counted, what the wire carried."""

    index: int
    intended_duration_s: float
    intended_pps: float
    ok: bool
    reason: str | None = None
    duration_s: float | None = None        # the tool's own interval
    wall_s: float | None = None            # the trial with its overheads (start, counters)
    sent: int | None = None                # datagrams the tool sent (iperf3: by sequence number)
    received: int | None = None            # datagrams the receiving tool counted
    #: the wire figures and their verdict (loss_check)
    wire: Mapping[str, object] = field(default_factory=dict)
    message_size: int = 0

    @property
    def lost(self) -> int:
        return (self.sent or 0) - (self.received or 0)

    @property
    def loss_ratio(self) -> float | None:
        return self.lost / self.sent if self.sent else None

    def as_dict(self) -> dict:
        bits = 8 * self.message_size
        d = asdict(self)
        d.update(lost=self.lost if self.ok else None, loss_ratio=self.loss_ratio,
                 offered_mbps=round(self.intended_pps * bits / 1e6, 6),
                 received_mbps=(round(self.received * bits / self.duration_s / 1e6, 6)
                                if self.received is not None and self.duration_s else None))
        d["wire"] = dict(self.wire)
        return d


def frame_bytes(message_size: int, mtu: int) -> int:
    """Bytes one datagram of ``message_size`` puts on the wire at ``mtu``: its payload, one
    UDP header, and Ethernet and IPv4 headers on each of its fragments."""
    frags = -(-(message_size + UDP) // max(1, mtu - IPV4))
    return message_size + UDP + frags * (ETHERNET + IPV4)


def loss_check(sent: int, received: int, sender: Wire, receiver: Wire, *, message_size: int,
               mtu: int, sender_sends_as_rx: bool = False, receiver_gets_as_tx: bool = False) -> dict:
    """The receiver's count of one trial against both devices' counters (deltas over it).

    ``sender`` is the sending endpoint's device, ``receiver`` the receiving one's; for a
    namespace each endpoint's own device (sends as tx, receives as rx), for a guest its tap
    (the guest's sends are the tap's rx, set the two flags). Datagrams on a device are its
    bytes over one datagram's frames (control packets are a few small ones). It fails when:
    the receiver counted more than arrived at its device (a tool that missed loss: what
    never reached the device is then more than the tool admits losing); or more arrived
    than left the sender's device."""
    per = frame_bytes(message_size, mtu)
    out_bytes = sender.rx_bytes if sender_sends_as_rx else sender.tx_bytes
    in_bytes = receiver.tx_bytes if receiver_gets_as_tx else receiver.rx_bytes
    sender_dg, receiver_dg = out_bytes // per, in_bytes // per
    slack = SLACK_DATAGRAMS + math.ceil(SLACK_SHARE * max(sent, 1))
    lost = sent - received
    before_receiver = max(0, sent - receiver_dg)
    fig = (f"tool sent {sent} received {received} (lost {lost}); wire: sender device {sender_dg}, "
           f"receiver device {receiver_dg} datagrams of {per} bytes")
    if received > receiver_dg + slack:
        verdict, why = "fail", f"the receiver counted more datagrams than reached its device: {fig}"
    elif receiver_dg > sender_dg + slack:
        verdict, why = "fail", f"more datagrams reached the receiver's device than left the sender's: {fig}"
    else:
        verdict, why = "ok", None
    return {"verdict": verdict, "reason": why, "sender_datagrams": sender_dg,
            "receiver_datagrams": receiver_dg, "lost_before_receiver_device": before_receiver,
            "lost_after_receiver_device": max(0, receiver_dg - received),
            "wire_loss_ratio": round(1 - receiver_dg / sender_dg, 6) if sender_dg else None,
            "frame_bytes": per, "slack": slack}


@dataclass(frozen=True)
class Bound:
    """One goal's answer: the relevant lower and upper bound (datagrams/s and payload
    Mbit/s), None where the search found none (the minimum rate already failed, or the
    maximum never did)."""

    goal: str
    loss_ratio: float
    lower_pps: float | None
    upper_pps: float | None
    message_size: int

    def mbps(self, pps: float | None) -> float | None:
        return None if pps is None else round(pps * 8 * self.message_size / 1e6, 6)

    def as_dict(self) -> dict:
        return {"goal": self.goal, "loss_ratio": self.loss_ratio,
                "lower_pps": self.lower_pps, "upper_pps": self.upper_pps,
                "lower_mbps": self.mbps(self.lower_pps), "upper_mbps": self.mbps(self.upper_pps),
                "relative_width": (round((self.upper_pps - self.lower_pps) / self.upper_pps, 6)
                                   if self.lower_pps and self.upper_pps else None)}


@dataclass(frozen=True)
class Result:
    ndr: Bound
    pdr: Bound
    trials: tuple[Trial, ...]
    wall_s: float
    #: why the search ended before its precision (the time cap, a failed trial); None: done
    stopped: str | None = None

    @property
    def ok(self) -> bool:
        return self.stopped is None

    def as_dict(self) -> dict:
        return {"ndr": self.ndr.as_dict(), "pdr": self.pdr.as_dict(), "trials": len(self.trials),
                "wall_s": round(self.wall_s, 3), "stopped": self.stopped,
                "trial_seconds": round(sum(t.duration_s or 0.0 for t in self.trials), 3)}


def pps_of(bps: float, message_size: int) -> float:
    return bps / (8 * message_size)


def _config(spec: RateSearch, message_size: int):
    from MLRsearch import Config, SearchGoal
    final = float(spec.trial_s[1])
    goals = [SearchGoal(loss_ratio=ratio, exceed_ratio=spec.exceed_ratio, relative_width=spec.precision,
                        initial_trial_duration=float(spec.trial_s[0]), final_trial_duration=final,
                        duration_sum=float(spec.duration_sum_s or final),
                        # fail_fast off: a minimum rate that already loses is an answer (no
                        # lower bound), not an exception
                        fail_fast=False)
             for ratio in (0.0, spec.pdr_loss)]
    c = Config()
    c.goals = goals
    c.min_load = pps_of(spec.min_rate_bps, message_size)
    c.max_load = pps_of(spec.max_rate_bps, message_size)
    c.search_duration_max = float(spec.max_search_s)
    c.warmup_duration = None
    return c


def search(spec: RateSearch, message_size: int,
           run_trial: Callable[[int, float, float], Trial]) -> Result:
    """Run MLRsearch with ``run_trial(index, duration_s, load_pps)`` as its measurer."""
    from MLRsearch import AbstractMeasurer, MeasurementResult, MultipleLossRatioSearch

    trials: list[Trial] = []

    class Measurer(AbstractMeasurer):
        def measure(self, intended_duration: float, intended_load: float) -> MeasurementResult:
            t = run_trial(len(trials), intended_duration, intended_load)
            trials.append(t)
            if not t.ok:
                raise TrialFailed(f"trial {t.index} at {intended_load:.0f} datagrams/s: {t.reason}")
            assert t.sent is not None and t.received is not None
            intended = round(intended_load * (t.duration_s or intended_duration))
            # A tool that could not send what it was asked (more than 5 % short) is an
            # irregular trial: MLRsearch counts the unsent datagrams as bad. Within that, the
            # offered count stands for itself (a sender ending a datagram early is no loss).
            kw = {"intended_count": intended} if t.sent < 0.95 * intended else {}
            return MeasurementResult(intended_duration=intended_duration, intended_load=intended_load,
                                     offered_count=t.sent, loss_count=t.lost,
                                     offered_duration=t.duration_s or intended_duration,
                                     duration_with_overheads=t.wall_s or intended_duration, **kw)

    cfg = _config(spec, message_size)
    algo = MultipleLossRatioSearch(config=cfg)
    started = time.monotonic()
    stopped = None
    try:
        answers = algo.search(measurer=Measurer(), debug=log.debug)
        bounds = [(float(a.relevant_lower_bound) if a.relevant_lower_bound else None,
                   float(a.relevant_upper_bound) if a.relevant_upper_bound else None)
                  for a in (answers[g] for g in cfg.goals)]
    except TrialFailed as e:
        stopped, bounds = f"a trial failed: {e}", _partial(algo, cfg)
    except RuntimeError as e:
        # MLRsearch raises this when the search outlives search_duration_max
        stopped, bounds = f"search time cap of {spec.max_search_s} s reached ({e})", _partial(algo, cfg)
    wall = time.monotonic() - started
    ndr, pdr = (Bound(name, ratio, lo, hi, message_size)
                for name, ratio, (lo, hi) in zip(("ndr", "pdr"), (0.0, spec.pdr_loss), bounds))
    return Result(ndr, pdr, tuple(trials), wall, stopped)


def _partial(algo, cfg) -> list[tuple[float | None, float | None]]:
    """The relevant bounds the database holds when the search was cut short."""
    out = []
    for g in cfg.goals:
        try:
            b = algo.database.get_relevant_bounds(algo.scaling.goal_to_final_target[g])
            out.append((float(b.clo) if b.clo else None, float(b.chi) if b.chi else None))
        except AttributeError:       # cut short before the database existed
            out.append((None, None))
    return out


def summary_line(r: Result) -> str:
    def b(x: Bound) -> str:
        lo, hi = x.mbps(x.lower_pps), x.mbps(x.upper_pps)
        return (f"{x.goal.upper()} (loss <= {x.loss_ratio:g}) "
                f"{'-' if lo is None else format(lo, '.3f')}..{'-' if hi is None else format(hi, '.3f')} Mbit/s")
    return (f"{b(r.ndr)}, {b(r.pdr)}; {len(r.trials)} trials in {r.wall_s:.1f} s"
            + (f"; stopped: {r.stopped}" if r.stopped else ""))
