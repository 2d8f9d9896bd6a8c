"""Subcommands that read results: index, compare, history, report, capacity, export-csv.

``add_commands(subparsers)`` registers them on the `testbed` parser; each sets ``func`` to a
function that takes the parsed args and returns the exit status. Errors are TestbedErrors,
which `testbed.cli.main` turns into one line and an exit status.
"""
from __future__ import annotations

import argparse
import io
import json
import os
import sys
from pathlib import Path
from typing import Any

from testbed.errors import one_line
from testbed.host import paths
from testbed.records import results


def _results_root(args: argparse.Namespace) -> Path:
    # the global --results, given before or after the command (testbed.cli.conventions)
    given = getattr(args, "results_root", None)
    return Path(given) if given else paths.results_dir()


from testbed.cli import conventions as cv
from testbed.cli.argtypes import fraction as _fraction
from testbed.cli.argtypes import level as _level
from testbed.cli.argtypes import integer, number, path_ref, text


def _outputs(*named: tuple[str | None, str]) -> dict[str, Path | None]:
    """Every output a command will write, checked before any work (exit 2 on a directory, a
    device, a FIFO, an empty name or a parent that is not a directory)."""
    from testbed.host import safeio
    return safeio.check_outputs(named)


def _not_inputs(out: dict[str, Path | None], runs: list[Path] = (), files: list[Path | str | None] = ()) -> None:
    """No output may replace what the command reads: a run's own files (its report.html
    aside, which is an output), the store, the acknowledgements. Written over, the run or
    the store would be lost at the command's exit 0."""
    from testbed.host.safeio import UserFileError
    real = {arg: Path(os.path.realpath(p)) for arg, p in out.items() if p is not None}
    keep = {Path(os.path.realpath(f)) for f in files if f and os.path.exists(f)}
    for arg, p in real.items():
        inside = [d for d in runs if p.is_relative_to(os.path.realpath(d)) and p.exists() and p.name != "report.html"]
        if p in keep or inside:
            raise UserFileError(arg, f"{p} is one of this command's inputs; writing it would destroy "
                                     f"{'the run ' + str(inside[0]) if inside else 'it'}")


def _write(path: Path | None, text: str, arg: str) -> None:
    from testbed.host import safeio
    safeio.write_output(path, text, arg)      # 0644: a report is for sharing


# --------------------------------------------------------------------------- index

def cmd_index(args: argparse.Namespace) -> int:
    from testbed.analysis.compare import resolve
    from testbed.records import store
    root = _results_root(args)
    dirs = [resolve(r, root) for r in args.runs] or list(results.iter_runs(root))
    store.check_target(args.db or str(root / "index.sqlite"))
    # Every run is read and validated before the store is opened: a bad run creates nothing.
    for d in dirs:
        results.read_run(d)
    with store.open(args.db or str(root / "index.sqlite")) as st:
        for d in dirs:
            rows = st.index_run(d)
            print(f"indexed {rows.run.run_id} ({rows.run.status}): {len(rows.cells)} cells, "
                  f"{len(rows.samples)} samples")
        print(f"{st.backend} index, schema version {st.schema_version()}: "
              f"{len(st.runs())} runs", file=sys.stderr)
    return 0


# --------------------------------------------------------------------------- compare

def cmd_compare(args: argparse.Namespace) -> int:
    from testbed import api
    from testbed.analysis import compare
    root = _results_root(args)
    out = _outputs((args.junit, "--junit"))
    if args.variants:
        if args.new is not None:
            raise compare.RunNotFound("compare --variants A B takes one RUN, not BASE and NEW")
        base, new = compare.load(args.base, root), None
    else:
        if args.new is None:
            raise compare.RunNotFound("compare needs BASE and NEW (or RUN --variants A B)")
        base, new = compare.load(args.base, root), compare.load(args.new, root)
    _not_inputs(out, [compare.resolve(r, root) for r in (args.base, args.new) if r is not None])
    rc = api.compare(base, new, threshold=args.threshold, alpha=args.alpha, test=args.test, force=args.force,
                     q=args.fdr, min_samples=args.min_samples,
                     variants=tuple(args.variants) if args.variants else None, across_hosts=args.across_hosts)
    if args.junit:
        _write(out["--junit"], api.render_comparison(rc, fmt="junit"), "--junit")
    if args.json:
        print(api.render_comparison(rc, fmt="json"))
    else:
        sys.stdout.write(api.render_comparison(rc))
    if rc.refused:
        never = any(d.severity is compare.Severity.FORBIDDEN for d in rc.differences)
        ignored = ("; --force IGNORED: TCG and KVM runs (or different run formats) are never "
                   "compared") if never and args.force else ""
        print(f"testbed compare: refused: {one_line(rc.refused, 2000)}{ignored}", file=sys.stderr)
    elif rc.forced:
        print("testbed compare: WARNING: --force compared runs from different environments",
              file=sys.stderr)
    if rc.across_hosts:
        print("testbed compare: WARNING: --across-hosts compared runs of different hosts",
              file=sys.stderr)
    return rc.exit_status


# --------------------------------------------------------------------------- history

def cmd_history(args: argparse.Namespace) -> int:
    from testbed.analysis import history, hopgate, report
    from testbed.records.store.schema import metric_columns
    root = _results_root(args)
    if args.ack is not None:
        # an acknowledgement reads no store and prints no series: an option for those would
        # be dropped without a word (and --cell/--metric would not narrow the ack)
        given = [opt for opt, v in (("--by", args.by != "host"), ("--db", args.db), ("--cell", args.cell),
                                    ("--metric", args.metric), ("--threshold", args.threshold != 0.05),
                                    ("--output", args.output), ("--json", args.json)) if v]
        if given:
            from testbed.host.safeio import UserFileError
            raise UserFileError(given[0], "is not for --ack (an acknowledgement is CELL@RUN with --who and --why)")
        return history.acknowledge(root, args.ack, args.who, args.why)
    for arg, v in (("--who", args.who), ("--why", args.why)):
        if v is not None:
            from testbed.host.safeio import UserFileError
            raise UserFileError(arg, "is for --ack CELL@RUN (who acknowledges, and why)")
    history.read_acks(root)                 # a bad file: exit 2 before the store is read
    by = args.by
    if by not in history.BY:
        from testbed.host.safeio import UserFileError
        raise UserFileError("--by", f"{by!r}: expected one of {', '.join(history.BY)}")
    out = _outputs((args.output, "--output"))
    _not_inputs(out, files=[args.db, root / "index.sqlite", root / history.ACKS])
    from testbed.analysis.sample_cost import METRICS as COST_METRICS
    if args.metric is not None and args.metric not in (*metric_columns(), *COST_METRICS) \
            and args.metric != history.HOPS and not args.metric.startswith(hopgate.PREFIXES):
        from testbed.host.safeio import UserFileError
        raise UserFileError("--metric", f"{args.metric!r} is not a metric the store keeps; "
                                        f"known: {', '.join((*metric_columns(), *COST_METRICS))}, hops (every "
                                        f"hop of a traced cell), or one hop's: hop_p50_us.HOP, hop_p99_us.HOP")
    # A read: the store must exist and be this testbed's; nothing is created or migrated.
    from testbed import api
    found = api.history(cell=args.cell, metric=args.metric, threshold=args.threshold, by=by, results_dir=root,
                        db=args.db)
    if args.json:
        import dataclasses
        print(json.dumps([dataclasses.asdict(s) | {"newest_regresses": s.newest_regresses}
                          for s in found], indent=2))
    else:
        sys.stdout.write(history.render_text(found))
    if args.output:
        rep = report.build([], generated=results.now(), history=found)
        _write(out["--output"], report.render(rep), "--output")
        print(f"wrote {args.output}: {len(found)} series", file=sys.stderr)
    return 1 if any(s.newest_regresses for s in found) else 0


# --------------------------------------------------------------------------- report

def cmd_report(args: argparse.Namespace) -> int:
    from testbed.analysis import compare, report, slo
    spec = slo.parse(args.slo) if args.slo else None     # bad text: exit 2 before reading runs
    root = _results_root(args)
    if args.output is None:
        # one run: beside its samples, where `testbed run` put it; several: here
        args.output = str(compare.resolve(args.runs[0], root) / "report.html"
                          if len(args.runs) == 1 else Path("report.html"))
    out = _outputs((args.output, "--output"), (args.csv, "--csv"))
    _not_inputs(out, [compare.resolve(r, root) for r in [*args.runs, *([args.baseline] if args.baseline else [])]])
    records = [compare.load(r, root) for r in args.runs]
    baseline = compare.load(args.baseline, root) if args.baseline else None
    if baseline is not None and all(r.run_id != baseline.run_id for r in records):
        records.insert(0, baseline)     # its environment and numbers belong on the page too
    rep = report.build(records, generated=results.now(), baseline=baseline,
                       threshold=args.threshold, test=args.test,
                       capacity_profile=args.capacity_profile,
                       slo_answers=[a for r in records for a in slo.answer(r, spec)] if spec else ())
    _write(out["--output"], report.render(rep), "--output")
    print(f"wrote {args.output}: {len(records)} runs, {len(rep.plots)} plots", file=sys.stderr)
    if args.csv:
        buf = io.StringIO()
        n = report.write_csv(records, buf)
        _write(out["--csv"], buf.getvalue(), "--csv")
        print(f"wrote {args.csv}: {n} samples", file=sys.stderr)
    return 0


def cmd_export_csv(args: argparse.Namespace) -> int:
    from testbed.analysis import compare, report
    root = _results_root(args)
    out = _outputs((args.output, "--output"))
    _not_inputs(out, [compare.resolve(r, root) for r in args.runs])
    buf = io.StringIO()
    n = report.write_csv([compare.load(r, root) for r in args.runs], buf)
    _write(out["--output"], buf.getvalue(), "--output")
    print(f"{n} samples", file=sys.stderr)
    return 0


# --------------------------------------------------------------------------- capacity

def cmd_capacity(args: argparse.Namespace) -> int:
    from testbed.analysis import capacity, capacity_model, capacity_plan, compare
    if args.slo is not None:
        return _capacity_slo(args)
    if args.profile is None:
        raise capacity.CapacityError("--profile or --slo is required")
    rec = compare.load(args.run, _results_root(args))
    demand = capacity.parse_demand(args.profile)
    from testbed.analysis import costs
    cost = costs.plan(rec, kind=demand.kind, mtu=args.mtu, connections=args.connections)
    if capacity_model.has_pairs_data(rec):
        q = capacity_plan.plan(
            rec, demand, host_cores=args.host_cores, headroom=args.headroom,
            link_gbit=args.link_gbit, memory_reserve_mib=args.memory_reserve_mib,
            host_memory_mib=args.host_memory_mib, overcommit=args.overcommit,
            memory_mib=args.memory_mib, extrapolate=args.extrapolate, mtu=args.mtu,
            connections=args.connections)
        if args.json:
            print(json.dumps({**capacity_plan.to_dict(q, capacity.TCG_BANNER), "cost": costs.plan_dict(cost)},
                             indent=2, default=str))
        else:
            sys.stdout.write(capacity_plan.render_text(q, capacity.TCG_BANNER) + costs.render_plan(cost))
        if q.tcg:
            print(f"testbed capacity: {capacity.TCG_BANNER}", file=sys.stderr)
        return 0
    p = capacity.plan(rec, demand, host_cores=args.host_cores,
                      headroom=args.headroom,
                      link_gbit=10.0 if args.link_gbit is None else args.link_gbit, basis=args.basis,
                      mtu=args.mtu, connections=args.connections)
    if args.json:
        print(json.dumps({**capacity.to_dict(p), "note": capacity_plan.ONE_PAIR_NOTE,
                          "cost": costs.plan_dict(cost)}, indent=2, default=str))
    else:
        sys.stdout.write(capacity.render_text(p) + capacity_plan.ONE_PAIR_NOTE + "\n" + costs.render_plan(cost))
    if p.tcg:
        print(f"testbed capacity: {capacity.TCG_BANNER}", file=sys.stderr)
    return 0


def _capacity_slo(args: argparse.Namespace) -> int:
    """--slo: the largest N pairs meeting a service level (testbed.analysis.slo)."""
    from testbed.analysis import capacity, compare, slo
    spec = slo.parse(args.slo)              # bad text: exit 2 before the run is read
    rec = compare.load(args.run, _results_root(args))
    answers = slo.answer(rec, spec, host_cores=args.host_cores, mtu=args.mtu, connections=args.connections)
    if args.json:
        print(json.dumps([a.as_dict() for a in answers], indent=2, default=str))
    else:
        sys.stdout.write(slo.render_text(answers))
    if rec.environment.accelerator == "tcg":
        print(f"testbed capacity: {capacity.TCG_BANNER}", file=sys.stderr)
    return 0


# --------------------------------------------------------------------------- wiring

TESTS = ("auto", "welch", "permutation", "bootstrap", "mannwhitney")


def add_commands(subparsers: Any) -> None:
    """Register index, compare, history, report, capacity and export-csv on `testbed`'s subparsers."""
    i = cv.command(subparsers, "index", "add runs to the results index (SQLite or PostgreSQL)", """
        Every run is read and checked before the index is opened: a bad run adds nothing.
        `testbed run` indexes its own run; this is for runs copied from elsewhere.""")
    i.add_argument("runs", nargs="*", metavar=cv.RUN,
                   help="run directories or ids (default: every run under --results)")
    i.add_argument("--db", metavar=cv.DB,
                   help="SQLite file or postgresql:// URL (default: <results>/index.sqlite)")
    i.set_defaults(func=cmd_index)

    c = cv.command(subparsers, "compare", "compare NEW against BASE cell by cell: the nightly gate", """
        Per cell, a statistical test on the samples of both runs and a verdict (unchanged,
        improved, regressed, broken, insufficient, inconclusive); the false-discovery rate
        is controlled across all cells. Refused when the environments differ in a way that
        makes the figures incomparable (TCG against KVM, another CPU model, another host).
        With --variants A B, the two variants of one run are compared instead.""")
    c.add_argument("base", metavar="BASE", help="baseline run directory or id (with --variants: "
                                                "the run)")
    c.add_argument("new", metavar="NEW", nargs="?", help="new run directory or id")
    c.add_argument("--variants", nargs=2, metavar=("A", "B"),
                   help="compare variant B against variant A within one run")
    c.add_argument("--junit", metavar=cv.FILE, help="also write JUnit XML, one testcase per cell")
    c.add_argument("--fdr", type=_level, default=0.05, metavar="Q",
                   help="Benjamini-Hochberg false-discovery rate across all cells and deciding "
                        "metrics (default 0.05)")
    c.add_argument("--min-samples", type=integer(2, 10_000), default=5, metavar="N",
                   help="ok samples a side needed for a verdict (default 5)")
    c.add_argument("--json", action="store_true", help="machine-readable output")
    c.add_argument("--force", action="store_true",
                   help="compare despite a CPU model or attachment mismatch (never TCG vs KVM)")
    c.add_argument("--across-hosts", action="store_true",
                   help="compare runs measured on different hosts (machine ids); refused "
                        "without it, and said in the output with it")
    c.add_argument("--threshold", type=_fraction, default=0.05, metavar="F",
                   help="relative change that counts (default 0.05)")
    c.add_argument("--alpha", type=_level, default=0.05, metavar="F",
                   help="per-test significance level (default 0.05); the gate decides at --fdr")
    c.add_argument("--test", choices=TESTS, default="auto",
                   help="auto: Welch, or the permutation test where normality is doubtful (default)")
    c.set_defaults(func=cmd_compare)

    h = cv.command(subparsers, "history", "each cell's figure over the indexed runs, with change points", """
        Reads the results index (`testbed index`), per cell in run order; runs with
        incomparable environments start a new series. Change points: ruptures PELT,
        counted beyond --threshold. A lone worse newest run is printed as suspect.""")
    h.add_argument("--ack", metavar="CELL@RUN", type=text(420, "CELL@RUN"),
                   help="acknowledge the known change of CELL whose first bad run is RUN "
                        "(stored in <results>/history-acks.jsonl with --who and --why); it "
                        "no longer fails the job")
    h.add_argument("--by", metavar="host|class", default="host",
                   help="series: one per host (its machine id; the default) or one per host "
                        "class (the inventory's testbed_host_class, pooling its hosts)")
    h.add_argument("--who", metavar="NAME", type=text(200, "name"), help="--ack: who acknowledges")
    h.add_argument("--why", metavar="TEXT", type=text(1000, "reason"), help="--ack: why the change is accepted")
    h.add_argument("--db", metavar=cv.DB,
                   help="SQLite file or postgresql:// URL (default: <results>/index.sqlite)")
    h.add_argument("--cell", metavar="CELL", help="only this cell id")
    h.add_argument("--metric", metavar="METRIC",
                   help="metric (default: each cell's primary, throughput_mbps or "
                        "transactions_per_s, and its host CPU per packet, cost_ns_per_packet and "
                        "cost_host_ns_per_packet, where recorded); hops: a series per hop of each "
                        "traced cell")
    h.add_argument("--threshold", type=_fraction, default=0.05, metavar="F",
                   help="smallest relative step counted as a change (default 0.05)")
    h.add_argument("-o", "--output", metavar=cv.FILE, help="also write an HTML report with plots")
    h.add_argument("--json", action="store_true", help="machine-readable output")
    h.set_defaults(func=cmd_history)

    r = cv.command(subparsers, "report", "a self-contained HTML report (and CSV) of one or more runs", """
        The page opens with no network: its interactive plots carry their own code. Without
        -o, one run's report goes to its run folder (RUN/report.html, as `testbed run`
        writes it), several runs' to ./report.html.""")
    r.add_argument("runs", nargs="+", metavar=cv.RUN, help="run directories or ids")
    r.add_argument("-o", "--output", metavar=cv.FILE,
                   help="HTML file to write (default: RUN/report.html for one run, else ./report.html)")
    r.add_argument("--baseline", metavar=cv.RUN, help="compare every RUN with this run")
    r.add_argument("--csv", metavar=cv.FILE, help="also write every sample as CSV")
    r.add_argument("--threshold", type=_fraction, default=0.05, metavar="F",
                   help="with --baseline: relative change that counts (default 0.05)")
    r.add_argument("--test", choices=TESTS, default="auto",
                   help="with --baseline: the statistical test, as `testbed compare --test` (default auto)")
    r.add_argument("--slo", default=None, metavar="SLO",
                   help='plot a density run\'s figure against N pairs with this service level, '
                        'e.g. "p99.9<500us@5000tps" (see capacity --slo)')
    r.add_argument("--capacity-profile", metavar="SPEC", default=None,
                   help="add the capacity table at this per-VM profile (stream:2gbit, rr:5ktps)")
    r.set_defaults(func=cmd_report)

    k = cv.command(subparsers, "capacity", "how many VMs of a traffic profile fit on a host", """
        From a density run (1, 2, 4... pairs at once), a model of rate and CPU against the
        number of pairs gives the VMs per host per mode and what runs out first (CPU,
        memory, vCPUs or the link). From any other run, a one-pair estimate that says so.
        With --slo, the largest number of pairs at which every pair met a service level.""")
    k.add_argument("run", metavar=cv.RUN, type=path_ref(), help="a run directory or id (a density run with pairs, or any run)")
    k.add_argument("--slo", default=None, metavar="SLO",
                   help='a service level per pair, e.g. "p99.9<500us@5000tps" or "loss<0.1%%@2gbit": '
                        "the largest N pairs at which every pair met it, the first N that broke it")
    k.add_argument("--profile", default=None, metavar="SPEC",
                   help="per-VM traffic: stream:2gbit, stream:500mbit, rr:5000tps, rr:5ktps")
    k.add_argument("--headroom", type=_fraction, default=0.2, metavar="F",
                   help="fraction of cores and link kept free (default 0.2)")
    k.add_argument("--host-cores", type=number(0, 100_000, low_open=True), default=None, metavar="N",
                   help="cores on the planned host (default: the run's recorded cpus)")
    k.add_argument("--link-gbit", type=number(0, 1_000_000, low_open=True), default=None, metavar="G",
                   help="uplink capacity in Gbit/s (default: measured by the run, else 10)")
    k.add_argument("--basis", choices=("host", "qemu"), default="host",
                   help="CPU counted: host busy cores, or QEMU+vhost+ovs-vswitchd (default host)")
    k.add_argument("--mtu", type=integer(68, 65535), default=None, metavar="MTU",
                   help="only cells at this MTU")
    k.add_argument("--connections", type=integer(1, 100_000), default=None, metavar="N",
                   help="only cells with this many connections")
    k.add_argument("--memory-reserve-mib", type=number(0, 2**40), default=2048.0, metavar="MIB",
                   help="host memory kept for the host itself (default 2048)")
    k.add_argument("--host-memory-mib", type=number(0, 2**40, low_open=True), default=None, metavar="MIB",
                   help="memory of the planned host (default: the run's recorded memory)")
    k.add_argument("--memory-mib", type=integer(1, 2**30), default=None, metavar="MIB",
                   help="memory per planned VM (default: the run's largest guest)")
    k.add_argument("--overcommit", type=number(0, 1000, low_open=True), default=1.0, metavar="R",
                   help="vCPUs per host thread (default 1, no overcommit)")
    k.add_argument("--extrapolate", action="store_true",
                   help="allow answers beyond 2x the largest measured number of pairs")
    k.add_argument("--json", action="store_true", help="machine-readable output")
    k.set_defaults(func=cmd_capacity)

    e = cv.command(subparsers, "export-csv", "every sample of some runs as CSV", """
        One row per sample, failed and retried ones included with their status and reason.""")
    e.add_argument("runs", nargs="+", metavar=cv.RUN, help="run directories or ids")
    e.add_argument("-o", "--output", default="-", metavar=cv.FILE, help="CSV file to write (default: stdout)")
    e.set_defaults(func=cmd_export_csv)
