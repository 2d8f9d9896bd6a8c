"""`testbed fleet run|report`: one topology across an Ansible inventory (testbed.fleet).
Exit statuses: testbed.cli.exits ("fleet run", "fleet report").
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from testbed.cli.argtypes import integer, number, path_ref
from testbed.host import paths
from testbed.host.safeio import UserFileError


def _root() -> Path:
    return paths.results_dir()


def _say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def cmd_fleet_run(args: argparse.Namespace) -> int:
    from testbed.fleet import engine
    if args.retry_failed:
        if args.inventory or args.topology or args.limit or args.wheel:
            raise UserFileError("--retry-failed", "takes a fleet run alone: its inventory, "
                                                  "topology and testbed wheel are the run's")
        fleet = engine.retry(args.retry_failed, forks=args.forks, db=args.db, root=_root(), say=_say)
    else:
        if not args.inventory or not args.topology:
            raise UserFileError("fleet run", "needs INVENTORY and TOPOLOGY (or --retry-failed FLEETRUN)")
        fleet = engine.start(args.inventory, args.topology, limit=args.limit, forks=args.forks or 5,
                             db=args.db, root=_root(), wheel=args.wheel, say=_say)
    for h in fleet.hosts:
        print(f"{h.name}\t{h.status}\t{h.run_dir or '-'}\t{h.reason or ''}")
    print(fleet.dir)        # the last line stays the fleet run directory, for scripts
    return fleet.exit_status


def cmd_fleet_report(args: argparse.Namespace) -> int:
    from testbed.fleet import record, report
    report.check_z(args.z)
    demand = None
    if args.capacity_profile:
        from testbed.analysis import capacity
        try:
            demand = capacity.parse_demand(args.capacity_profile)
        except capacity.CapacityError as e:
            raise UserFileError("--capacity-profile", str(e).removeprefix("--profile ")) from None
    fleet = record.read(args.fleetrun, _root())
    rep = report.build(fleet, z_limit=args.z, demand=demand)
    sys.stdout.write(report.render_json(rep) if args.json else report.render_text(rep))
    return 0


def add_command(sub: Any) -> None:
    from testbed.cli import conventions as cv
    p = cv.command(sub, "fleet", "run a topology across an Ansible inventory of hypervisors; "
                                 "report the hosts side by side", """
        `fleet run` prepares every host of the inventory (packages, the testbed itself),
        runs the topology on each, fetches the runs and indexes them; `fleet report` puts
        the hosts side by side and names outliers within a host class.""")
    fs = cv.subcommands(p, "fleet_cmd")
    r = cv.command(fs, "run", "prepare every host, run the topology there, fetch and index the runs", """
        Each failed host is named with its reason on stderr and in the fleet run's
        fleet.json; `--retry-failed FLEETRUN` runs only those again. The inventory and the
        topology are checked before any host is touched.""", path="fleet run")
    r.add_argument("inventory", nargs="?", metavar="INVENTORY", type=path_ref("inventory"),
                   help="Ansible inventory (YAML or INI)")
    r.add_argument("topology", nargs="?", metavar=cv.TOPOLOGY, type=path_ref("topology file"),
                   help="topology YAML file")
    r.add_argument("--limit", metavar="PATTERN", help="Ansible host pattern: only these hosts")
    r.add_argument("--forks", type=integer(1, 1000), default=None, metavar="N",
                   help="hosts run at once (default 5)")
    r.add_argument("--db", metavar=cv.DB,
                   help="results index the runs go to: SQLite file or postgresql:// URL "
                        "(default: <results>/index.sqlite)")
    r.add_argument("--wheel", metavar=cv.FILE, type=path_ref("wheel"), help="the testbed wheel to deploy (default: built "
                                                    "from this testbed's source tree)")
    r.add_argument("--retry-failed", metavar="FLEETRUN", type=path_ref("fleet run"),
                   help="run the failed hosts of this fleet run again (a fleet directory or id)")
    r.set_defaults(func=cmd_fleet_run)
    k = cv.command(fs, "report", "hosts side by side: environment, each cell's figure, outliers "
                                 "within a host class", path="fleet report")
    k.add_argument("fleetrun", metavar="FLEETRUN", type=path_ref("fleet run"), help="a fleet run directory or id")
    k.add_argument("--z", type=number(0, 1e6, low_open=True), default=3.5, metavar="Z",
                   help="robust z-score (median/MAD within a class) beyond which a host is "
                        "an outlier (default 3.5)")
    k.add_argument("--capacity-profile", metavar="SPEC",
                   help="also plan capacity per host class for this traffic profile (as "
                        "`testbed capacity --profile`); a class plans by its weakest host")
    k.add_argument("--json", action="store_true", help="machine-readable output")
    k.set_defaults(func=cmd_fleet_report)
