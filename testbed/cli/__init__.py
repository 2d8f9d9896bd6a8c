"""The `testbed` command: a thin front that maps errors to exit statuses and one-line messages.
The statuses are testbed.errors.ExitStatus; which command returns which is testbed.cli.exits.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import signal
import sys
from collections.abc import Sequence
from pathlib import Path

from testbed import __version__
from testbed.cli.argtypes import counts, integer, number, path_ref
from testbed.errors import ExitStatus, TestbedError, one_line


class Interrupted(BaseException):
    """SIGTERM, raised like Ctrl-C so every context manager tears down on the way out."""


def _on_signal(signum: int, _frame: object) -> None:
    # Further signals are ignored while teardown runs; a second Ctrl-C must not leave
    # half-removed objects behind. `testbed cleanup` is the way out of a stuck teardown.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if signum == signal.SIGINT:
        raise KeyboardInterrupt
    raise Interrupted(f"signal {signum}")


def cmd_run(args: argparse.Namespace) -> int:
    from testbed.topology import config
    # Validated in full here, before runner.execute takes the host lock: bad input is exit 2
    # even while another run holds the host. The runner (scipy, libvirt: 0.7 s of imports)
    # is imported after, so a bad file is refused at once.
    if args.topology:
        topo = config.load(args.topology)
    else:
        from testbed import attachments
        topo = config.default(attachments.supported_single_host())
    if args.accelerator:
        import dataclasses
        topo = dataclasses.replace(topo, accelerator=args.accelerator)
    from testbed.records import store
    store.check_target(args.db)          # the run is indexed at its end: a bad --db is known now
    resume = None
    if args.resume:
        from testbed.analysis import compare
        from testbed.records import results
        resume = compare.resolve(args.resume)
        rec = results.read_run(resume)       # a bad or foreign run is exit 2 before any work
        want, have = results._comparable(results.topology_dict(topo)), results._comparable(rec.topology)
        if want != have:
            keys = sorted(k for k in set(want) | set(have) if want.get(k) != have.get(k))
            raise config.ConfigError(str(args.topology or "<builtin default>"), "(topology)",
                                     f"differs from the one run {rec.run_id} was planned from "
                                     f"({', '.join(keys)}); --resume measures the same matrix")
    gate_options = (("--junit", args.junit, "the gate's verdicts are what it writes"),
                    ("--budget", args.seq_budget, "it bounds the gate's extra samples"),
                    ("--extra", args.seq_extra, "it sets the gate's extra samples"),
                    ("--fdr", args.seq_fdr, "it sets the gate's level"),
                    ("--threshold", args.seq_threshold, "it sets the gate's threshold"),
                    ("--spending", args.seq_spending, "it sets the gate's looks"))
    for opt, given, why in gate_options:
        if given is not None and not args.decide_against:
            from testbed.host.safeio import UserFileError
            raise UserFileError(opt, f"needs --decide-against ({why}; without it the option would be dropped)")
    if args.decide_against:
        return _run_decided(args, topo, resume)
    from testbed import api
    out = api.run(topo, progress=lambda s: print(s, file=sys.stderr, flush=True), resume=resume, index=False)
    # Every run is indexed in the results store (SQLite beside the results by default).
    api.index_run(out.run_dir, args.db)
    from testbed.analysis import report
    from testbed.records import results
    rec = results.read_run(out.run_dir)
    # the same words as the report's summary: retried samples are not failures
    print(report.status_line(rec), file=sys.stderr)
    if (advice := report.noise_advice(rec)):
        print(f"noisy host: {advice}", file=sys.stderr)
    html = report.write_run_report(rec, results.now())
    if (why := config.not_gateable(topo)):
        print(f"NOT GATEABLE: {why}", file=sys.stderr)
    print(html)
    print(out.run_dir)      # the last line stays the run directory, for scripts
    return 0 if out.failed == 0 else 1


def _run_decided(args: argparse.Namespace, topo, resume) -> int:
    """`testbed run --decide-against BASE`: the run, then the sequential gate (look 1, the
    undecided and regressed cells measured again, look 2); the exit status is the gate's."""
    from testbed.analysis import compare
    from testbed.measure import decide
    from testbed.records import results, store
    if resume is not None:
        raise decide.NotDecidable("--decide-against: not with --resume (look 1 needs the whole run as it was "
                                  "measured in one go)")
    if topo.matrix.variants:
        base = args.decide_against          # A/B in one run: the baseline variant's name
        decide.check(topo, base)
    else:
        base = compare.resolve(args.decide_against)
        results.read_run(base)              # a bad BASE is exit 2 before any work
    try:
        design = decide.design_from_args(args)
    except ValueError as e:
        raise decide.NotDecidable(f"--decide-against: {e}") from None
    from testbed.host import safeio
    junit = safeio.check_outputs(((args.junit, "--junit"),))["--junit"] if args.junit else None
    d = decide.run(topo, base, design, progress=lambda s: print(s, file=sys.stderr, flush=True))
    with store.open(args.db) as st:
        st.index_run(d.run_dir)
    if junit is not None:
        safeio.write_output(junit, compare.render_junit(d.sequential.final), "--junit")
    print(d.text, end="")
    print(d.run_dir)      # the last line stays the run directory, for scripts
    return d.exit_status


def cmd_validate(args: argparse.Namespace) -> int:
    from testbed.topology import config
    topo = config.load(args.topology)
    # imported after the file is read: a bad one is refused at once
    from testbed import api
    cells = api.plan(topo)
    print(f"{args.topology}: ok ({len(topo.guests)} guests, {len(cells)} cells)")
    return 0


def cmd_doctor(args: argparse.Namespace) -> int:
    from testbed.admin import doctor
    rep = doctor.doctor()
    d = rep.as_dict()
    if args.json:
        print(json.dumps(d, indent=2))
    else:
        def line(name: str, item: dict) -> str:
            return f"{name:<10} {'yes' if item['ok'] else 'no ':<4} {item['detail']}"
        print(line("kvm", d["kvm"]))
        print(line("tcg", d["tcg"]))
        print(f"{'accel':<10} {d['accelerator'] or 'none'}")
        print(line("vhost-net", d["vhost_net"]))
        for name, fact in rep.host.items():        # what the modes depend on, in their words
            print(line(name, dataclasses.asdict(fact)) if not isinstance(fact, str) else f"{name:<10} {fact}")
        for name, item in d["attachments"].items():
            print(f"{'mode':<10} {name:<19} {'yes' if item['ok'] else 'no ':<4} {item['detail']}")
        for k, v in d["versions"].items():
            print(f"{k:<10} {v or 'not installed'}")
        tools = d.get("guest_tools")
        print(f"{'guest':<10} image {d.get('guest_image')}: " + (
            ", ".join(f"{k} {v or '(version not reported)'}" for k, v in tools.items())
            if tools is not None else "tools not recorded (image built before they were)"))
    return 0 if rep.accelerator else 1


def cmd_image(args: argparse.Namespace) -> int:
    from testbed.guests import images
    img = images.ensure(images.load_recipe(args.recipe))
    print(f"{img.name}-{img.digest}: {img.disk.parent}")
    for k, v in (img.tools or {}).items():
        print(f"  {k} {v or '(version not reported)'}")
    return 0


def cmd_cleanup(args: argparse.Namespace) -> int:
    from testbed.topology import config
    if not config.URI_RE.fullmatch(args.uri or ""):
        from testbed.host.safeio import UserFileError
        raise UserFileError("--uri", f"{args.uri!r} is not a libvirt URI such as qemu:///system")
    from testbed.admin import cleanup
    from testbed.host import remote
    from testbed.topology import config
    # The topology naming remote hosts is read first: a bad file removes nothing anywhere.
    remotes = [h for h in config.load(args.hosts).hosts if h.remote] if args.hosts else []
    rc = _clean("this host", lambda: cleanup.find(args.uri), lambda f: cleanup.remove(f, args.uri))
    # The remote hosts of a topology are cleaned too (over ssh and their libvirt).
    for h in remotes:
        sh = remote.shell(h)
        rc |= _clean(f"host {h.name}", lambda: cleanup.find_on(sh, h.uri),
                     lambda f: cleanup.remove_on(sh, f, h.uri))
    return rc


def _clean(label: str, find, remove) -> int:
    """Find, remove, look again: 0 when nothing is left on that host."""
    found = find()
    if found.empty():
        print(f"{label}: nothing to clean up")
        return 0
    print(f"{label}: removing: {found.describe()}")
    remove(found)
    left = find()
    if not left.empty():
        print(f"{label}: still present: {left.describe()}", file=sys.stderr)
        return 1
    return 0


def cmd_cache(args: argparse.Namespace) -> int:
    """Images and guest snapshots under the cache folder. prune removes snapshots (all, or
    with --stale those that can no longer be restored: of an image no longer current, or of
    an earlier build of one), images other than the current recipe's, and partial snapshots
    whose writer died."""
    import shutil
    import time

    from testbed.guests import guestcache, images
    from testbed.host import paths
    snaps = guestcache.all_snapshots()
    imgs = images.cached_images()
    # each current image's build: a snapshot saved on another build of it (or before the
    # snapshot key named builds) is never restored again (the key differs), so it is stale
    builds = {p.name.rsplit("-", 1)[-1]: images.build_of(p / images.DISK) for p, st in imgs if st == "current"}

    def stale(s: guestcache.Snapshot) -> str:
        if s.key.image_digest not in builds:
            return "stale: its image is no longer current"
        return "" if s.key.image_build == builds[s.key.image_digest] else "stale: an earlier build of its image"
    if args.action == "list":
        print(f"cache: {paths.cache_dir()}")
        for p, current in imgs:
            size = sum(f.stat().st_size for f in p.iterdir() if f.is_file())
            print(f"image     {p.name:<40} {size / 2**20:8.0f} MiB  {current}")
        for s in snaps:
            age = time.strftime("%Y-%m-%d %H:%M", time.gmtime(s.created))
            print(f"snapshot  {s.folder.name:<40} {s.size_bytes() / 2**20:8.0f} MiB  "
                  f"{s.key.memory_mib} MiB x {s.key.vcpus} vCPU, {s.key.accelerator}, image {s.key.image_digest}, {age}"
                  + (f"  ({why})" if (why := stale(s)) else ""))
        for p in guestcache.partial():
            print(f"partial   {p.name}")
        return 0
    # The cache is shared by every checkout and run on this host: what a domain runs on now
    # (its disk's backing chain names the folder) stays.
    in_use = _domain_xml_text()
    removed = 0
    for s in snaps:
        if str(s.folder) in in_use:
            print(f"kept snapshot {s.folder.name}: in use by a running domain")
            continue
        if not args.stale or stale(s):
            guestcache.remove(s)
            print(f"removed snapshot {s.folder.name}")
            removed += 1
    for p in guestcache.partial():
        if guestcache.writer_dead(p):
            shutil.rmtree(p, ignore_errors=True)
            print(f"removed partial {p.name}")
            removed += 1
    if args.images:
        for p, st in imgs:
            if st == "stale" and str(p) in in_use:
                print(f"kept image {p.name}: in use by a running domain")
            elif st == "stale":
                shutil.rmtree(p, ignore_errors=True)
                print(f"removed image {p.name}")
                removed += 1
    print(f"{removed} removed")
    return 0


def _domain_xml_text() -> str:
    """What running guests use, from two sources: libvirt's domain XML (when libvirt-python is
    installed and the daemon answers) and every QEMU process's command line (always readable
    as root). Either alone can miss a domain: an unprivileged user cannot reach the system
    daemon, and a package install without libvirt-python has no binding at all."""
    import psutil
    texts = []
    for p in psutil.process_iter(["name", "cmdline"]):
        if "qemu" in (p.info["name"] or ""):
            texts.append(" ".join(p.info["cmdline"] or ()))
    try:
        import libvirt
    except ImportError:
        return "\n".join(texts)
    try:
        conn = libvirt.open("qemu:///system")
    except libvirt.libvirtError:
        return "\n".join(texts)
    try:
        texts.extend(d.XMLDesc(0) for d in conn.listAllDomains())
    finally:
        conn.close()
    return "\n".join(texts)


#: which benchmark takes which numeric option (an option it ignores is refused, not dropped)
BENCH_OPTIONS = {"--rounds": ("boot", "fidelity", "placement", "gate", "harness", "cost", "tracing"),
                 "--pairs": ("density",), "--cells": ("soak", "gate"), "--seed": ("gate",),
                 "--added": ("cost",), "--rules": ("cost",), "--gate-samples": ("cost",),
                 "--threshold": ("cost",), "--duration": ("cost", "tracing")}
#: the defaults of the options only some benchmarks take, set once none was refused
BENCH_DEFAULTS = {"added": 0.05, "gate_samples": 40, "threshold": 0.05, "duration": 5}


def cmd_bench(args: argparse.Namespace) -> int:
    from testbed import bench
    from testbed.host.safeio import UserFileError
    for opt, takers in BENCH_OPTIONS.items():
        if getattr(args, opt[2:].replace("-", "_")) is not None and args.what not in takers:
            raise UserFileError(opt, f"bench {args.what} takes no {opt} (it is for: {', '.join(takers)})")
    for name, value in BENCH_DEFAULTS.items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    args.pairs = "1,2,4,8" if args.pairs is None else args.pairs
    args.seed = 0 if args.seed is None else args.seed
    return bench.main(args.what, args)


DESCRIPTION = """\
Measure VM-to-VM networking on a KVM host: boot guests, attach their NICs one way after
another (Linux bridge, Open vSwitch, macvtap, VXLAN across two hosts; vhost-net or userspace
virtio), drive netperf, uperf or iperf3 between them, and record throughput, transactions/s,
latency and the CPU each costs, every figure cross-checked.

Start with `testbed run` (the built-in topology), then `testbed report RUN`. For a nightly
gate: `testbed compare BASE NEW`. For capacity planning: `testbed capacity RUN --profile
SPEC`. `testbed COMMAND --help` describes each command."""


def parser() -> argparse.ArgumentParser:
    from testbed.cli import conventions as cv
    from testbed.cli import exits
    from testbed.cli.argtypes import OneLineParser
    p = OneLineParser(prog="testbed", description=DESCRIPTION, epilog=exits.epilog(""),
                      formatter_class=cv.Formatter)
    p.add_argument("--version", action="version", version=f"testbed {__version__}",
                   help="print the version and exit")
    cv.add_global_options(p)
    sub = cv.subcommands(p, "cmd")
    r = cv.command(sub, "run", "measure a topology's matrix (default: the built-in topology)", """
        Plans the topology's cells, sets up each attachment mode, measures every cell and
        writes the run folder (run.json, samples.jsonl, the tools' raw output and
        report.html). Progress goes to stderr; stdout ends with the report's path and, as
        the last line, the run folder. A sample measured while the host was busy with
        other work is measured again ("retried"), never counted as failed.""")
    r.add_argument("topology", nargs="?", metavar=cv.TOPOLOGY,
                   help="topology YAML file (default: the built-in topology)")
    r.add_argument("--accelerator", choices=("auto", "kvm", "tcg"),
                   help="override the topology's accelerator (auto: kvm if a stock kernel boots under it)")
    r.add_argument("--resume", metavar=cv.RUN, type=path_ref(), help="go on with an interrupted run (a run "
                   "directory or id) of the same topology: finished cells are kept, the rest measured")
    r.add_argument("--db", metavar=cv.DB, help="results index the run goes to: SQLite file or "
                   "postgresql:// URL (default: <results>/index.sqlite)")
    g = r.add_argument_group("nightly gate (sequential design; see the gate's statistics in the docs)")
    g.add_argument("--decide-against", metavar="BASE", help="compare the run with BASE (a run "
                   "directory or id; pooled with the nights before it that the gate accepted), measure "
                   "the cells left undecided again (and a regressed cell, to confirm it), and exit with the gate's status (0 pass, 1 fail, 5 "
                   "undecided); for a topology with two matrix.variants, BASE names the baseline variant "
                   "(A/B in one run: the night's drift falls on both)")
    g.add_argument("--budget", dest="seq_budget", type=integer(0, 1_000_000), metavar="N",
                   help="most extra samples over all cells (default: --extra x half the cells)")
    g.add_argument("--extra", dest="seq_extra", type=integer(1, 1000), metavar="N",
                   help="extra NEW samples per cell measured again (default 10)")
    g.add_argument("--junit", metavar="FILE", help="with --decide-against: write the final verdicts "
                   "as JUnit XML (one testcase per cell and per night shift)")
    g.add_argument("--fdr", dest="seq_fdr", type=number(0.0, 0.5, low_open=True), metavar="Q",
                   help="the design's false-discovery level over both looks; it bounds the share "
                        "of unchanged nights with a false regression (default 0.03)")
    g.add_argument("--threshold", dest="seq_threshold", type=number(0.0, 0.5, low_open=True),
                   metavar="F", help="the change that matters, as a fraction (default 0.05): unchanged "
                   "only within it, regressed only credibly beyond it; on a host whose unchanged cells "
                   "move by more between runs, the gate leaves them undecided at 0.05")
    g.add_argument("--spending", dest="seq_spending", choices=("obrien-fleming", "pocock"),
                   help="alpha-spending function for the two looks (default obrien-fleming)")
    r.set_defaults(func=cmd_run)
    v = cv.command(sub, "validate", "check a topology file without creating anything", """
        Reads the file, checks every field and plans its cells; prints the number of guests
        and cells. Touches nothing on the host.""")
    v.add_argument("topology", metavar=cv.TOPOLOGY, help="topology YAML file")
    v.set_defaults(func=cmd_validate)
    d = cv.command(sub, "doctor", "what this host can do, each item found by trying it", """
        KVM and TCG by booting the guest image's kernel to a trivial init; vhost-net by
        opening /dev/vhost-net; each attachment mode by its own check; the versions of
        QEMU, libvirt, OVS and the traffic tools.""")
    d.add_argument("--json", action="store_true", help="machine-readable output")
    d.set_defaults(func=cmd_doctor)
    c = cv.command(sub, "cleanup", "remove tb- objects left by a dead run, and nothing else", """
        Removes domains, bridges, taps, namespaces, OVS bridges and state folders named
        tb-... whose run is no longer alive. Never touches an object without the prefix or
        one that a live run owns.""")
    c.add_argument("--uri", default="qemu:///system", metavar="URI",
                   help="libvirt URI of this host (default: qemu:///system)")
    c.add_argument("--hosts", metavar=cv.TOPOLOGY, help="also clean the topology's remote (ssh) hosts")
    c.set_defaults(func=cmd_cleanup)
    i = cv.command(sub, "image", "build (or find cached) a guest image from a recipe", """
        Images are cached under a hash of their recipe: a second call finds the first's.""")
    i.add_argument("recipe", nargs="?", metavar="RECIPE",
                   help="a recipe name under images/ or a recipe folder (default: $TESTBED_IMAGE, else debian12)")
    i.set_defaults(func=cmd_image)
    k = cv.command(sub, "cache", "show or remove cached images and guest snapshots", """
        `prune` removes snapshots (all, or with --stale those that can no longer be restored: of
        an image no longer current, or of an earlier build of one)
        and partial ones whose writer died; never what a running guest uses.""")
    k.add_argument("action", choices=("list", "prune"), help="list the cache, or remove from it")
    k.add_argument("--stale", action="store_true", help="prune: only snapshots that can no longer be restored "
                                                          "(of an image no longer current, or of an earlier build of one)")
    k.add_argument("--images", action="store_true", help="prune: also images other than the current recipe's")
    k.set_defaults(func=cmd_cache)
    b = cv.command(sub, "bench", "benchmarks that print figures", """
        Each benchmark measures in one run, on this host, the figures it compares, and
        prints them with their ratios. See the benchmarks page of the docs.""")
    b.add_argument("what", choices=("boot", "matrix", "chain", "fidelity", "harness", "placement", "ndr",
                                    "density", "gate", "soak", "cost", "tracing"), help="which benchmark")
    b.add_argument("--rounds", type=integer(1, 1000), metavar="N",
                   help="boot: rounds (default 1); fidelity: alternations (default 5); "
                        "placement: rounds of apart/together/unpinned (default 5); "
                        "tracing: rounds of untraced/probes/hops (default 5); "
                        "gate: simulated nights per scenario (default 6); cost: samples a variant (default 80, or twice --gate-samples)")
    b.add_argument("--seed", type=integer(0, 2**31 - 1), default=None, metavar="N",
                   help="gate: the seed of the simulated nights (default 0)")
    b.add_argument("--pairs", default=None, type=counts(1, 256, 16), metavar="N,N,...",
                   help="density: pair counts to bring up together (default 1,2,4,8)")
    b.add_argument("--cells", type=integer(1, 100000), default=None, metavar="N",
                   help="soak: namespace cells to measure (default 300); gate: cells a simulated "
                        "night (default 100, at least 20)")
    from testbed.cli.argtypes import fraction
    bc = b.add_argument_group("cost (a known per-packet cost added on B; see the cost page of the docs)")
    bc.add_argument("--added", type=number(0.0, 1.0, low_open=True), default=None, metavar="F",
                    help="cost: the per-packet cost added on B, as a fraction of A's (default 0.05)")
    bc.add_argument("--rules", type=integer(1, 100_000), default=None, metavar="N",
                    help="cost: nftables rules on B's taps instead of as many as make --added")
    bc.add_argument("--gate-samples", type=integer(2, 100), default=None, metavar="N",
                    help="cost: samples a side of each gate (default 40: what a 5 %% cost needs on a "
                         "TCG guest; the bench also prints what smaller gates reach)")
    bc.add_argument("--threshold", type=fraction, default=None, metavar="F",
                    help="cost: the gate's threshold (default 0.05, as `testbed compare`)")
    bc.add_argument("--duration", type=integer(2, 600), default=None, metavar="S",
                    help="cost, tracing: seconds a sample (default 5)")
    b.set_defaults(func=cmd_bench)
    from testbed.cli import results as cli_results
    cli_results.add_commands(sub)
    from testbed.cli import scenario as cli_scenario
    cli_scenario.add_command(sub)
    from testbed.cli import fleet as cli_fleet
    cli_fleet.add_command(sub)
    return p


def _check_environment() -> None:
    """Folders a user names through the environment are input too: checked before any work."""
    from testbed.host import safeio
    for name in ("TESTBED_RESULTS", "TESTBED_STATE", "TESTBED_CACHE"):
        safeio.check_dir_variable(name, os.environ.get(name))
    safeio.check_flag_variable("TESTBED_SHARED_HOST", os.environ.get("TESTBED_SHARED_HOST"))


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        if args.results_root is not None:
            from testbed.host import safeio
            safeio.check_dir_variable("--results", args.results_root)
        _check_environment()
    except TestbedError as e:
        print(f"testbed: {one_line(str(e), 2000)}", file=sys.stderr)
        return e.exit_status
    if args.results_root:
        # Through the environment, so child processes (scenario parts, test helpers) agree.
        os.environ["TESTBED_RESULTS"] = str(Path(args.results_root).absolute())
    if args.shared_host:
        os.environ["TESTBED_SHARED_HOST"] = "1"
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.WARNING,
                        format="%(levelname)s %(name)s: %(message)s")
    signal.signal(signal.SIGTERM, _on_signal)
    signal.signal(signal.SIGINT, _on_signal)
    try:
        return args.func(args)
    except TestbedError as e:
        # Bad input, a missing capability and a busy host are one line whatever the input held;
        # other errors may carry the console's last lines.
        text = one_line(str(e), 2000) if e.exit_status in (2, 3, 4) else str(e)
        print(f"testbed: {text}", file=sys.stderr)
        return e.exit_status
    except (KeyboardInterrupt, Interrupted):
        print("testbed: interrupted; everything created was torn down", file=sys.stderr)
        return ExitStatus.INTERRUPTED


if __name__ == "__main__":
    sys.exit(main())
