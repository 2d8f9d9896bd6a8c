"""`testbed bench cost`: does the gate see a per-packet cost?

One cell (Linux bridge, userspace virtio, netperf TCP_RR) measured A/B in one run with the
A/B variants: two guest pairs on one bridge, samples taken A B B A ... On the B side a
known per-packet cost is added on the forwarding path: a chain of nftables rules that
never match (``meta mark``, counted) on the ingress of B's two taps, so every packet B's
guests send walks all of them, and nothing else's traffic does (a netdev table bound to
those two devices, named tb-<tag>-cost, removed on success, failure and Ctrl-C).

How many rules: the cost of one rule is measured first on a namespace veth pair (a ping
flood's round trip with and without a chain of rules on one ingress), A's cost per packet
over the warm-ups, and the rules are as many as make ``--added`` (5 %) of it. Then:

- the measured added cost per packet, per role, and the role that took it
  (testbed.analysis.costs.moved), against the known one (rules x the cost of one);
- the gate's power to call it regressed: gates of ``--gate-samples`` a side drawn from the
  run's A and B samples (without replacement within a draw), each judged by
  testbed.analysis.stats.compare as `testbed compare` judges one cell, at ``--threshold``;
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
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from testbed.analysis import costs, stats
from testbed.errors import TestbedError
from testbed.host import proc
from testbed.measure.cost import METRIC, ROLES, role_metric
from testbed.records.records import SampleRecord

#: the gate's targets the bench checks its figures against
POWER_TARGET, FALSE_ALARM_TARGET = 0.90, 0.05
#: rules on the calibration's ingress, and ping-flood round trips per measurement
CALIBRATION_RULES, CALIBRATION_PINGS, CALIBRATION_ROUNDS = 2000, 5000, 3
#: gates drawn for the power and the false-alarm rate
DRAWS = 2000

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


def gate_rates(a: Sequence[float], b: Sequence[float], *, n: int, threshold: float, alpha: float = 0.05,
               draws: int = DRAWS, seed: int = 0) -> dict[str, Any]:
    """Pure: the share of gates of ``n`` samples a side that call B's cost regressed against
    A's (power), and the share that call one variant regressed against itself (false alarms,
    from both variants' samples, halves drawn apart)."""
    rng = np.random.default_rng(seed)
    av, bv = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if av.size < 2 * n or bv.size < 2 * n:
        raise ValueError(f"{av.size} A and {bv.size} B samples: the A/A gates need {2 * n} a side")

    def regressed(x: np.ndarray, y: np.ndarray) -> bool:
        c = stats.compare(x.tolist(), y.tolist(), higher_is_better=False, threshold=threshold,
                          alpha=alpha, min_samples=n)
        return c.verdict is stats.Verdict.REGRESSED
    power = sum(regressed(rng.choice(av, n, replace=False), rng.choice(bv, n, replace=False))
                for _ in range(draws)) / draws
    false = 0
    for k in range(draws):
        pool = av if k % 2 == 0 else bv
        pick = rng.permutation(pool.size)
        false += regressed(pool[pick[:n]], pool[pick[n:2 * n]])
    return {"power": power, "false_alarms": false / draws, "draws": draws, "gate_samples": n,
            "threshold": threshold, "alpha": alpha}


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
    by_role = {r: statistics.mean(_path(b, role_metric(r))) - statistics.mean(_path(a, role_metric(r)))
               for r in ROLES}
    return {"a_ns": ma, "b_ns": mb, "added_ns": mb - ma, "added": (mb - ma) / ma, "known_ns": known_ns,
            "known": known_ns / ma if known_ns is not None else None, "by_role": by_role,
            "role": max(ROLES, key=lambda r: by_role[r]), "moved": costs.role_change(a, b),
            "gate": gate_rates(pa, pb, n=n, threshold=threshold, draws=draws),
            "spread": {"a": spread(pa, n), "b": spread(pb, n)}, "n_a": len(pa), "n_b": len(pb)}


# --------------------------------------------------------------------------- the run

@dataclass(frozen=True)
class Options:
    rounds: int = 12
    duration_s: int = 5
    added: float = 0.05
    gate_samples: int = 5
    threshold: float = 0.02
    rules: int | None = None            # None: as many as make ``added`` of A's cost

    def check(self) -> None:
        """Bad numbers are the CLI's to refuse (argparse types); this says what they must
        satisfy together, before anything is created."""
        if self.rounds < 2 * self.gate_samples:
            raise BenchCostError(f"--rounds {self.rounds}: the A/A gates need at least twice "
                                 f"--gate-samples ({2 * self.gate_samples}) samples a variant")
        if self.threshold >= self.added and self.rules is None:
            raise BenchCostError(f"--threshold {self.threshold:g}: a gate calls a change regressed only "
                                 f"beyond its threshold, so it must be below --added {self.added:g}")


class BenchCostError(TestbedError):
    exit_status = 2


def run(o: Options, progress=print) -> dict[str, Any]:
    """Calibrate, then measure the cell A/B with the rules on B, and judge it."""
    from testbed.admin import capabilities
    from testbed.guests import images, virt
    from testbed.measure import sampling as measure
    from testbed.measure import variants
    from testbed.measure.session import Session
    from testbed.measure.runner import plan
    from testbed.topology import config
    o.check()
    cal = calibrate()
    progress(f"one rule costs {cal['ns_per_rule']:.1f} ns a packet (ping floods on a veth pair, "
             f"{CALIBRATION_RULES} rules)")
    t = config.parse(TOPOLOGY.format(duration=o.duration_s, warmup=2, rounds=o.rounds), "<bench cost>")
    cells = plan(t)
    with Session(t) as ses:
        img = images.ensure()
        accel = capabilities.choose_accelerator(t.accelerator, img.kernel)      # type: ignore[arg-type]
        writer = ses.open_run(accel, image=img)
        writer.update(variants=variants.describe(t.matrix.variants))
        conn = ses.stack.enter_context(virt.connect(t.hosts[0].uri))
        pairs = variants.boot(ses.stack, conn, t, img, accel, ses.run_id, ses.tag, ses.state,
                              lambda: writer.count("boots"))
        for p in pairs:
            for g in (p.client, p.server):
                g.wait_ready(t.ready_timeout_s)
        pids = {p.variant.name: {g.spec.name: pid for g in (p.client, p.server) if (pid := virt.qemu_pid(g))}
                for p in pairs}
        placement = {g.spec.name: g.spec.host for p in pairs for g in (p.client, p.server)}
        by_v = {variants.variant_of(c): c for c in cells}
        with variants.mode(cells[0].attachment, cells[0].backend, ses.tag, pairs, t.subnet,
                           max(t.matrix.mtus), topology=t, workdir=ses.state) as paths:
            for v, c in by_v.items():
                measure.set_mtu(paths[v], c.mtu)
            warm = [measure.measure_once(by_v["a"], paths["a"], writer, w, True, pids["a"], placement, None)
                    for w in range(2)]
            for s in warm:
                writer.add_sample(s)
            base = _path([dataclasses.replace(s, warmup=False) for s in warm])
            if not base:
                raise TestbedError("A's warm-up samples carry no cost per packet: "
                                   + "; ".join(s.reason or "no cost" for s in warm))
            rules = o.rules if o.rules is not None else max(1, round(o.added * statistics.mean(base)
                                                                    / cal["ns_per_rule"]))
            known = rules * cal["ns_per_rule"]
            progress(f"A costs {statistics.mean(base):.0f} ns a packet over its warm-ups: {rules} rules on "
                     f"B's taps add a known {known:.0f} ns ({known / statistics.mean(base):.1%})")
            taps = [paths["b"].client.tap, paths["b"].server.tap]
            done: dict[str, list[SampleRecord]] = {"a": [], "b": []}
            with nft_rules(f"tb-{ses.tag}-cost", taps, rules):
                for rnd in range(o.rounds):
                    for v in variants.round_order(["a", "b"], rnd):
                        s = measure.measure_once(by_v[v], paths[v], writer, rnd, False, pids[v], placement, None)
                        writer.add_sample(s)
                        done[v].append(s)
                    progress(f"round {rnd + 1}/{o.rounds}: A {_last(done['a'])}, B {_last(done['b'])} ns a packet")
        for v, c in by_v.items():
            writer.add_cell(c, "ok" if all(s.ok for s in done[v]) else "partial" if any(s.ok for s in done[v])
                            else "failed", None, None, measure.summaries([s for s in done[v] if s.ok]))
        run_dir = writer.dir
    out = figures(done["a"], done["b"], known_ns=known, n=o.gate_samples, threshold=o.threshold)
    return {**out, "rules": rules, "calibration": cal, "run_dir": str(run_dir), "options": dataclasses.asdict(o),
            "failed": [f"{s.cell.id} rep {s.rep}: {s.reason}" for v in done.values() for s in v if not s.ok]}


def _last(samples: Sequence[SampleRecord]) -> str:
    v = samples[-1].metric(METRIC) if samples else None
    return "failed" if v is None else f"{v:.0f}"


def report(r: Mapping[str, Any]) -> tuple[list[str], bool]:
    """Pure: the lines the bench prints and whether every target was met."""
    g, o = r["gate"], r["options"]
    lines = [f"cell                 bridge/qemu tcp_rr, {r['n_a']} A and {r['n_b']} B samples, A B B A ...",
             f"added on B           {r['rules']} nftables rules on B's taps' ingress: known "
             f"{r['known_ns']:.0f} ns a packet ({r['known']:+.1%} of A)",
             f"measured             A {r['a_ns']:.0f} ns, B {r['b_ns']:.0f} ns a packet: added "
             f"{r['added_ns']:+.0f} ns ({r['added']:+.1%})"]
    lines += [f"  {role:<18} {v:+.0f} ns a packet" for role, v in sorted(r["by_role"].items(), key=lambda x: -x[1])]
    lines.append(f"role that took it    {r['role']}: {r['moved']}")
    lines.append(f"gate power           {g['power']:.1%} of {g['draws']} gates of {g['gate_samples']} a side "
                 f"called B regressed (threshold {g['threshold']:.0%}; target >= {POWER_TARGET:.0%})")
    lines.append(f"false alarms (A/A)   {g['false_alarms']:.1%} (target <= {FALSE_ALARM_TARGET:.0%})")
    for v in ("a", "b"):
        s = r["spread"][v]
        if s["sample_rsd"] is not None:
            lines.append(f"spread {v.upper()}             one sample {s['sample_rsd']:.1%}, a gate's mean of "
                         f"{g['gate_samples']} {s['gate_mean_rsd']:.1%} (relative standard deviation)")
    lines += [f"failed: {f}" for f in r["failed"]]
    ok = g["power"] >= POWER_TARGET and g["false_alarms"] <= FALSE_ALARM_TARGET and r["added"] > 0
    lines.append(f"compare the whole run: testbed compare {r['run_dir']} --variants a b --threshold {o['threshold']:g}")
    return lines, ok


def main(o: Options) -> int:
    r = run(o, progress=lambda s: print(s, flush=True))
    lines, ok = report(r)
    print("\n".join(lines))
    return 0 if ok else 1
