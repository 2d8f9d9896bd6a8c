"""`testbed bench cost`: does the gate see a per-packet cost?

One cell (Linux bridge, userspace virtio, netperf TCP_RR) measured A/B in one run with the
A/B variants (`testbed run`'s own run, samples taken A B B A ...). On the B side a known
per-packet cost is added on the forwarding path, through the run's per-sample hooks
(:class:`AddedCost`): a chain of nftables rules that never match (``meta mark``, counted)
on the ingress of B's two taps, so every packet B's guests send walks all of them, and
nothing else's traffic does (a netdev table bound to those two devices, named
tb-<tag>-cost, on for each of B's sample windows, removed after it, on failure and Ctrl-C).

How many rules: the cost of one rule is measured first on a namespace veth pair (a ping
flood's round trip with and without a chain of rules on one ingress), A's cost per packet
over the warm-ups, and the rules are as many as make ``--added`` (5 %) of it. Then:

- the measured added cost per packet, per role, and the role that took it
  (testbed.analysis.costs.moved), against the known one (rules x the cost of one);
- the gate's power to call it regressed: gates of ``--gate-samples`` a side drawn from the
  run's A and B samples (without replacement within a draw), each judging the deciding cost
  metrics (the path's and the host side's cost per packet) as `testbed compare` judges a
  cell's, at ``--threshold`` (default 5 %, the nightly's);
- the false-alarm rate on A/A: the same gates with both sides drawn from one variant;
- the run-to-run spread of the cost per packet: one sample's, and a gate's mean's.

The draws are subsamples of one run's samples, so they share its conditions: they say
what the gate does with the noise this host had, not with a noisier night's.
"""
from __future__ import annotations

import contextlib
import dataclasses
import re
import statistics
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from testbed.analysis import costs, stats
from testbed.analysis import sample_cost as cost
from testbed.analysis.sample_cost import HOST_METRIC, METRIC, ROLES, role_metric
from testbed.errors import TestbedError
from testbed.host import proc
from testbed.measure import hooks
from testbed.records.records import SampleRecord

#: the gate's targets the bench checks its figures against
POWER_TARGET, FALSE_ALARM_TARGET = 0.90, 0.05
#: rules on the calibration's ingress, and ping-flood round trips per measurement
CALIBRATION_RULES, CALIBRATION_PINGS, CALIBRATION_ROUNDS = 2000, 5000, 3
#: gates drawn for the power and the false-alarm rate (1000: the power to about 1 %; a gate
#: of 40 a side takes about 0.1 s to judge)
DRAWS = 1000

TOPOLOGY = """\
name: bench-cost
guests: [{{name: g1}}, {{name: g2}}]
matrix:
  attachments: [bridge]
  backends: [qemu]
  mtus: [1500]
  connections: [1]
  profiles:
    - {{name: tcp_rr, tool: netperf, pattern: rr, message_size: 1, response_size: 1, duration: {duration}}}
  repetitions: {{warmup: {warmup}, min: {rounds}, max: {rounds}, rsd_target: 0}}
  variants: [{{name: a}}, {{name: b}}]
"""


# --------------------------------------------------------------------------- the added cost

def ruleset(table: str, devices: Sequence[str], rules: int) -> str:
    """Pure: an nftables netdev table hooking the ingress of ``devices`` into one chain of
    ``rules`` rules that never match a packet of ours (marks 1..n; ours carry 0) and count."""
    lines = [f"table netdev {table} {{", "  chain rules {"]
    lines += [f"    meta mark 0x{i:x} counter" for i in range(1, rules + 1)]
    lines.append("  }")
    for i, dev in enumerate(devices):
        lines += [f"  chain in{i} {{", f'    type filter hook ingress device "{dev}" priority 0;',
                  "    jump rules", "  }"]
    lines.append("}")
    return "\n".join(lines) + "\n"


@contextlib.contextmanager
def nft_rules(table: str, devices: Sequence[str], rules: int, netns: str | None = None) -> Iterator[None]:
    """The rules on the devices' ingress for the ``with`` block; the table goes whatever
    happens (a device removed first leaves its chain unbound, the table still ours)."""
    proc.run(["nft", "-f", "-"], input=ruleset(table, devices, rules), netns=netns, timeout=120)
    try:
        yield
    finally:
        proc.run(["nft", "delete", "table", "netdev", table], netns=netns, check=False, timeout=60)


_RTT = re.compile(r"rtt min/avg/max/mdev = [\d.]+/([\d.]+)/")


def parse_ping_avg(text: str) -> float | None:
    """Pure: ping's average round trip, in ns, from its summary line."""
    m = _RTT.search(text)
    return float(m.group(1)) * 1e6 if m else None


def calibrate(lock: bool = True) -> dict[str, Any]:
    """The cost of one rule on one ingress, ns: ping floods on a namespace veth pair with
    and without CALIBRATION_RULES rules on the server's ingress, alternated; medians."""
    from testbed.bench.netns import netns_bench
    from testbed.topology.model import Attachment
    plain: list[float] = []
    ruled: list[float] = []
    with netns_bench(Attachment("netns-veth"), lock=lock) as (_, writer, path):
        cns = path.client.guest.agent.netns      # type: ignore[union-attr]
        sns = path.server.guest.agent.netns      # type: ignore[union-attr]
        argv = ["ping", "-q", "-f", "-c", str(CALIBRATION_PINGS), path.server.address]
        for i in range(CALIBRATION_ROUNDS):
            for with_rules in ((False, True) if i % 2 == 0 else (True, False)):
                with contextlib.ExitStack() as st:
                    if with_rules:
                        st.enter_context(nft_rules(f"tb-{writer.run_id[-4:]}-cal", [path.server.ifname],
                                                   CALIBRATION_RULES, netns=sns))
                    rtt = parse_ping_avg(proc.run(argv, netns=cns, timeout=120).stdout)
                if rtt is None:
                    raise TestbedError(f"calibration: no round trip from {' '.join(argv)}")
                (ruled if with_rules else plain).append(rtt)
    per_rule = (statistics.median(ruled) - statistics.median(plain)) / CALIBRATION_RULES
    if per_rule <= 0:
        raise TestbedError(f"calibration: {CALIBRATION_RULES} rules did not lengthen a round trip "
                           f"({statistics.median(plain):.0f} ns without, {statistics.median(ruled):.0f} ns with)")
    return {"rules": CALIBRATION_RULES, "plain_rtt_ns": plain, "ruled_rtt_ns": ruled,
            "ns_per_rule": round(per_rule, 3)}


# --------------------------------------------------------------------------- the figures (pure)

def _path(samples: Sequence[SampleRecord], metric: str = METRIC) -> list[float]:
    return [v for s in samples if s.ok and not s.warmup and (v := s.metric(metric)) is not None]


def _rows(samples: Sequence[SampleRecord]) -> list[dict[str, float]]:
    """The deciding cost metrics of each measured sample that carries them all."""
    return [{m: float(s.metrics[m]) for m in costs.DECIDING} for s in samples
            if s.ok and not s.warmup and all(s.metric(m) is not None for m in costs.DECIDING)]


def _regressed(x: np.ndarray, y: np.ndarray, *, threshold: float, alpha: float, q: float, n: int) -> bool:
    """One gate: each metric (a column) of x (BASE) against y (NEW), tested as `testbed
    compare` tests a cell's, Benjamini-Hochberg over them at ``q``: regressed when one is."""
    comps = [stats.compare(x[:, k].tolist(), y[:, k].tolist(), higher_is_better=False, threshold=threshold,
                           alpha=alpha, min_samples=n) for k in range(x.shape[1])]
    return any(c.verdict is stats.Verdict.REGRESSED for c in stats.adjust(comps, q))


def gate_rates(a: Sequence[Mapping[str, float]], b: Sequence[Mapping[str, float]], *, n: int,
               threshold: float, alpha: float = 0.05, q: float = stats.FDR_Q, draws: int = DRAWS,
               seed: int = 0) -> dict[str, Any]:
    """Pure: how often a gate of ``n`` samples a side calls the cost regressed.

    - ``power``: gates of fresh samples drawn from A's and B's measured distributions (the
      metrics' logs as multivariate normal: each variant's means, spreads and correlation);
    - ``false_alarms``: the same with both sides drawn from one variant's (A's, then B's);
    - ``false_alarms_measured``: gates made of the run's own samples, one variant's split in
      two halves drawn apart (needs 2n a variant).

    Each gate judges the deciding cost metrics as `testbed compare` judges a cell's. Fresh
    draws, not subsets of the run's samples: halves of one run's few samples are closer to
    each other than two nights are, which would overstate the power."""
    rng = np.random.default_rng(seed)
    metrics = sorted({m for row in (*a, *b) for m in row})
    av = np.asarray([[row[m] for m in metrics] for row in a], dtype=float).reshape(len(a), len(metrics))
    bv = np.asarray([[row[m] for m in metrics] for row in b], dtype=float).reshape(len(b), len(metrics))
    if min(len(av), len(bv)) < 3 or (av <= 0).any() or (bv <= 0).any():
        raise ValueError(f"{len(av)} A and {len(bv)} B samples: too few (or not positive) to fit a spread")

    def fit(v: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        lv = np.log(v)
        return lv.mean(axis=0), np.atleast_2d(np.cov(lv, rowvar=False))

    def draw(f: tuple[np.ndarray, np.ndarray]) -> np.ndarray:
        return np.exp(rng.multivariate_normal(f[0], f[1], n))
    fa, fb = fit(av), fit(bv)
    kw = dict(threshold=threshold, alpha=alpha, q=q, n=n)
    power = sum(_regressed(draw(fa), draw(fb), **kw) for _ in range(draws)) / draws
    false = sum(_regressed(draw(f), draw(f), **kw) for k in range(draws) for f in ((fa, fb)[k % 2],)) / draws
    measured = None
    if min(len(av), len(bv)) >= 2 * n:
        hits = 0
        for k in range(draws):
            pool = av if k % 2 == 0 else bv
            pick = rng.permutation(len(pool))
            hits += _regressed(pool[pick[:n]], pool[pick[n:2 * n]], **kw)
        measured = hits / draws
    return {"power": power, "false_alarms": false, "false_alarms_measured": measured, "draws": draws,
            "gate_samples": n, "threshold": threshold, "alpha": alpha, "q": q, "metrics": metrics}


#: gate sizes (samples a side) the bench tries for the one its power target needs
LADDER = (10, 15, 20, 30, 40, 60, 80)


def gate_size(a: Sequence[Mapping[str, float]], b: Sequence[Mapping[str, float]], *, threshold: float,
              sizes: Sequence[int] = LADDER, draws: int = 200,
              known: Mapping[int, float] | None = None) -> dict[str, Any]:
    """Pure: the gate's power at ``sizes`` samples a side, smallest first, up to the first
    that reaches POWER_TARGET (fresh draws from the run's fitted spread, as gate_rates),
    and that size (None when none does). What the gate must take for a cost of this size
    on this host: a TCG guest's cost per packet spreads 20-30 % a sample even on a quiet
    host. Smallest first and no further, since a gate of 80 a side takes minutes to draw.
    ``known``: powers already drawn (the headline gate's, with more draws), taken as they
    are, so the ladder neither draws that gate again nor prints a second figure for it."""
    known = dict(known or {})
    power: dict[int, float] = {}
    for n in sorted(set(sizes) | set(known)):
        power[n] = known[n] if n in known else gate_rates(a, b, n=n, threshold=threshold, draws=draws)["power"]
        if power[n] >= POWER_TARGET:
            return {"power": power, "needed": n}
    return {"power": power, "needed": None}


def spread(values: Sequence[float], n: int, draws: int = DRAWS, seed: int = 1) -> dict[str, float | None]:
    """Pure: the relative spread of one sample's cost per packet, and of a gate's mean of
    ``n`` (drawn without replacement)."""
    arr = np.asarray(values, dtype=float)
    if arr.size < 2:
        return {"sample_rsd": None, "gate_mean_rsd": None}
    rng = np.random.default_rng(seed)
    means = [rng.choice(arr, min(n, arr.size), replace=False).mean() for _ in range(draws)]
    return {"sample_rsd": float(arr.std(ddof=1) / arr.mean()),
            "gate_mean_rsd": float(np.std(means, ddof=1) / np.mean(means))}


def figures(a: Sequence[SampleRecord], b: Sequence[SampleRecord], *, known_ns: float | None,
            n: int, threshold: float, draws: int = DRAWS) -> dict[str, Any]:
    """Pure: what the bench prints, from A's and B's measured samples."""
    pa, pb = _path(a), _path(b)
    if len(pa) < 2 or len(pb) < 2:
        raise TestbedError(f"{len(pa)} A and {len(pb)} B samples with a cost per packet: too few to judge")
    ma, mb = statistics.mean(pa), statistics.mean(pb)
    ha, hb = statistics.mean(_path(a, HOST_METRIC)), statistics.mean(_path(b, HOST_METRIC))
    by_role = {r: statistics.mean(_path(b, role_metric(r))) - statistics.mean(_path(a, role_metric(r)))
               for r in ROLES}
    return {"a_ns": ma, "b_ns": mb, "added_ns": mb - ma, "added": (mb - ma) / ma, "known_ns": known_ns,
            "known": known_ns / ma if known_ns is not None else None, "by_role": by_role,
            "host_a_ns": ha, "host_b_ns": hb, "host_added": (hb - ha) / ha if ha else None,
            "role": costs.role_change(a, b).split(" ", 1)[0], "moved": costs.role_change(a, b),
            "gate": gate_rates(_rows(a), _rows(b), n=n, threshold=threshold, draws=draws),
            "spread": {v: {"path": spread(_path(x), n), "host": spread(_path(x, HOST_METRIC), n)}
                       for v, x in (("a", a), ("b", b))},
            "n_a": len(pa), "n_b": len(pb)}


# --------------------------------------------------------------------------- the run

@dataclass(frozen=True)
class Options:
    rounds: int = 80                    # samples a variant: twice gate_samples, for the A/A halves
    duration_s: int = 5
    added: float = 0.05
    #: what a gate needs to see a 5 % cost on a TCG guest, whose cost per packet spreads
    #: 20-30 % a sample even on a quiet host: 40 a side reached 94-99.5 % in two runs here,
    #: 20 a side (the nightly gate's for a cell it measures again) 72-94 %; the size ladder
    #: (gate_size) prints what smaller gates reach on the run's own spread
    gate_samples: int = 40
    threshold: float = 0.05
    rules: int | None = None            # None: as many as make ``added`` of A's cost

    def check(self) -> None:
        """Bad numbers are the CLI's to refuse (argparse types); this says what they must
        satisfy together, before anything is created."""
        if self.rounds < 2 * self.gate_samples:
            raise BenchCostError(f"--rounds {self.rounds}: the A/A gates need at least twice "
                                 f"--gate-samples ({2 * self.gate_samples}) samples a variant")


class BenchCostError(TestbedError):
    exit_status = 2


class AddedCost(hooks.SampleHook):
    """The known cost on B, through the run's per-sample hooks (testbed.measure.hooks): A's
    warm-ups give its cost per packet, and each of B's measured samples is taken with as
    many rules on its taps' ingress as make ``added`` of it (``rules`` when given), put on
    for the sample's window and taken off after it."""

    name = "added_cost"

    def __init__(self, added: float, ns_per_rule: float, rules: int | None = None,
                 progress: Callable[[str], None] = lambda s: None) -> None:
        self.added, self.ns_per_rule, self.rules, self.progress = added, ns_per_rule, rules, progress
        self.base: list[float] = []

    @property
    def known_ns(self) -> float | None:
        return None if self.rules is None else self.rules * self.ns_per_rule

    def _decide(self) -> int:
        if self.rules is None:
            if not self.base:
                raise TestbedError("A's warm-up samples carry no cost per packet to size the added cost by")
            a = statistics.mean(self.base)
            self.rules = max(1, round(self.added * a / self.ns_per_rule))
            self.progress(f"A costs {a:.0f} ns a packet over its warm-ups: {self.rules} rules on B's taps "
                          f"add a known {self.known_ns:.0f} ns ({self.known_ns / a:.1%})")
        return self.rules

    @contextlib.contextmanager
    def window(self, window: hooks.SampleWindow) -> Iterator[None]:
        if dict(window.cell.context).get("variant") != "b" or window.warmup:
            yield
            return
        path = window.paths[0]
        taps = [path.client.tap, path.server.tap]
        with nft_rules(f"{taps[0].rsplit('-', 1)[0]}-cost", taps, self._decide()):
            yield

    def finding(self, window: hooks.SampleWindow, sample: SampleRecord) -> hooks.Finding:
        if dict(window.cell.context).get("variant") == "a" and window.warmup:
            out = cost.compute(sample)
            if out is not None and out.reason is None:
                self.base.append(out.cost.ns_per_packet["path"])
        return hooks.Finding()


def run(o: Options, progress: Callable[[str], None] = print) -> dict[str, Any]:
    """Calibrate, then measure the cell A/B in one run with the rules on B, and judge it."""
    from testbed.measure import runner
    from testbed.records import results
    from testbed.topology import config
    o.check()
    cal = calibrate()
    progress(f"one rule costs {cal['ns_per_rule']:.1f} ns a packet (ping floods on a veth pair, "
             f"{CALIBRATION_RULES} rules)")
    t = config.parse(TOPOLOGY.format(duration=o.duration_s, warmup=2, rounds=o.rounds), "<bench cost>")
    added = AddedCost(o.added, cal["ns_per_rule"], o.rules, progress)
    out = runner.execute(t, progress=progress, hooks=[added])
    rec = results.read_run(out.run_dir)
    done = {v: [s for s in rec.samples if s.cell.variant == v and not s.warmup and s.status != "noisy"]
            for v in ("a", "b")}
    f = figures(done["a"], done["b"], known_ns=added.known_ns, n=o.gate_samples, threshold=o.threshold)
    with contextlib.suppress(ValueError):       # too few samples to fit: figures said so already
        f["size"] = gate_size(_rows(done["a"]), _rows(done["b"]), threshold=o.threshold,
                              known={o.gate_samples: f["gate"]["power"]})
    return {**f, "rules": added.rules, "calibration": cal, "run_dir": str(out.run_dir),
            "options": dataclasses.asdict(o),
            "failed": [f"{s.cell.id} rep {s.rep}: {s.reason}" for v in done.values() for s in v if not s.ok]}


def report(r: Mapping[str, Any]) -> tuple[list[str], bool]:
    """Pure: the lines the bench prints and whether every target was met."""
    g, o = r["gate"], r["options"]
    lines = [f"cell                 bridge/qemu tcp_rr, {r['n_a']} A and {r['n_b']} B samples, A B B A ...",
             f"added on B           {r['rules']} nftables rules on B's taps' ingress: known "
             f"{r['known_ns']:.0f} ns a packet ({r['known']:+.1%} of A's path)",
             f"measured             path: A {r['a_ns']:.0f} ns, B {r['b_ns']:.0f} ns a packet, added "
             f"{r['added_ns']:+.0f} ns ({r['added']:+.1%}); the host's side: A {r['host_a_ns']:.0f} ns, "
             f"B {r['host_b_ns']:.0f} ns ({r['host_added']:+.1%})"]
    lines += [f"  {role:<18} {v:+.0f} ns a packet" for role, v in sorted(r["by_role"].items(), key=lambda x: -x[1])]
    lines.append(f"role that took it    {r['role']}: {r['moved']}")
    lines.append(f"gate power           {g['power']:.1%} of {g['draws']} gates of {g['gate_samples']} samples a "
                 f"side, drawn from A's and B's measured spread, called B's cost regressed "
                 f"({', '.join(g['metrics'])}, threshold {g['threshold']:.0%}, Benjamini-Hochberg q {g['q']}; "
                 f"target >= {POWER_TARGET:.0%})")
    if r.get("size"):
        z = r["size"]
        lines.append("gate size            " + (f"{z['needed']} samples a side reach {POWER_TARGET:.0%}" if z["needed"]
                                                else f"no size up to {max(z['power'])} samples a side reaches {POWER_TARGET:.0%}")
                     + " at this run's spread (power at " + ", ".join(f"{n}: {p:.0%}" for n, p in z["power"].items()) + ")")
    fam = g["false_alarms_measured"]
    lines.append(f"false alarms (A/A)   {g['false_alarms']:.1%} of gates drawn from one variant's spread"
                 + ("" if fam is None else f", {fam:.1%} of gates made of one variant's own samples split "
                    "in two") + f" (target <= {FALSE_ALARM_TARGET:.0%})")
    for v in ("a", "b"):
        for what, s in r["spread"][v].items():
            if s["sample_rsd"] is not None:
                lines.append(f"spread {v.upper()} {what:<12} one sample {s['sample_rsd']:.1%}, a gate's mean of "
                             f"{g['gate_samples']} {s['gate_mean_rsd']:.1%} (relative standard deviation)")
    lines += [f"failed: {f}" for f in r["failed"]]
    ok = (g["power"] >= POWER_TARGET and r["added"] > 0
          and max(g["false_alarms"], g["false_alarms_measured"] or 0.0) <= FALSE_ALARM_TARGET)
    lines.append(f"compare the whole run: testbed compare {r['run_dir']} --variants a b --threshold {o['threshold']:g}")
    return lines, ok


def main(o: Options) -> int:
    r = run(o, progress=lambda s: print(s, flush=True))
    lines, ok = report(r)
    print("\n".join(lines))
    return 0 if ok else 1
