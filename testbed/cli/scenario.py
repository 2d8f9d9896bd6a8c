"""`testbed scenario list` / `testbed scenario run NAME [--hosts FILE] [--quick]`."""
from __future__ import annotations

import argparse
import sys


def cmd_scenario(args: argparse.Namespace) -> int:
    from testbed import scenarios
    if args.action == "list":
        for s in scenarios.SCENARIOS:
            print(f"{s.name:<16} {s.summary}")
        return 0
    if not args.name:
        from testbed.errors import ConfigError
        raise ConfigError("testbed scenario run", "NAME", "which scenario? see `testbed scenario list`")
    from testbed.records import store as _store
    _store.check_target(args.db)         # indexed at the end: a bad --db is known now
    run_dir, rep = scenarios.run(args.name, quick=args.quick, hosts_file=args.hosts,
                                 progress=lambda s: print(s, file=sys.stderr, flush=True))
    from testbed.records import store
    from testbed.scenarios import study
    with store.open(args.db) as st:
        for d in (run_dir, *(run_dir.parent / r for r in study.StudyReport.from_dict(rep).extra_runs)):
            st.index_run(d)
    sys.stdout.write(study.render_text(rep))
    print(run_dir)
    return 0


def add_command(sub: argparse._SubParsersAction) -> None:
    from testbed.cli import conventions as cv
    p = cv.command(sub, "scenario", "rerun one of the five public studies and print its table", """
        Each study (Linux bridge against OVS, chained OVS bridges, OVS performance,
        connecting namespaces, macvtap against OVS) is rebuilt from the testbed's own
        parts and prints the study's table with this host's figures beside the published
        ones. `testbed scenario list` names them.""")
    p.add_argument("action", choices=("list", "run"), help="list the scenarios, or run one")
    p.add_argument("name", nargs="?", metavar="NAME", help="scenario name (see `testbed scenario list`)")
    p.add_argument("--hosts", metavar=cv.TOPOLOGY, help="topology YAML whose hosts/guests the guest-based "
                   "parts use (default: this host)")
    p.add_argument("--quick", action="store_true",
                   help="a reduced version that runs on one TCG machine in minutes (CI)")
    p.add_argument("--db", metavar=cv.DB, help="results index: SQLite file or postgresql:// URL "
                                               "(default: <results>/index.sqlite)")
    p.set_defaults(func=cmd_scenario)
