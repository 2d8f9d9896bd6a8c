"""`testbed bench placement`: the same cells with both guests' vCPUs pinned apart (one host
CPU each), pinned together (both on one CPU) and unpinned, in one run on one guest pair,
the three interleaved round by round so drift on a shared machine hits them alike. Each
sample verifies its pins (testbed.measure.window); the figure per placement is the spread of each
metric over its repetitions (relative standard deviation), reported as the ratio to the
unpinned spread: pinning should narrow it (ratio below 1).

The run directory holds every sample (cell ids carry the placement as their variant:
``-vapart``, ``-vtogether``, ``-vunpinned``), with the noise guard's figure per sample
(kept, marked: retrying would break the interleaving)."""
from __future__ import annotations

import os
import statistics
from collections.abc import Callable

from testbed import attachments
from testbed.admin import capabilities
from testbed.analysis import stats
from testbed.errors import CapabilityError
from testbed.guests import images, virt
from testbed.host import placement
from testbed.measure import sampling as measure
from testbed.measure import testpaths, window
from testbed.measure.session import Session
from testbed.topology.config import default
from testbed.topology.model import (
    Attachment,
    Backend,
    Cell,
    GuestSpec,
    NoiseAction,
    NoiseSpec,
    Pattern,
    Placement,
    Profile,
    Repetitions,
)

PROFILES = (Profile("tcp_rr", pattern=Pattern.RR, message_size=1, response_size=1, duration_s=3),
            Profile("tcp_stream", pattern=Pattern.STREAM, message_size=16384, duration_s=3))
ORDER = ("apart", "together", "unpinned")


def placements(cpus: list[int]) -> dict[str, dict[str, Placement]]:
    a, b = cpus[0], cpus[1]
    return {"apart": {"g1": Placement(vcpus=((a,),)), "g2": Placement(vcpus=((b,),))},
            "together": {"g1": Placement(vcpus=((b,),)), "g2": Placement(vcpus=((b,),))},
            "unpinned": {"g1": Placement(), "g2": Placement()}}


def spread(values: list[float]) -> float | None:
    """Relative standard deviation (sample stddev / mean); None under two values."""
    if len(values) < 2 or not statistics.mean(values):
        return None
    return statistics.stdev(values) / statistics.mean(values)


def summarize(values: dict[str, dict[str, list[float]]]) -> list[dict]:
    """Pure: per profile and placement, n, median, spread and the spread's ratio to the
    unpinned one."""
    rows = []
    for prof, by in values.items():
        base = spread(by.get("unpinned", []))
        for name in ORDER:
            v = by.get(name, [])
            sp = spread(v)
            rows.append({"profile": prof, "placement": name, "n": len(v),
                         "median": round(statistics.median(v), 2) if v else None,
                         "rsd": None if sp is None else round(sp, 4),
                         "rsd_ratio": None if sp is None or not base else round(sp / base, 3)})
    return rows


def run(rounds: int = 5, progress: Callable[[str], None] = lambda s: None) -> dict:
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        raise CapabilityError(f"bench placement needs two host CPUs to pin apart; this process may use {cpus}")
    why = attachments.unavailable(Attachment("bridge"))
    if why:
        raise CapabilityError(f"bench placement measures on the bridge attachment: {why}")
    img = images.ensure()
    accel = capabilities.choose_accelerator("auto", img.kernel)
    sets = placements(cpus)
    values: dict[str, dict[str, list[float]]] = {p.name: {n: [] for n in ORDER} for p in PROFILES}
    failures: list[str] = []
    noisy = 0
    with Session(default()) as ses:
        stack = ses.stack
        writer = ses.open_run(accel, image=img)
        conn = stack.enter_context(virt.connect("qemu:///system"))
        guests = {n: stack.enter_context(virt.guest(conn, GuestSpec(n, "local"), img, accel, ses.run_id, ses.tag,
                                                    ses.state)) for n in ("g1", "g2")}
        for g in guests.values():
            g.wait_ready(900)
            progress(f"guest {g.name} ready ({g.boot})")
        pids = {n: virt.qemu_pid(g) for n, g in guests.items()}
        path = stack.enter_context(testpaths.mode(Attachment("bridge"), Backend.QEMU, ses.tag, guests["g1"],
                                               guests["g2"], default().subnet, 1500))
        stack.callback(lambda: [placement.apply_live(g.dom, pids[n], Placement())
                                for n, g in guests.items() if g.dom.isActive()])
        rule = stats.StoppingRule(Repetitions())
        for r in range(rounds):
            for k, name in enumerate(ORDER[r % 3:] + ORDER[:r % 3]):      # rotate who goes first
                for n, g in guests.items():
                    placement.apply_live(g.dom, pids[n], sets[name][n])
                watch = window.Watch(NoiseSpec(action=NoiseAction.KEEP), sets[name])
                for prof in PROFILES:
                    cell = Cell(Attachment("bridge"), Backend.QEMU, 1500, 1, prof,
                                context=(("variant", name),))
                    [s] = measure.measure_cell(cell, path, writer, rule, 0, pids, {"g1": "local", "g2": "local"},
                                               watch=watch)
                    metric = measure.primary_metric(prof)
                    if s.status == "ok":
                        values[prof.name][name].append(s.metrics[metric])
                        noisy += s.noisy
                    else:
                        failures.append(f"round {r + 1} {name} {prof.name}: {s.reason}")
            progress(f"round {r + 1}/{rounds} done")
    return {"accelerator": accel.value, "rounds": rounds, "cpus": cpus, "rows": summarize(values),
            "failures": failures, "noisy_kept": noisy, "run_dir": str(writer.dir)}


def main(rounds: int | None) -> int:
    import sys
    r = run(rounds or 5, progress=lambda s: print(s, file=sys.stderr, flush=True))
    print(f"placement bench: {r['rounds']} rounds, accelerator {r['accelerator']}, host CPUs "
          f"{r['cpus']}; apart: g1 vCPU on CPU {r['cpus'][0]}, g2 on {r['cpus'][1]}; together: both on "
          f"{r['cpus'][1]}; pins verified per sample")
    print(f"{'profile':<11} {'placement':<9} {'n':>2}  {'median':>10}  {'spread (rsd)':>12}  {'vs unpinned':>11}")
    for row in r["rows"]:
        rsd = "-" if row["rsd"] is None else f"{row['rsd']:.1%}"
        ratio = "-" if row["rsd_ratio"] is None else f"{row['rsd_ratio']:.2f}x"
        med = "-" if row["median"] is None else f"{row['median']:.1f}"
        print(f"{row['profile']:<11} {row['placement']:<9} {row['n']:>2}  {med:>10}  {rsd:>12}  {ratio:>11}")
    print(f"samples measured while the host was busy with other work (kept, marked): {r['noisy_kept']}")
    for f in r["failures"]:
        print(f"failed: {f}")
    print(r["run_dir"])
    return 0 if not r["failures"] else 1
