"""`testbed compare BASE NEW`: per-cell verdicts for nightly gates, refusing incomparable runs.

Cells are matched by id. Per cell, the primary metric (throughput_mbps for stream-type
profiles, transactions_per_s for rr/crr) and the latency metrics are compared with
:func:`testbed.analysis.stats.compare`. Only the primary metric and, for rr/crr, latency decide a
cell's verdict: a stream test's "latency" is how long a send() call took, not the network's
latency, so it is shown but never fails a gate.

Environments must match before numbers are compared: the accelerator, the CPU model and the
set of attachment modes. ``force`` overrides a CPU model or attachment mismatch, never an
accelerator mismatch: TCG figures are functional checks, orders of magnitude away from KVM,
and no flag makes such a comparison meaningful. Use `testbed report` to look at both.

Cells are matched by id and definition hash (model.Cell.hash): a cell whose id matches but
whose definition changed (tool, sizes, duration, offloads, guest size, placement, variant)
is REDEFINED, never compared as the same cell. A cell needs ``min_samples`` (5) ok samples
a side to carry a verdict, else it is INSUFFICIENT. The p-values of every cell's deciding
metrics form one family, adjusted with Benjamini-Hochberg at ``q`` (0.05), after (with
``--test auto``) each metric's Welch tests became moderated t-tests sharing a variance
prior across the cells (:func:`testbed.analysis.stats.moderate`); a regression
needs the adjusted significance and an effect beyond the threshold. A cell whose samples
all failed in NEW is BROKEN; one whose failure rate rose is BROKEN only when Fisher's exact
test says the rate is credibly higher, its p adjusted in the same family: one transient
failure is listed, not a red night.

Exit statuses (``RunComparison.exit_status``): 2 refused; 1 a cell regressed, broke, was
redefined or is missing from NEW; 5 no cell failed but some could not be decided
(insufficient, inconclusive, no baseline), or every cell is new to BASE (nothing was
compared): a gate must not read "could not tell" as "fine";
0 otherwise. Failed samples are left out of the statistics and listed.
"""
from __future__ import annotations

import dataclasses
import math
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any

from testbed.analysis import costs, hopgate, stats, tailgate
from testbed.analysis import shift as shift_mod
from testbed.errors import ExitStatus, TestbedError, one_line
from testbed.host import paths
from testbed.records import results
from testbed.records.percentiles import METRIC_RE
from testbed.records.records import Environment, RunRecord, SampleRecord

LATENCY_METRICS = ("latency_mean_us", "latency_p99_us")
#: environment keys that differ between builds by design; shown, never refused
COMPLETE = ("complete", "complete-with-failures")
#: (the host itself is a difference of its own: Severity.HOST)
INFO_KEYS = ("kernel", "cpus", "cpu_mhz", "memory_bytes", "vhost_net", "testbed_commit")


class RunNotFound(TestbedError):
    exit_status = 2


#: exit status when nothing failed but some cells could not be decided
UNDECIDED_STATUS = ExitStatus.UNDECIDED


# --------------------------------------------------------------------------- loading

def resolve(ref: str | Path, results_root: Path | None = None) -> Path:
    """A run directory, or a run id under the results directory."""
    p = Path(ref)
    root = results_root if results_root is not None else paths.results_dir()
    try:
        if (p / "run.json").is_file():
            return p
        if (root / str(ref) / "run.json").is_file():
            return root / str(ref)
    except OSError as e:             # a name too long, a path through a file
        raise RunNotFound(f"{str(ref)[:80]}: not a run directory ({e.strerror})") from None
    raise RunNotFound(f"{ref}: not a run directory, and no run {ref!r} under {root}")


def load(ref: str | Path, results_root: Path | None = None) -> RunRecord:
    return results.read_run(resolve(ref, results_root))


def environment(rec: RunRecord) -> Environment:
    return rec.environment


def attachments(rec: RunRecord) -> tuple[str, ...]:
    """The attachment modes a run set out to measure (its matrix), else those of its cells."""
    return rec.attachments()


def is_transactional(rec: RunRecord, profile: str) -> bool:
    return rec.is_transactional(profile)


def primary_metric(rec: RunRecord, profile: str) -> str:
    return rec.primary_metric(profile)


def measured(rec: RunRecord, variant: str | None = None) -> dict[str, list[SampleRecord]]:
    """Cell id -> its measured (non-warmup) samples, ok and failed, in the order taken.
    With ``variant``, only that variant's samples, keyed by the id without the variant."""
    out: dict[str, list[SampleRecord]] = defaultdict(list)
    for s in rec.samples:
        if s.warmup:
            continue
        if variant is None:
            out[s.cell.id].append(s)
        elif s.cell.variant == variant:
            out[s.cell.plain_id].append(s)
    return out


def definition_differences(base: RunRecord, new: RunRecord) -> list[tuple[str, str, str]]:
    """(what, base, new) for the topology and profile settings that differ: the run-wide
    half of a cell's definition, listed beside the environment's differences."""
    return base.definition_differences(new)


# --------------------------------------------------------------------------- environment

class Severity(StrEnum):
    FORBIDDEN = "forbidden"   # never compared, whatever the flags
    MISMATCH = "mismatch"     # refused unless --force
    CHANGED = "changed"       # what the nightly is testing (kernel, QEMU, OVS); shown only
    #: a topology or profile setting differs: the cells it touches are REDEFINED, not compared
    DEFINITION = "definition"
    #: measured on different hosts (machine ids): refused unless --across-hosts
    HOST = "host"


@dataclass(frozen=True)
class Difference:
    what: str
    base: str
    new: str
    severity: Severity


def differences(base: RunRecord, new: RunRecord) -> tuple[Difference, ...]:
    eb, en = base.environment, new.environment
    out: list[Difference] = []

    def add(what: str, b: Any, n: Any, sev: Severity) -> None:
        if b != n:
            out.append(Difference(what, str(b), str(n), sev))

    fb, fn = base.format_version, new.format_version
    if fb != fn or fb != results.FORMAT_VERSION:
        out.append(Difference(f"format_version (this testbed reads {results.FORMAT_VERSION})",
                              str(fb), str(fn), Severity.FORBIDDEN))
    add("accelerator", eb.accelerator, en.accelerator, Severity.FORBIDDEN)
    if eb.accelerator == en.accelerator:
        add("comparable_class", eb.comparable_class, en.comparable_class, Severity.FORBIDDEN)
    add("cpu_model", eb.cpu_model, en.cpu_model, Severity.MISMATCH)
    add("attachments", ",".join(attachments(base)), ",".join(attachments(new)), Severity.MISMATCH)
    hb, hn = _host_pair(eb, en)
    if hb and hn:
        add("host (machine_id)" if eb.machine_id and en.machine_id else "host (hostname)",
            _host_name(eb, hb), _host_name(en, hn), Severity.HOST)
    for key in INFO_KEYS:
        add(key, getattr(eb, key), getattr(en, key), Severity.CHANGED)
    vb, vn = eb.versions or {}, en.versions or {}
    for tool in sorted(set(vb) | set(vn)):
        add(f"versions.{tool}", vb.get(tool), vn.get(tool), Severity.CHANGED)
    add("image", eb.image.digest if eb.image else None, en.image.digest if en.image else None,
        Severity.CHANGED)
    for what, b, n in definition_differences(base, new):
        out.append(Difference(what, b, n, Severity.DEFINITION))
    return tuple(out)


def _host_name(env: Environment, key: str) -> str:
    name = env.inventory_host or env.host
    return f"{name} {key}" if name and name != key else key


def _host_pair(eb: Environment, en: Environment) -> tuple[str | None, str | None]:
    """The hosts as compared: machine ids when both runs have one, else hostnames."""
    if eb.machine_id and en.machine_id:
        return eb.machine_id, en.machine_id
    return eb.host, en.host


def tuning_differences(base: RunRecord, new: RunRecord) -> tuple[Difference, ...]:
    """The host settings that move figures (environment.tuning, testbed.host.tuning) that differ
    between the runs: governor, turbo, C-states, SMT, NUMA, IRQ affinity, kernel command
    line, THP. Listed next to the verdicts, never refused: a changed setting may be what the
    comparison is about. A setting one run could not read shows as 'unreadable'."""
    import json

    from testbed.host import tuning
    tb, tn = base.environment.tuning or {}, new.environment.tuning or {}
    if not tb or not tn:
        return ()
    out = []

    def show(d: Any, k: str) -> str:
        if k not in d:
            return "not recorded"
        v = d[k]
        return "unreadable" if v is None else (json.dumps(v, sort_keys=True) if not isinstance(v, str) else v)
    for k in tuning.COMPARED:
        if tb.get(k) != tn.get(k) or (k in tb) != (k in tn):
            out.append(Difference(f"tuning.{k}", show(tb, k), show(tn, k), Severity.CHANGED))
    return tuple(out)


def split_noisy(groups: dict[str, list[SampleRecord]]) -> tuple[dict[str, list[SampleRecord]], int, int]:
    """The samples without those the noise guard set aside (status noisy: measured again,
    never used), how many those were, and how many noisy samples were kept, marked (used)."""
    kept = {k: [s for s in v if s.status != "noisy"] for k, v in groups.items()}
    excluded = sum(len(v) - len(kept[k]) for k, v in groups.items())
    marked = sum(1 for v in kept.values() for s in v if s.noisy)
    return kept, excluded, marked


# --------------------------------------------------------------------------- cells

class CellVerdict(StrEnum):
    IMPROVED = "improved"
    REGRESSED = "regressed"
    UNCHANGED = "unchanged"
    #: credibly no worse than the threshold, not shown within it on the better side: passes
    NOT_WORSE = "not-worse"
    INCONCLUSIVE = "inconclusive"
    BROKEN = "broken"               # BASE had successful samples, NEW has none: fails the gate
    NO_BASELINE = "no-baseline"     # BASE has no successful samples to compare with
    #: BASE measured the cell, NEW did not (the run died, or the matrix shrank): fails the
    #: gate, because a nightly must not pass by measuring less
    BASE_ONLY = "base-only"
    NEW_ONLY = "new-only"
    #: fewer than min_samples ok samples on a side: no verdict
    INSUFFICIENT = "insufficient"
    #: same id, different definition hash: not the same test, so not compared; BASE's cell
    #: is missing from NEW, which fails the gate
    REDEFINED = "redefined"

    @property
    def fails_gate(self) -> bool:
        return self in (CellVerdict.REGRESSED, CellVerdict.BROKEN, CellVerdict.BASE_ONLY,
                        CellVerdict.REDEFINED)

    @property
    def undecided(self) -> bool:
        return self in (CellVerdict.INSUFFICIENT, CellVerdict.INCONCLUSIVE,
                        CellVerdict.NO_BASELINE)


_WORST = (stats.Verdict.REGRESSED, stats.Verdict.INCONCLUSIVE, stats.Verdict.INSUFFICIENT,
          stats.Verdict.NOT_WORSE, stats.Verdict.IMPROVED, stats.Verdict.UNCHANGED)


@dataclass(frozen=True)
class MetricResult:
    metric: str
    decides: bool                   # counts towards the cell's verdict
    comparison: stats.Comparison


@dataclass(frozen=True)
class CellResult:
    cell_id: str
    attachment: str
    backend: str
    mtu: int
    connections: int
    profile: str
    verdict: CellVerdict
    metrics: tuple[MetricResult, ...]
    base_ok: int
    base_failed: int
    new_ok: int
    new_failed: int
    failures: tuple[str, ...]       # "NEW rep 1: <reason>", failed samples never vanish silently
    note: str = ""
    base_hash: str = ""             # definition hash(es) of the cell's samples on each side
    new_hash: str = ""
    #: NEW failed more often than BASE: Fisher's one-sided p that its failure rate is higher,
    #: and that p after Benjamini-Hochberg in the family of the deciding metrics
    failure_p: float | None = None
    failure_p_adjusted: float | None = None
    #: the role whose host CPU per packet moved most, in words (testbed.analysis.costs)
    cost_role: str = ""

    @property
    def verdict_text(self) -> str:
        """The verdict, naming the role whose cost moved when the cost is what moved it."""
        moved = [m.comparison.verdict for m in self.metrics if m.metric in costs.DECIDING
                 and m.comparison.verdict in (stats.Verdict.REGRESSED, stats.Verdict.IMPROVED)]
        if self.cost_role and moved:
            worst = stats.Verdict.REGRESSED if stats.Verdict.REGRESSED in moved else moved[0]
            return f"{self.verdict.value} (cost {worst.value}: {self.cost_role})"
        return self.verdict.value


def _values(samples: Iterable[SampleRecord], metric: str) -> list[float]:
    return [float(s.metrics[metric]) for s in samples
            if s.ok and isinstance(s.metrics.get(metric), (int, float))]


def _hashes(samples: Iterable[SampleRecord]) -> set[str]:
    return {str(s.cell.hash) for s in samples}


def _cell(run: RunRecord, cid: str, base: list[SampleRecord], new: list[SampleRecord], *,
          threshold: float, alpha: float, test: str, min_samples: int) -> CellResult:
    """A cell's result before the false-discovery adjustment (see :func:`_finish`)."""
    cell = (new or base)[0].cell
    ok_b = [s for s in base if s.ok]
    ok_n = [s for s in new if s.ok]
    failures = tuple(f"{side} rep {s.rep}: {s.reason or 'failed'}"
                     for side, group in (("BASE", base), ("NEW", new))
                     for s in group if not s.ok)
    ident = dict(cell_id=cid, attachment=str(cell.attachment), backend=str(cell.backend),
                 mtu=int(cell.mtu or 0), connections=int(cell.connections or 0),
                 profile=str(cell.profile), base_ok=len(ok_b), base_failed=len(base) - len(ok_b),
                 new_ok=len(ok_n), new_failed=len(new) - len(ok_n), failures=failures,
                 base_hash=",".join(sorted(_hashes(base))) if base else "",
                 new_hash=",".join(sorted(_hashes(new))) if new else "")
    if not base:
        return CellResult(**ident, verdict=CellVerdict.NEW_ONLY, metrics=(), note="cell not in BASE")
    if not new:
        return CellResult(**ident, verdict=CellVerdict.BASE_ONLY, metrics=(), note="cell not in NEW")
    if _hashes(base) != _hashes(new):
        return CellResult(**ident, verdict=CellVerdict.REDEFINED, metrics=(),
                          note=f"definition changed: hash {ident['base_hash']} -> "
                               f"{ident['new_hash']}; not the same test, not compared")
    if not ok_b:
        return CellResult(**ident, verdict=CellVerdict.NO_BASELINE, metrics=(),
                          note="no successful samples in BASE")
    if not ok_n:
        return CellResult(**ident, verdict=CellVerdict.BROKEN, metrics=(),
                          note=f"every NEW sample failed: BASE {len(base) - len(ok_b)}/{len(base)}, "
                               f"NEW {len(new)}/{len(new)} failed")
    ident["failure_p"] = failure_rate(len(base) - len(ok_b), len(base), len(new) - len(ok_n), len(new))
    if len(ok_b) < min_samples or len(ok_n) < min_samples:
        return CellResult(**ident, verdict=CellVerdict.INSUFFICIENT, metrics=(),
                          note=f"insufficient: {len(ok_b)} BASE and {len(ok_n)} NEW ok samples, "
                               f"{min_samples} needed a side (repetitions: gate)")
    profile = ident["profile"]
    primary, rr = run.primary_metric(profile), run.is_transactional(profile)
    results_: list[MetricResult] = []
    for metric, higher, decides in ((primary, True, True),
                                    *((m, False, rr) for m in LATENCY_METRICS if not METRIC_RE.fullmatch(m)),
                                    *costs.COMPARED):
        vb, vn = _values(ok_b, metric), _values(ok_n, metric)
        if decides and metric in costs.DECIDING and vb and not vn:
            # a cost hook that broke in NEW would otherwise hide every cost regression
            return CellResult(**ident, verdict=CellVerdict.INSUFFICIENT, metrics=(),
                              note=f"{metric} in {len(vb)} BASE ok samples and in no NEW one "
                                   f"(NEW's cost was not recorded): not decided")
        if vb and vn:
            results_.append(MetricResult(metric, decides, stats.compare(
                vb, vn, higher_is_better=higher, threshold=threshold, alpha=alpha, test=test,
                min_samples=min_samples, spread_from=spread_from(run), trim=stats.TRIM)))
    # percentiles (p50 .. p99.9, as chosen) by a method fit for quantiles: testbed.analysis.tailgate
    results_ += [MetricResult(k, rr, c) for k, c in tailgate.comparisons(
        [s.metrics for s in ok_b], [s.metrics for s in ok_n], threshold=threshold, alpha=alpha,
        min_samples=min_samples, spread_from=spread_from(run))]
    # per-hop latencies of a traced cell (informational): a regression names its hop
    results_ += [MetricResult(k, False, c) for k, c in hopgate.comparisons(
        [s.metrics for s in ok_b], [s.metrics for s in ok_n], threshold=threshold, alpha=alpha,
        min_samples=min_samples)]
    return CellResult(**ident, verdict=CellVerdict.INCONCLUSIVE, metrics=tuple(results_),
                      note="" if any(m.metric == primary for m in results_)
                      else f"{primary} missing from the successful samples",
                      cost_role=costs.role_change(ok_b, ok_n))


def spread_from(run: RunRecord) -> int | None:
    """The samples a run's stopping rule always takes, when the rule is adaptive (an rsd
    target with max above min): the moderated t estimates its variance from those only,
    since the rule stops sides that happen to look tight (stats.log_spread)."""
    r = (run.topology.get("matrix") or {}).get("repetitions")
    if not isinstance(r, dict):
        return None
    lo, hi, rsd = r.get("min_samples"), r.get("max_samples"), r.get("rsd_target")
    if isinstance(lo, int) and isinstance(hi, int) and hi > lo >= 2 and rsd:
        return lo
    return None


def failure_rate(base_failed: int, base_n: int, new_failed: int, new_n: int) -> float | None:
    """The failure-rate test's p when NEW failed more often than BASE, else None. A cell is
    broken only when that rate is credibly higher (the p survives Benjamini-Hochberg with
    the gate's other tests, :func:`_failure_verdicts`): a single transient failure among
    hundreds of samples is listed and judged, never a red night on its own."""
    if new_failed / new_n <= base_failed / base_n:
        return None
    return stats.failure_rate_p(base_failed, base_n, new_failed, new_n)


def _failure_verdicts(cells: list[CellResult], adjusted: list[float]) -> None:
    """Cells whose failure-rate p, adjusted in the deciding family, is below q: BROKEN."""
    at = [i for i, c in enumerate(cells) if c.failure_p is not None]
    for i, pa in zip(at, adjusted):
        c = cells[i]
        cells[i] = dataclasses.replace(c, failure_p_adjusted=pa)


def _apart_by(cells: Sequence[CellResult]) -> str:
    """What the cells that moved apart from the night's shift have in common, most first
    ("ovs 28, bridge 2"): a group of one attachment mode is a build that changed it."""
    counts = Counter(c.attachment for c in cells)
    return ", ".join(f"{a} {n}" for a, n in counts.most_common())


def _finish(cells: list[CellResult], q: float, moderated: bool = True, *, shifts: bool = True
            ) -> tuple[tuple[CellResult, ...], tuple[str, ...], tuple[shift_mod.Shift, ...]]:
    """Benjamini-Hochberg across every cell's deciding metrics, then each cell's verdict:
    the worst of its deciding metrics. Informational metrics are adjusted in their own
    family so that they neither dilute nor are diluted by the gate's. Before the adjustment,
    with ``moderated``, each metric's Welch tests within a family become moderated t-tests
    (:func:`testbed.analysis.stats.moderate`); then, with ``shifts``, each deciding metric's
    shared shift is taken out of its cells and judged as one more member of the family
    (:mod:`testbed.analysis.shift`). Returns the cells, per deciding metric which test was
    used and with what prior, and the shifts."""
    priors: list[str] = []
    found: list[shift_mod.Shift] = []
    for decides in (True, False):
        slots = [(i, j) for i, c in enumerate(cells) for j, m in enumerate(c.metrics)
                 if m.decides is decides]
        comps = [cells[i].metrics[j].comparison for i, j in slots]
        for metric in sorted({cells[i].metrics[j].metric for i, j in slots}):
            at = [k for k, (i, j) in enumerate(slots) if cells[i].metrics[j].metric == metric]
            if moderated:
                # One prior per metric: throughput and latency noise need not be alike.
                mod, prior = stats.moderate([comps[k] for k in at])
                for k, c in zip(at, mod):
                    comps[k] = c
                if decides and prior.cells:
                    priors.append(f"{metric}: {prior.describe()}")
            if decides and shifts and at:
                c0 = comps[at[0]]
                moved, sh = shift_mod.take_out(metric, [comps[k] for k in at], threshold=c0.threshold,
                                               alpha=c0.alpha, ids=[cells[slots[k][0]].cell_id for k in at])
                for k, c in zip(at, moved):
                    comps[k] = c
                if sh is not None:
                    apart = set(sh.apart)
                    found.append(dataclasses.replace(sh, apart_by=_apart_by(
                        [c for c in cells if c.cell_id in apart])))
        extra = [c.failure_p for c in cells if c.failure_p is not None] if decides else []
        n_cells = len(comps)
        adjusted, fail_adj = stats.adjust_family(comps + ([s.comparison for s in found] if decides else []), extra, q)
        if decides:
            _failure_verdicts(cells, fail_adj)
            found = [dataclasses.replace(s, comparison=c) for s, c in zip(found, adjusted[n_cells:])]
        for (i, j), comp in zip(slots, adjusted[:n_cells]):
            ms = list(cells[i].metrics)
            ms[j] = dataclasses.replace(ms[j], comparison=comp)
            cells[i] = dataclasses.replace(cells[i], metrics=tuple(ms))
    out = []
    for c in cells:
        if c.metrics or c.verdict is CellVerdict.INCONCLUSIVE:
            deciding = [m.comparison.verdict for m in c.metrics if m.decides]
            if not c.note and deciding:
                worst = next(v for v in _WORST if v in deciding)
                c = dataclasses.replace(c, verdict=CellVerdict(worst.value))
        if c.failure_p_adjusted is not None and c.failure_p_adjusted < q:
            c = dataclasses.replace(c, verdict=CellVerdict.BROKEN, note=(
                f"failure rate rose, credibly: BASE {c.base_failed}/{c.base_ok + c.base_failed}, "
                f"NEW {c.new_failed}/{c.new_ok + c.new_failed} failed (Fisher p "
                f"{c.failure_p:.2g}, adjusted {c.failure_p_adjusted:.2g} < q {q})"))
        out.append(c)
    return tuple(out), tuple(priors), tuple(found)


# --------------------------------------------------------------------------- runs

@dataclass(frozen=True)
class RunInfo:
    run_id: str
    dir: str
    status: str
    accelerator: str | None
    cpu_model: str | None


def run_info(rec: RunRecord) -> RunInfo:
    return RunInfo(rec.run_id, str(rec.dir), rec.status, rec.environment.accelerator,
                   rec.environment.cpu_model)


@dataclass(frozen=True)
class RunComparison:
    base: RunInfo
    new: RunInfo
    differences: tuple[Difference, ...]
    refused: str | None             # why no numbers were compared; None when they were
    forced: bool                    # --force overrode a mismatch
    tcg: bool                       # both runs TCG: a functional check, not performance evidence
    test: str
    threshold: float
    alpha: float
    cells: tuple[CellResult, ...]
    warnings: tuple[str, ...] = ()
    q: float = stats.FDR_Q
    min_samples: int = stats.MIN_SAMPLES
    #: per deciding metric, the test behind its p-values (moderated t and its prior, or
    #: per-cell Welch and why); empty when no Welch test ran
    tests_used: tuple[str, ...] = ()
    #: host settings (environment.tuning) that differ between the runs
    tuning: tuple[Difference, ...] = ()
    #: noise guard: samples excluded (set aside as noisy) and kept marked, per side
    noisy: dict[str, int] = dataclasses.field(default_factory=dict)
    #: --across-hosts compared runs of different hosts (their figures differ by host too)
    across_hosts: bool = False
    #: the night's shared shift per deciding metric (testbed.analysis.shift), each judged
    shifts: tuple[shift_mod.Shift, ...] = ()

    @property
    def failing(self) -> tuple[CellResult, ...]:
        return tuple(c for c in self.cells if c.verdict.fails_gate)

    @property
    def undecided(self) -> tuple[CellResult, ...]:
        return tuple(c for c in self.cells if c.verdict.undecided)

    @property
    def failing_shifts(self) -> tuple[shift_mod.Shift, ...]:
        """Shifts credibly beyond the threshold: every cell moved, a finding that fails."""
        return tuple(s for s in self.shifts if s.comparison.verdict is stats.Verdict.REGRESSED)

    @property
    def undecided_shifts(self) -> tuple[shift_mod.Shift, ...]:
        """Shifts whose estimate is beyond the threshold on the worse side, not credibly: to
        watch, never a reason for exit 5 (no second look shrinks a host's drift; history
        judges the shift over nights). A shift within it is no finding at all."""
        return tuple(s for s in self.shifts if s.undecided)

    @property
    def exit_status(self) -> int:
        if self.refused:
            return 2
        if self.failing or self.failing_shifts:
            return 1
        # a night whose every cell is new to BASE compared nothing: "could not tell"
        nothing = all(c.verdict is CellVerdict.NEW_ONLY for c in self.cells)
        return UNDECIDED_STATUS if self.undecided or nothing else 0

    def counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for c in self.cells:
            out[c.verdict.value] = out.get(c.verdict.value, 0) + 1
        return out


def compare_runs(base: RunRecord, new: RunRecord, *, threshold: float = 0.05,
                 alpha: float = 0.05, test: str = "auto", force: bool = False,
                 q: float = stats.FDR_Q, min_samples: int = stats.MIN_SAMPLES,
                 variants: tuple[str, str] | None = None,
                 across_hosts: bool = False, shifts: bool = True) -> RunComparison:
    """Compare NEW with BASE; with ``variants`` (A, B), ``base`` and ``new`` are one run and
    its variant A samples are BASE, its variant B samples NEW. Runs of different hosts are
    refused unless ``across_hosts``: a difference between hosts is not a build's."""
    diffs = differences(base, new) if variants is None else ()
    forbidden = [d for d in diffs if d.severity is Severity.FORBIDDEN]
    mismatch = [d for d in diffs if d.severity is Severity.MISMATCH]
    hosts = [d for d in diffs if d.severity is Severity.HOST]
    refused = None
    if forbidden:
        what = "; ".join(f"{d.what} {d.base} vs {d.new}" for d in forbidden)
        refused = (f"NEVER COMPARABLE: {what}. TCG figures are functional checks and are never "
                   f"compared with KVM figures (nor runs of different formats); --force does "
                   f"not override this")
    elif hosts and not across_hosts:
        what = "; ".join(f"{d.base} vs {d.new}" for d in hosts)
        refused = (f"runs of different hosts ({what}); a difference between hosts is not a "
                   f"build's: compare runs of one host, or give --across-hosts")
    elif mismatch and not force:
        what = "; ".join(f"{d.what} {d.base} vs {d.new}" for d in mismatch)
        refused = f"environments differ: {what}; --force compares anyway"
    accel = {base.environment.accelerator, new.environment.accelerator}
    noisy: dict[str, int] = {}
    cells: tuple[CellResult, ...] = ()
    tests_used: tuple[str, ...] = ()
    found: tuple[shift_mod.Shift, ...] = ()
    if refused is None:
        if variants is None:
            mb, mn = measured(base), measured(new)
        else:
            mb, mn = measured(base, variants[0]), measured(new, variants[1])
            mb = {k: [_no_variant(s) for s in v] for k, v in mb.items()}
            mn = {k: [_no_variant(s) for s in v] for k, v in mn.items()}
        mb, xb, kb = split_noisy(mb)
        mn, xn, kn = split_noisy(mn)
        noisy = {"base_excluded": xb, "new_excluded": xn, "base_kept": kb, "new_kept": kn}
        cells, tests_used, found = _finish(
            [_cell(new if cid in mn else base, cid, mb.get(cid, []), mn.get(cid, []), threshold=threshold,
                   alpha=alpha, test=test, min_samples=min_samples)
             for cid in sorted(set(mb) | set(mn))], q, moderated=test == "auto", shifts=shifts)
    warnings = tuple(f"{side} run {rec.run_id} ended {rec.status}: "
                     f"cells it did not reach are missing"
                     for side, rec in (("BASE", base), ("NEW", new))
                     if rec.status not in COMPLETE)
    return RunComparison(run_info(base), run_info(new), diffs, refused,
                         forced=bool(force and mismatch and not forbidden), tcg=accel == {"tcg"},
                         test=test, threshold=threshold, alpha=alpha, cells=cells,
                         warnings=warnings, q=q, min_samples=min_samples,
                         tests_used=tests_used,
                         tuning=tuning_differences(base, new) if variants is None else (), noisy=noisy,
                         across_hosts=bool(hosts and across_hosts and refused is None), shifts=found)


def variants_of(rec: RunRecord) -> tuple[str, ...]:
    return tuple(sorted({str(s.cell.variant) for s in rec.samples if s.cell.variant}))


def require_variants(rec: RunRecord, names: Iterable[str]) -> None:
    have = variants_of(rec)
    for v in names:
        if v not in have:
            raise RunNotFound(f"{rec.dir}: no variant {v!r} in this run (it has: "
                              f"{', '.join(have) or 'no variants'})")


def _no_variant(s: SampleRecord) -> SampleRecord:
    """A variant's sample as if it came from a run of its own: the variant leaves the
    definition, so A's and B's cells hash alike when nothing else differs."""
    return dataclasses.replace(s, cell=s.cell.without_variant())


# --------------------------------------------------------------------------- output

TCG_BANNER = ("!! TCG: both runs used QEMU's TCG emulator. A functional check only: these numbers "
              "say the pipeline works, not how a KVM host performs. Not comparable with KVM.")


def to_dict(rc: RunComparison) -> dict[str, Any]:
    d = dataclasses.asdict(rc)
    d.update(exit_status=rc.exit_status, counts=rc.counts(),
             failing=[c.cell_id for c in rc.failing],
             banner=TCG_BANNER if rc.tcg else None)
    return d


def fmt(v: float | None, digits: int = 4) -> str:
    if v is None:
        return "-"
    return f"{v:.{digits}g}" if abs(v) < 10 ** digits else f"{v:.0f}"


def change_interval(cm: stats.Comparison) -> str:
    """The change's (1 - 2 alpha) interval, as the equivalence test reads it."""
    if cm.change_ci is None:
        return "-"
    return f"[{cm.change_ci[0] * 100:+.1f}, {cm.change_ci[1] * 100:+.1f}]%"


def render_text(rc: RunComparison) -> str:
    lines = [f"BASE {rc.base.run_id} ({rc.base.accelerator}, {rc.base.cpu_model}, {rc.base.status})",
             f"NEW  {rc.new.run_id} ({rc.new.accelerator}, {rc.new.cpu_model}, {rc.new.status})"]
    if rc.tcg:
        lines.append(TCG_BANNER)
    lines.extend(f"!! {w}" for w in rc.warnings)
    for d in rc.differences:
        lines.append(f"{d.severity.value:>9}: {d.what}: {d.base} -> {d.new}")
    if rc.refused:
        lines.append(f"REFUSED: {rc.refused}")
        return "\n".join(one_line(x, 100_000) for x in lines) + "\n"
    if rc.across_hosts:
        lines.append("!! --across-hosts: BASE and NEW were measured on different hosts; every "
                     "difference below may be the hosts', not the build's")
    if rc.forced:
        lines.append("!! --force: compared despite the mismatches above")
    header = ("cell", "verdict", "metric", "base", "new", "delta", "shift out", "interval", "mdc",
              "test", "p worse", "p adj", "metric verdict")
    rows: list[tuple[str, ...]] = []
    for c in rc.cells:
        first = (c.cell_id, c.verdict.value.upper())
        if not c.metrics:
            rows.append((*first, "-", "-", "-", "-", "-", "-", "-", "-", "-", "-", "-"))
        for i, m in enumerate(c.metrics):
            cm = m.comparison
            rows.append((*(first if i == 0 else ("", "")), m.metric,
                         f"{fmt(cm.base.mean)} (n={cm.base.n})", f"{fmt(cm.new.mean)} (n={cm.new.n})",
                         "-" if cm.delta_pct is None else f"{cm.delta_pct:+.1f}%",
                         "-" if cm.shift is None or cm.evidence is None
                         else f"{math.expm1(cm.evidence.d) * 100:+.1f}%",
                         change_interval(cm), "-" if cm.mdc is None else f"{cm.mdc:.1%}",
                         cm.test or "-", fmt(cm.p_worse, 2), fmt(cm.p_adjusted, 2),
                         cm.verdict.value + ("" if m.decides else " (info)")))
    widths = [max(len(r[i]) for r in (header, *rows)) for i in range(len(header))]
    for r in (header, *rows):
        lines.append("  ".join(v.ljust(w) for v, w in zip(r, widths)).rstrip())
    notes = [f"  {c.cell_id}: ok samples BASE {c.base_ok}/{c.base_ok + c.base_failed}, NEW "
             f"{c.new_ok}/{c.new_ok + c.new_failed}" + (f"; {c.note}" if c.note else "")
             for c in rc.cells if c.base_failed or c.new_failed or c.note]
    notes += [f"  {c.cell_id}: failure rate rose but not credibly (Fisher p {c.failure_p:.2g}, "
              f"adjusted {c.failure_p_adjusted:.2g} >= q {rc.q}): measure again if it persists"
              for c in rc.cells if c.failure_p_adjusted is not None
              and c.verdict is not CellVerdict.BROKEN]
    notes += [f"  {c.cell_id} {m.metric}: {m.comparison.note}" for c in rc.cells
              for m in c.metrics if m.comparison.note and m.decides]
    notes += [a for c in rc.cells if (a := hopgate.attribution(c.cell_id, c.metrics))]
    if notes:
        lines.append("notes:")
        lines.extend(notes)
    lines.extend(f"host setting differs: {d.what}: {d.base} -> {d.new}" for d in rc.tuning)
    if rc.noisy and any(rc.noisy.values()):
        n = rc.noisy
        lines.append(f"noisy samples excluded (host busy with other work, measured again): BASE "
                     f"{n['base_excluded']}, NEW {n['new_excluded']}; kept, marked: BASE {n['base_kept']}, "
                     f"NEW {n['new_kept']}")
    failures = [f for c in rc.cells for f in (f"{c.cell_id}: {x}" for x in c.failures)]
    if failures:
        lines.append(f"failed samples (excluded from statistics): {len(failures)}")
        lines.extend(f"  {f}" for f in failures)
    summary = ", ".join(f"{n} {v}" for v, n in sorted(rc.counts().items()))
    lines.extend(s.describe() for s in rc.shifts)
    lines.append("interval: (1 - 2 alpha) interval of the change (after the night's shift, when one "
                 f"was taken out: 'shift out'); unchanged only when it lies within +-{rc.threshold:.0%} "
                 "(equivalence), not-worse when its worse side does; p worse: one-sided p that the change "
                 f"is worse than -{rc.threshold:.0%}, regressed when adjusted below q; mdc: smallest change "
                 "the cell could detect at its noise and n (80 % power)")
    lines.append(f"{len(rc.cells)} cells: {summary or 'none'}; test {rc.test}, threshold "
                 f"{rc.threshold:.0%}, alpha {rc.alpha}, Benjamini-Hochberg q {rc.q:.4g}, "
                 f"at least {rc.min_samples} ok samples a side")
    lines.extend(f"p-values of {t}" for t in rc.tests_used)
    lines.extend(f"  {c.cell_id}: {c.verdict_text}" for c in rc.cells if c.verdict_text != c.verdict.value)
    if rc.failing or rc.failing_shifts:
        lines.append("GATE FAILED: " + ", ".join(
            [f"{c.cell_id} {c.verdict_text}" for c in rc.failing]
            + [f"night shift {s.metric} {s.change:+.1%}" for s in rc.failing_shifts]))
    elif rc.undecided or not rc.cells:
        lines.append(f"GATE UNDECIDED (exit {UNDECIDED_STATUS}): "
                     + (", ".join(f"{c.cell_id} {c.verdict.value}" for c in rc.undecided) or "no cells"))
        lines.extend(filter(None, [resolution(rc)]))
    if rc.undecided_shifts and not rc.failing_shifts:
        lines.append("WATCH (no effect on the exit status): " + ", ".join(
            f"night shift {s.metric} {s.change:+.1%}, near the threshold" for s in rc.undecided_shifts)
            + "; `testbed history` tells a host's drift from a lasting change of the build")
    # run ids, CPU models and cell ids come from the runs' files: a newline or a terminal
    # escape in one must not forge a line ("0 regressed") or drive the terminal
    return "\n".join(one_line(x, 100_000) for x in lines) + "\n"


def resolution(rc: RunComparison) -> str | None:
    """One line on what this host's noise lets the gate resolve, when cells stayed
    undecided: the smallest detectable change of their undecided deciding metrics at the
    samples taken, and the samples a side their median one would need to reach the
    threshold. An unchanged cell is shown unchanged only when its interval fits within
    +-threshold, so a threshold below the host's resolution leaves it undecided every night,
    whatever the build: the remedy is the host (quiet it, pin the testbed), more samples,
    or a threshold the host can resolve, not a rerun."""
    comps = sorted((m.comparison for c in rc.undecided for m in c.metrics
                    if m.decides and m.comparison.mdc and m.comparison.verdict is stats.Verdict.INCONCLUSIVE),
                   key=lambda x: x.mdc)
    if not comps or not rc.threshold:
        return None
    mid = comps[len(comps) // 2]
    over = comps[0].mdc > rc.threshold
    return (f"resolution: the undecided metrics could detect changes of {comps[0].mdc:.1%} to "
            f"{comps[-1].mdc:.1%} (median {mid.mdc:.1%} at {max(mid.base.n, mid.new.n)} samples a "
            f"side) against a threshold of {rc.threshold:.0%}; about {tailgate.samples_for(mid)} "
            "samples a side would bring the median to it"
            + ("; every one is above it: this host's noise, not the build, holds the gate (quiet "
               "or pin the host, measure more, or choose a threshold it resolves)" if over else ""))


def render_junit(rc: RunComparison) -> str:
    """JUnit XML: one testcase per cell; failure for a cell that fails the gate, skipped for
    one that could not be decided, so a CI system shows the gate cell by cell."""
    from xml.etree import ElementTree as ET
    root = ET.Element("testsuites")
    name = (f"testbed compare {rc.base.run_id} {rc.new.run_id}" if rc.base.run_id != rc.new.run_id
            else f"testbed compare {rc.base.run_id}")
    suite = ET.SubElement(root, "testsuite", name=name, tests=str(len(rc.cells)),
                          failures=str(len(rc.failing)), skipped=str(len(rc.undecided)),
                          errors="1" if rc.refused else "0")
    if rc.refused:
        case = ET.SubElement(suite, "testcase", classname="testbed.analysis.compare", name="environments")
        ET.SubElement(case, "error", message="refused").text = rc.refused
    for c in rc.cells:
        case = ET.SubElement(suite, "testcase", classname=f"testbed.analysis.compare.{c.attachment}",
                             name=c.cell_id)
        detail = "; ".join(
            f"{m.metric} {m.comparison.verdict.value} "
            + ("" if m.comparison.delta_pct is None else f"{m.comparison.delta_pct:+.1f}% ")
            + f"p_adj={fmt(m.comparison.p_adjusted, 2)}" for m in c.metrics if m.decides)
        text = "; ".join(filter(None, [c.note, detail, c.verdict_text if c.cost_role else ""]))
        if c.verdict.fails_gate:
            ET.SubElement(case, "failure", message=c.verdict.value).text = text
        elif c.verdict.undecided:
            ET.SubElement(case, "skipped", message=f"{c.verdict.value}: {text}")
        ET.SubElement(case, "system-out").text = (
            f"verdict {c.verdict.value}; ok samples BASE {c.base_ok}/{c.base_ok + c.base_failed}, "
            f"NEW {c.new_ok}/{c.new_ok + c.new_failed}; hash {c.new_hash or c.base_hash}")
    for sh in rc.shifts:
        case = ET.SubElement(suite, "testcase", classname="testbed.analysis.shift",
                             name=f"night shift {sh.metric}")
        if sh in rc.failing_shifts:
            ET.SubElement(case, "failure", message="regressed").text = sh.describe()
        ET.SubElement(case, "system-out").text = sh.describe()
    suite.set("tests", str(len(rc.cells) + len(rc.shifts)))
    suite.set("failures", str(len(rc.failing) + len(rc.failing_shifts)))
    suite.set("skipped", str(len(rc.undecided)))
    ET.indent(root)
    return ET.tostring(root, encoding="unicode", xml_declaration=True) + "\n"
