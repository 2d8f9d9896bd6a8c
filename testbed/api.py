"""The testbed's public Python API: what a nightly script, a notebook or a team's tests use.

Everything a script needs is here, under these names; the `testbed` command is built on
them. Every other module of the package (``testbed.<subpackage>``) is private: its names may
move in any release. The names and signatures here are pinned by a test
(``suites/unit/test_public_api.py``); a change to them is announced in the changelog and the
old form is kept, with a deprecation warning, for at least one minor release.

    from testbed import api

    topology = api.load_topology("nightly.yaml")        # validated; bad input: api.ConfigError
    outcome = api.run(topology, progress=print)           # measured into results/<run-id>
    run = api.open_run(outcome.run_dir)                   # typed records
    for s in run.samples:
        print(s.cell.id, s.status, s.metrics.get("throughput_mbps"))
    verdict = api.compare("results/last-good", outcome.run_dir)
    print(verdict.exit_status, api.render_comparison(verdict))

Errors a user can cause are :class:`TestbedError` subclasses with one clear line:
:class:`ConfigError` (bad input, the CLI's exit 2), :class:`CapabilityError` (this host
cannot do what was asked, exit 3).
"""
from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from testbed.errors import CapabilityError, ConfigError, TestbedError
from testbed.measure.hooks import Finding, SampleHook, SampleWindow
from testbed.records.records import CellOutcome, RunRecord, SampleRecord
from testbed.records.runparts import Outcome
from testbed.topology.model import Accelerator, Attachment, Backend, Cell, Pattern, Profile, Topology

if TYPE_CHECKING:
    from testbed.analysis.capacity import Plan
    from testbed.analysis.compare import RunComparison
    from testbed.analysis.history import Series

PathLike = str | os.PathLike

__all__ = [
    # topologies
    "load_topology", "parse_topology", "default_topology", "plan",
    # running
    "run", "Outcome", "SampleHook", "SampleWindow", "Finding",
    # results
    "open_run", "find_run", "list_runs", "index_run", "RunRecord", "SampleRecord", "CellOutcome",
    # reading results
    "compare", "render_comparison", "history", "capacity", "write_report",
    # the model
    "Topology", "Cell", "Profile", "Attachment", "Backend", "Pattern", "Accelerator",
    # errors
    "TestbedError", "ConfigError", "CapabilityError",
]


# --------------------------------------------------------------------------- topologies

def load_topology(path: PathLike) -> Topology:
    """Read and validate a topology file (docs: Topology files).

    Raises:
        ConfigError: the file, the field and the problem, on one line.
    """
    from testbed.topology import config
    return config.load(path)


def parse_topology(text: str, source: str = "<string>", base: PathLike | None = None) -> Topology:
    """Validate a topology given as YAML text; ``source`` names it in errors, ``base`` is
    the folder its relative paths are read from (default: the current folder)."""
    from testbed.topology import config
    return config.parse(text, source, Path(base) if base is not None else Path.cwd())


def default_topology(attachments: Sequence[str] | None = None) -> Topology:
    """The built-in topology: two guests on this host, TCP_STREAM and TCP_RR, over
    ``attachments`` (default: every single-host mode this host supports)."""
    from testbed import attachments as modes
    from testbed.topology import config
    if isinstance(attachments, str):
        attachments = [attachments]         # one mode named alone, not its letters
    chosen = [Attachment(a) for a in attachments] if attachments is not None else modes.supported_single_host()
    return config.default(chosen)


def plan(topology: Topology | PathLike) -> list[Cell]:
    """The cells a run of ``topology`` (a Topology, or a topology file's path) measures, in
    order (each cell's ``id`` reads like ``bridge-qemu-mtu1500-conn1-tcp_stream``)."""
    from testbed.measure import plan as plan_mod
    if isinstance(topology, (str, os.PathLike)):
        topology = load_topology(topology)
    return plan_mod.plan(topology)


# --------------------------------------------------------------------------- running

def run(topology: Topology | PathLike, *, progress: Callable[[str], None] | None = None,
        resume: PathLike | None = None, hooks: Sequence[SampleHook] = (),
        index: bool = True) -> Outcome:
    """Measure a topology's matrix into a new run folder (``results/<run-id>``, or
    ``$TESTBED_RESULTS``), as `testbed run` does.

    Args:
        topology: a validated :class:`Topology`, or the path of a topology file.
        progress: called with one line of text per step (guests ready, each cell, faults).
        resume: an interrupted run's folder: its finished cells are kept, the rest measured.
        hooks: per-sample hooks run over every sample's window (:class:`SampleHook`).
        index: add the run to the results index (``index.sqlite`` beside the runs), so
            that :func:`history` sees it.

    Returns:
        How the run ended: its folder, status, sample and failure counts.

    Raises:
        ConfigError: bad input. CapabilityError: this host cannot run what was asked.
    """
    from testbed.measure import runner
    t = topology if isinstance(topology, Topology) else load_topology(topology)
    out = runner.execute(t, progress=progress or (lambda s: None),
                         resume=Path(resume) if resume is not None else None, hooks=hooks)
    if index:
        index_run(out.run_dir)
    return out


# --------------------------------------------------------------------------- results

def find_run(ref: PathLike, results_dir: PathLike | None = None) -> Path:
    """A run folder from a path or a run id under ``results_dir`` (default: the results
    folder, ``$TESTBED_RESULTS`` or ``./results``)."""
    from testbed.analysis import compare as cmp
    return cmp.resolve(ref, Path(results_dir) if results_dir is not None else None)


def open_run(ref: PathLike, results_dir: PathLike | None = None) -> RunRecord:
    """A run as typed records: ``run.samples`` (each a :class:`SampleRecord`: ``status``,
    ``reason``, ``metrics``, ``cpu``...), ``run.cells`` (each a :class:`CellOutcome`),
    ``run.environment``, ``run.status``.

    Raises:
        TestbedError: no such run (``ref`` is neither a run folder nor a run id of the
            results folder), or a run folder this testbed cannot read (a ConfigError naming
            the file and line).
    """
    from testbed.records import results
    return results.read_run(find_run(ref, results_dir))


def list_runs(results_dir: PathLike | None = None) -> list[Path]:
    """The run folders under ``results_dir`` (default: the results folder), oldest first."""
    from testbed.host import paths
    from testbed.records import results
    return list(results.iter_runs(Path(results_dir) if results_dir is not None else paths.results_dir()))


def index_run(run_dir: PathLike, db: str | None = None) -> None:
    """Add a run to the results index: ``db`` (an SQLite path or a ``postgresql://`` URL),
    by default ``index.sqlite`` beside the run, which :func:`history` reads."""
    from testbed.records import store
    run_dir = Path(run_dir)
    with store.open(db or str(run_dir.parent / "index.sqlite")) as st:
        st.index_run(run_dir)


# --------------------------------------------------------------------------- reading results

def compare(base: PathLike | RunRecord, new: PathLike | RunRecord | None = None, *,
            variants: tuple[str, str] | None = None, threshold: float = 0.05, alpha: float = 0.05,
            force: bool = False, results_dir: PathLike | None = None, **options: Any) -> RunComparison:
    """Compare run NEW with run BASE cell by cell (the nightly gate, as `testbed compare`),
    or, with ``variants=("A", "B")`` and one run, its variant B with its variant A.

    ``threshold``: the relative change that counts; ``alpha``: the test's level; ``force``:
    compare runs whose environments differ (never TCG with KVM). Further keyword options
    are those of `testbed compare` (``test``, ``q``, ``min_samples``, ``across_hosts``).

    Returns:
        The comparison: ``exit_status`` (0 no cell regressed and every cell was decided;
        1 a cell regressed, broke, was redefined or is missing; 5 none failed but some could
        not be decided: too few samples a side, 5 by default, or an interval too wide; 2
        refused; read 5 as "could not tell", never as "fine"),
        ``refused`` (why, or None), ``differences``; :func:`render_comparison` prints it.
    """
    from testbed.analysis import compare as cmp

    def rec(x: PathLike | RunRecord) -> RunRecord:
        return x if isinstance(x, RunRecord) else open_run(x, results_dir)
    b = rec(base)
    if variants is not None:
        if new is not None:
            raise ConfigError("compare", "new", "variants compare one run: pass BASE only")
        cmp.require_variants(b, list(variants))
        if len(set(variants)) != len(variants):
            raise ConfigError("compare", "variants", f"{variants[0]!r} twice: a variant compared with itself "
                                                     f"shows nothing")
        n = b
    elif new is None:
        raise ConfigError("compare", "new", "compare needs BASE and NEW (or one run and variants)")
    else:
        n = rec(new)
        if _same_run(b, n):
            raise ConfigError("compare", "new", f"{n.dir} is BASE itself: a run compared with itself shows "
                                                f"nothing (the gate would pass whatever it holds)")
    return cmp.compare_runs(b, n, threshold=threshold, alpha=alpha, force=force,
                            variants=tuple(variants) if variants else None, **options)


def _same_run(a: RunRecord, b: RunRecord) -> bool:
    """Both records read from one run folder (records made in memory have none)."""
    try:
        return (a.dir / "run.json").is_file() and os.path.samefile(a.dir, b.dir)
    except OSError:
        return False


def render_comparison(comparison: RunComparison, *, fmt: str = "text") -> str:
    """A comparison as `testbed compare` prints it: ``text``, ``json`` or ``junit`` (XML)."""
    import json

    from testbed.analysis import compare as cmp
    if fmt not in ("text", "json", "junit"):
        raise ConfigError("render_comparison", "fmt", f"{fmt!r}: expected text, json or junit")
    if fmt == "json":
        return json.dumps(cmp.to_dict(comparison), indent=2, default=str)
    if fmt == "junit":
        return cmp.render_junit(comparison)
    return cmp.render_text(comparison)


def history(*, cell: str | None = None, metric: str | None = None, threshold: float = 0.05,
            by: str = "host", results_dir: PathLike | None = None, db: str | None = None) -> list[Series]:
    """Every indexed cell's series over time, with its change points, as `testbed history`
    (``by``: one series per ``host`` or per host ``class``); each series says whether its
    newest point regresses (``newest_regresses``)."""
    from testbed.analysis import history as hist
    from testbed.host import paths
    from testbed.records import store
    root = Path(results_dir) if results_dir is not None else paths.results_dir()
    with store.open(db or str(root / "index.sqlite"), readonly=True) as st:
        found = hist.series(st, cell=cell, metric=metric, threshold=threshold, by=by)
    return hist.with_acks(found, hist.read_acks(root))


def capacity(run: PathLike | RunRecord, profile: str, *, host_cores: float | None = None,
             headroom: float = 0.2, results_dir: PathLike | None = None, **options: Any) -> Plan | Any:
    """How many VMs of a traffic ``profile`` (``stream:2gbit``, ``rr:5ktps``) fit on a host
    like the run's, as `testbed capacity`: from a run with N-pair cells or idle readings the
    density plan, else the one-pair plan. Further keyword options are those of
    `testbed capacity` (``link_gbit``, ``mtu``, ``connections``, ``memory_mib``...)."""
    from testbed.analysis import capacity as cap
    from testbed.analysis import capacity_model, capacity_plan
    rec = run if isinstance(run, RunRecord) else open_run(run, results_dir)
    demand = cap.parse_demand(profile)
    if capacity_model.has_pairs_data(rec):
        return capacity_plan.plan(rec, demand, host_cores=host_cores, headroom=headroom, **options)
    return cap.plan(rec, demand, host_cores=host_cores, headroom=headroom, **options)


def write_report(runs: Sequence[PathLike | RunRecord], output: PathLike, *,
                 baseline: PathLike | RunRecord | None = None, results_dir: PathLike | None = None) -> Path:
    """The self-contained HTML report of ``runs`` (against ``baseline``), as `testbed report`."""
    from testbed.analysis import report
    from testbed.records import results

    def rec(x: PathLike | RunRecord) -> RunRecord:
        return x if isinstance(x, RunRecord) else open_run(x, results_dir)
    records = [rec(r) for r in runs]
    base = rec(baseline) if baseline is not None else None
    if base is not None and all(r.run_id != base.run_id for r in records):
        records.insert(0, base)
    out = Path(output)
    out.write_text(report.render(report.build(records, generated=results.now(), baseline=base)))
    return out
