"""`testbed bench gate`: the nightly gate's error rates on synthetic nights in the project's
own run format, under the conditions real nights have, so a change to the statistics shows
its effect.

A template run (stream and request/response cells) is written by the production RunWriter
and read back as a :class:`testbed.records.records.RunRecord`; each simulated night
replaces its samples with fresh seeded draws and goes through the same functions as
`testbed compare` and `testbed run --decide-against` (:mod:`testbed.bench.gate_seq`).
Everything is seeded: the same arguments print the same figures.

A night's samples (:func:`night`): per cell, level x the night's shared factor (the host's
drift: every cell at once) x the cell's own run-to-run effect (tau) x the build's change x
each sample's noise, drawn ``normal``, ``lognormal``, ``heavy`` (Student's t with 3
degrees of freedom: a heavy tail) or ``bimodal`` (a fifth of the samples in a slower mode).
Request/response cells carry transactions/s, the mean latency and netperf-like integer
P50/P90/P99 in microseconds. A sample fails (a failed sample with its reason, never a zero)
with probability ``fail_p``.
"""
from __future__ import annotations

import dataclasses
import math
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from testbed.records import results
from testbed.records.records import RunRecord, SampleRecord
from testbed.topology.model import (Attachment, Backend, Cell, GuestSpec, HostSpec, Matrix, Pattern, Profile,
                                    Topology)

ENV = {"accelerator": "kvm", "comparable_class": "kvm", "cpu_model": "synthetic", "cpus": 2,
       "host": "bench", "kernel": "6.1.0", "versions": {"qemu": "7.2", "libvirt": "9.0.0",
                                                         "ovs": "3.1.0", "netperf": "2.7.0"}}
MBPS = 2000.0
TPS = 20000.0
NOISES = ("normal", "lognormal", "heavy", "bimodal")
STREAM = Profile("tcp_stream", message_size=16384)
RR = Profile("tcp_rr", pattern=Pattern.RR, message_size=1, response_size=1)


def template(cells: int, root: Path, rr: int = 0) -> RunRecord:
    """A run of ``cells`` cells (one sample each), the last ``rr`` of them request/response,
    written by RunWriter and read back."""
    n_stream = cells - rr
    cs = ([Cell(Attachment("bridge"), Backend.QEMU, 1500, k, STREAM) for k in range(1, n_stream + 1)]
          + [Cell(Attachment("bridge"), Backend.QEMU, 1500, k, RR) for k in range(1, rr + 1)])
    conns = tuple(range(1, max(n_stream, rr) + 1))
    matrix = Matrix(attachments=(Attachment("bridge"),), backends=(Backend.QEMU,), mtus=(1500,),
                    connections=conns, profiles=(STREAM, RR) if rr else (STREAM,))
    topo = Topology("bench-gate", "<bench gate>", (HostSpec("local"),),
                    (GuestSpec("g1", "local"), GuestSpec("g2", "local")), "g1", "g2", matrix)
    with results.RunWriter(root, "template", topo, ENV) as w:
        for c in cs:
            w.add_sample(results.SampleRecord.new("template", c.as_dict(), 0, False, "ok", None,
                                                  {"throughput_mbps": MBPS}, {}, results.now(),
                                                  results.now()))
            w.add_cell(c, "ok", None, True, {})
    return results.read_run(w.dir)


def noise(rng: np.random.Generator, kind: str, level: float, size: int) -> np.ndarray:
    """Multiplicative sample noise of relative size ``level`` (its standard deviation)."""
    if kind == "normal":
        out = 1.0 + level * rng.standard_normal(size)
    elif kind == "lognormal":
        out = np.exp(level * rng.standard_normal(size))
    elif kind == "heavy":
        out = 1.0 + level * rng.standard_t(3, size) / math.sqrt(3.0)
    elif kind == "bimodal":
        slow = rng.random(size) < 0.2
        out = (1.0 + 0.5 * level * rng.standard_normal(size)) * np.where(slow, 1.0 - 2.0 * level, 1.0)
    else:
        raise ValueError(f"unknown noise {kind!r}; expected one of {NOISES}")
    return np.maximum(out, 0.05)


def _draws(rng: np.random.Generator, level: float, reps: str, scale: float,
           kind: str = "normal") -> list[float]:
    """One cell's relative samples: ``reps`` is a fixed count ("5") or "gate" (5..10,
    stop once the rsd is at most 3 %)."""
    if reps == "gate":
        vals = list(scale * noise(rng, kind, level, 5))
        while len(vals) < 10 and np.std(vals, ddof=1) / abs(np.mean(vals)) > 0.03:
            vals.append(float(scale * noise(rng, kind, level, 1)[0]))
        return vals
    return list(scale * noise(rng, kind, level, int(reps)))


def repetitions(reps: str) -> dict:
    """The repetitions a run records for a way of drawing its samples ("gate", or a count)."""
    if reps == "gate":
        return {"warmup": 1, "min_samples": 5, "max_samples": 10, "rsd_target": 0.03}
    return {"warmup": 0, "min_samples": int(reps), "max_samples": int(reps), "rsd_target": 0.0}


def metrics_of(cell: object, rel: float, rng: np.random.Generator, level: float,
               p99: float = 1.0) -> dict[str, float]:
    """A sample's metrics at relative performance ``rel``: a stream's throughput, or a
    request/response cell's rate, mean latency and integer percentiles (their own jitter
    on top, the p99 scaled by ``p99``)."""
    if getattr(cell, "profile", "") != "tcp_rr":
        return {"throughput_mbps": MBPS * rel}
    tps = TPS * rel
    mean = 1e6 / tps
    jit = 1.0 + 0.5 * level * rng.standard_normal(3)
    return {"transactions_per_s": tps, "duration_s": 10.0, "latency_mean_us": mean,
            "latency_p50_us": float(round(mean * 0.9 * jit[0])),
            "latency_p90_us": float(round(mean * 1.4 * jit[1])),
            "latency_p99_us": float(round(mean * 2.2 * p99 * jit[2]))}


def night(tpl: RunRecord, run_id: str, rng: np.random.Generator, *, noise: float, reps: str,
          scale: dict[str, float] | None = None, fail_p: float = 0.0, declare: bool = True,
          kind: str = "normal", factor: float = 1.0, tau: float = 0.0,
          p99: dict[str, float] | None = None, levels: dict[str, float] | None = None) -> RunRecord:
    """``tpl`` with fresh samples: per cell, draws of ``kind`` at ``noise``, scaled by the
    night's shared ``factor``, the cell's own run-to-run effect (lognormal, ``tau``) and the
    build's ``scale[cell id]``; request/response p99s by ``p99[cell id]``; each sample
    failing with probability ``fail_p``. The run records the repetitions that drew them
    (``declare``; False records a fixed count, so `compare` does not know a stopping rule
    chose the counts). ``levels`` (cell id -> relative level, :func:`levels`) replaces
    ``scale``, ``factor`` and ``tau``: a night's second stage measures the same levels."""
    p99 = p99 or {}
    levels = levels if levels is not None else globals()["levels"](tpl, rng, scale=scale, factor=factor, tau=tau)
    topo = dict(tpl.topology)
    topo["matrix"] = {**(topo.get("matrix") or {}),
                      "repetitions": repetitions(reps if declare else "5")}
    tpl = dataclasses.replace(tpl, topology=topo)
    out: list[SampleRecord] = []
    for s in tpl.samples:
        for rep, v in enumerate(_draws(rng, noise, reps, levels[s.cell.id], kind)):
            out.append(sample(s, run_id, rep, v, rng, noise, fail_p, p99.get(s.cell.id, 1.0)))
    return dataclasses.replace(tpl, run_id=run_id, samples=tuple(out))


def levels(tpl: RunRecord, rng: np.random.Generator, *, scale: dict[str, float] | None = None,
           factor: float = 1.0, tau: float = 0.0) -> dict[str, float]:
    """Each cell's relative level on one night: the night's shared ``factor`` x the cell's
    own run-to-run effect (lognormal, ``tau``) x the build's ``scale[cell id]``."""
    scale = scale or {}
    return {s.cell.id: factor * scale.get(s.cell.id, 1.0) * (math.exp(tau * rng.standard_normal()) if tau else 1.0)
            for s in tpl.samples}


def sample(s: SampleRecord, run_id: str, rep: int, rel: float, rng: np.random.Generator,
           level: float, fail_p: float = 0.0, p99: float = 1.0) -> SampleRecord:
    """``s`` as one measured sample at relative performance ``rel`` (or a failed one)."""
    if fail_p and rng.random() < fail_p:
        return dataclasses.replace(s, run_id=run_id, rep=rep, status="failed",
                                   reason="synthetic transient failure", metrics={})
    return dataclasses.replace(s, run_id=run_id, rep=rep, status="ok",
                               metrics=metrics_of(s.cell, float(rel), rng, level, p99))


def with_template(cells: int, rr: int = 0) -> RunRecord:
    with tempfile.TemporaryDirectory(prefix="tb-bench-gate-") as tmp:
        return template(cells, Path(tmp), rr)


# --------------------------------------------------------------------------- history

def history_replay(values: list[float], start: int, spreads: list[float | None] | None = None,
                   n: int = 5) -> int | None:
    """Replay a nightly series night by night from ``start``: the first night (index) on
    which `testbed history` would exit 1, or None. ``spreads``: each night's sample standard
    deviation over its ``n`` samples (what the index gives `history`)."""
    from testbed.analysis import history
    spreads = spreads or [None] * len(values)
    pts = [history.Point(f"n{i:03d}", "", float(v), n, sd) for i, (v, sd) in enumerate(zip(values, spreads))]
    for t in range(max(start, history.MIN_POINTS - 1), len(pts)):
        if history.judge("c", "h", "throughput_mbps", "e", pts[:t + 1]).newest_regresses:
            return t
    return None


def history_group_replay(nights: dict[str, list[tuple[float, float]]], start: int = 0,
                         n: int = 5) -> dict[str, int]:
    """Replay the nightly runs of several cells on one host (cell id -> each night's mean and
    sample standard deviation over ``n`` samples) night by night from ``start``, as `testbed
    history` judges them (the nights' shared shift taken out): per series that would exit 1
    (a cell id, or history.SHARED), the first night it does."""
    from testbed.analysis import history
    first: dict[str, int] = {}
    count = min(len(v) for v in nights.values())
    for t in range(max(start, history.MIN_POINTS - 1), count):
        pts = {(c, "h", "throughput_mbps", "e"): [history.Point(f"n{i:03d}", "", m, n, sd)
                                                  for i, (m, sd) in enumerate(vs[:t + 1])]
               for c, vs in nights.items()}
        for s in history.judge_all(pts):
            if s.cell_id not in first and s.recent_regressions():
                first[s.cell_id] = t
    return first


def ar_drift(rng: np.random.Generator, nights: int, size: float, phi: float = 0.7) -> np.ndarray:
    """A host's drift shared by a night's cells: AR(1) on the log scale with stationary
    standard deviation ``size`` and night-to-night correlation ``phi`` (a warm week lasts)."""
    x = np.empty(nights)
    x[0] = size * rng.standard_normal()
    for i in range(1, nights):
        x[i] = phi * x[i - 1] + math.sqrt(1 - phi ** 2) * size * rng.standard_normal()
    return np.exp(x)


@dataclass(frozen=True)
class HistoryOutcome:
    sequences: int
    step_found: int             # lasting step: exit 1 on the step's night or the ``within`` - 1 after
    unchanged_alarms: int       # unchanged series with any exit 1, replayed nightly
    heavy_alarms: int           # the same at 10 % lognormal sample noise with 2 % drift
    heavy_sequences: int
    step: float
    within: int
    #: hosts of ``cells`` cells a night sharing an AR(1) drift (``host_sequences`` of each):
    #: unchanged at 10 % lognormal samples, cells alarming and shared series alarming
    host_cells: int = 0
    host_sequences: int = 0
    host_alarms: int = 0
    host_shared_alarms: int = 0
    #: ... and one cell of each host stepping by ``step`` at 2.4 % nightly noise: found in time
    host_step_found: int = 0
    #: ... and every cell stepping (the whole build): the shared series found in time
    host_build_found: int = 0


def history_sim(sequences: int = 6, seed: int = 0, noise_: float = 0.024, step: float = 0.05,
                nights: int = 30, step_at: int = 20, within: int = 7,
                heavy_sequences: int | None = None, host_sequences: int = 0,
                host_cells: int = 8) -> HistoryOutcome:
    """Each night is the mean of 5 samples whose spread makes the nightly noise ``noise_``
    (per-sample noise times sqrt 5), so points carry a count and a spread as indexed runs
    do; the heavy-tailed series draw 10 % lognormal samples on a 2 % nightly drift. Each of
    ``host_sequences`` hosts runs ``host_cells`` cells a night on a drift they share (AR(1),
    ar_drift), their series judged together as `testbed history` judges a store's (the
    nights' shift taken out): unchanged, then with one cell stepping, then with every cell
    stepping (the whole build)."""
    from testbed.analysis import history
    found = alarms = heavy = 0
    per_sample = noise_ * math.sqrt(5)

    def one(rng, level: float, kind: str, lev: float, drift: float = 0.0) -> tuple[float, float]:
        s = level * (1 + drift * rng.standard_normal()) * noise(rng, kind, lev, 5)
        return float(s.mean()), float(s.std(ddof=1))

    heavy_sequences = sequences if heavy_sequences is None else heavy_sequences
    for k in range(max(sequences, heavy_sequences)):
        rng = np.random.default_rng([seed, 1000 + k])
        if k < sequences:
            flat = [one(rng, 1000.0, "normal", per_sample) for _ in range(nights)]
            stepped = [one(rng, 1000.0 * (1 - step) if i >= step_at else 1000.0, "normal", per_sample)
                       for i in range(step_at + within)]
            t = history_replay([v for v, _ in stepped], 0, [sd for _, sd in stepped])
            found += t is not None and step_at <= t < step_at + within
            alarms += history_replay([v for v, _ in flat], 0, [sd for _, sd in flat]) is not None
        if k < heavy_sequences:
            noisy = [one(rng, 1000.0, "lognormal", 0.10, 0.02) for _ in range(nights)]
            heavy += history_replay([v for v, _ in noisy], 0, [sd for _, sd in noisy]) is not None
    host_alarms = host_shared = host_found = host_build = 0
    for k in range(host_sequences):
        rng = np.random.default_rng([seed, 5000 + k])
        drift = ar_drift(rng, nights, 0.02)

        def host(kind: str, lev: float, count: int, steps: int) -> dict[str, int]:
            """A host's first ``steps`` cells stepping by ``step`` from ``step_at``, replayed."""
            return history_group_replay({f"c{c}": [one(rng, 1000.0 * drift[i] * (1 - step if c < steps and i >= step_at else 1),
                                                       kind, lev) for i in range(count)]
                                         for c in range(host_cells)})
        quiet = host("lognormal", 0.10, nights, 0)
        host_alarms += sum(c != history.SHARED for c in quiet)
        host_shared += history.SHARED in quiet
        host_found += step_at <= host("normal", per_sample, step_at + within, 1).get("c0", -1) < step_at + within
        build = host("normal", per_sample, step_at + within, host_cells)
        host_build += step_at <= build.get(history.SHARED, -1) < step_at + within
    return HistoryOutcome(sequences, found, alarms, heavy, heavy_sequences, step, within,
                          host_cells if host_sequences else 0, host_sequences, host_alarms, host_shared, host_found,
                          host_build)


#: the history targets: a lasting step found within ``within`` nights in at least this share
#: of the sequences, and unchanged heavy-tailed series alarming in at most this share
HISTORY_FOUND = 0.90
HISTORY_ALARMS = 0.01


def target_line(what: str, a: int, b: int, ok: bool) -> str:
    """One target of a bench's printout: its figure and whether it is met."""
    return f"target {what}: {a}/{b} {'met' if ok else 'NOT met'}"


def history_targets(h: HistoryOutcome) -> list[str]:
    """The history targets, each with its figure and whether it is met (as the gate's)."""
    out = []
    if h.sequences:
        out.append(target_line(f"history: a lasting {-h.step:+.0%} step found within {h.within} nights in at least "
                               f"{HISTORY_FOUND:.0%} of the sequences", h.step_found, h.sequences,
                               h.step_found >= HISTORY_FOUND * h.sequences))
    if h.heavy_sequences:
        out.append(target_line(f"history: unchanged at 10% lognormal noise with 2% drift alarm in at most "
                               f"{HISTORY_ALARMS:.0%} of the series", h.heavy_alarms, h.heavy_sequences,
                               h.heavy_alarms <= HISTORY_ALARMS * h.heavy_sequences))
    return out


def format_history(h: HistoryOutcome) -> str:
    from testbed.analysis import history
    return (f"history (PELT on logs, penalty {history.PENALTY} sigma^2 ln n, step significant at "
            f"{history.STEP_ALPHA} spent over {history.SPEND_LOOKS} looks, weighted by the series' power for a "
            f"threshold-sized step ({history.EARLY_ALPHA:g} before run "
            f"{history.MIN_BEFORE}) and >= "
            f"{history.STEP_FRACTION:g} x threshold, {history.CONFIRM} runs "
            f"confirm, window {history.WINDOW}): lasting {-h.step:+.0%} step at 2.4% nightly noise found "
            f"within {h.within} nights in {h.step_found}/{h.sequences} sequences; unchanged 30-night "
            f"series replayed nightly alarmed in {h.unchanged_alarms}/{h.sequences}; at 10% lognormal "
            f"noise with 2% drift in {h.heavy_alarms}/{h.heavy_sequences}"
            + (f"\nhistory on hosts of {h.host_cells} cells a night sharing an AR(1) drift (2%, 0.7 night to "
               f"night), the nights' shift taken out: unchanged at 10% lognormal noise, cells alarmed in "
               f"{h.host_alarms}/{h.host_sequences * h.host_cells} series and the shared shift in "
               f"{h.host_shared_alarms}/{h.host_sequences}; a lasting {-h.step:+.0%} step in one cell at 2.4% "
               f"nightly noise found within {h.within} nights in {h.host_step_found}/{h.host_sequences}, and in "
               f"every cell (the whole build) by the shared shift in {h.host_build_found}/{h.host_sequences}"
               if h.host_sequences else ""))
