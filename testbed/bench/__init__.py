"""Benchmarks that print figures (never timed tests, which flake on shared machines).

`testbed bench boot`: in the same run on the same machine, the floor (the same kernel
booted by QEMU with the same accelerator to a trivial init that powers off), the time from
domain start to "ready" for a cold boot of the project's guest, and the time from the
start of a restore from its cached snapshot to ready; and their ratios to the floor.
"""
from __future__ import annotations

import argparse
import contextlib
import statistics
import time
from pathlib import Path

from testbed.admin import capabilities
from testbed.attachments.ovs import namespaces as ovsns
from testbed.bench.netns import netns_bench
from testbed.errors import TestbedError
from testbed.guests import bootprofile, images, virt
from testbed.host import proc
from testbed.measure import transfer
from testbed.measure.session import Session
from testbed.records import results
from testbed.records.records import SampleRecord
from testbed.topology.config import default
from testbed.topology.model import GuestSpec


def boot(rounds: int) -> dict:
    """Floor, cold ready and restore ready, alternated in one run on one machine. Each round:
    the floor probe; a cold boot of the bench guest that (re)makes its snapshot; a restore
    from that snapshot."""
    img = images.ensure()
    assert img.kernel is not None
    accel = capabilities.choose_accelerator("auto", img.kernel)
    floors, colds, agents, restores, saves = [], [], [], [], []
    restore_steps: list[dict[str, float]] = []
    breakdowns: list[dict] = []
    spec = GuestSpec("bench", "local")
    # Held like a run (testbed.measure.session): lock, leftovers check, owned state; no results.
    with Session(default()) as ses:
        stack, run_id, tag, state = ses.stack, ses.run_id, ses.tag, ses.state
        conn = stack.enter_context(virt.connect("qemu:///system"))
        for i in range(rounds):
            # Alternate floor and guest so drift on a shared machine hits both alike.
            p = capabilities.probe_boot(img.kernel, accel)
            if not p.ok:
                raise TestbedError(f"floor probe failed: {p.reason}")
            floors.append(p.seconds)
            with virt.guest(conn, spec, img, accel, run_id, tag, state, snapshots="renew") as g:
                while not g.agent.ping():
                    time.sleep(0.1)
                agents.append(time.monotonic() - g.boot_started)
                colds.append(g.wait_ready(900))
                if g.snapshot_saved_s is None:
                    raise TestbedError(f"bench guest: no snapshot made ({g.boot_reason})")
                saves.append(g.snapshot_saved_s)
                # Where the cold boot's time went, from inside the guest (it runs on from its
                # new snapshot; systemd and cloud-init kept their account of the boot).
                breakdowns.append(bootprofile.collect(g.agent, g.boot_console or ""))
            with virt.guest(conn, spec, img, accel, run_id, tag, state) as g:
                restores.append(g.wait_ready(120))
                if g.boot != "restored":
                    raise TestbedError(f"bench guest was not restored: {g.boot_reason}")
                restore_steps.append(dict(g.steps))
    floor, cold, restore = (statistics.median(x) for x in (floors, colds, restores))
    return {"accelerator": accel.value, "rounds": rounds, "floor_s": round(floor, 2),
            "agent_s": round(statistics.median(agents), 2), "cold_s": round(cold, 2),
            "restore_s": round(restore, 2), "save_s": round(statistics.median(saves), 2),
            "cold_ratio": round(cold / floor, 1), "restore_ratio": round(restore / floor, 2),
            "cold_target": 4.0, "restore_target": 0.5,
            # the last round's, so it matches the image and machine state the ratios describe
            "breakdown": breakdowns[-1] if breakdowns else {},
            "restore_steps": {k: round(statistics.median(s.get(k, 0.0) for s in restore_steps), 3)
                              for k in virt.RESTORE_STEPS}}


MATRIX = """\
name: bench-matrix
guests: [{name: g1}, {name: g2}]
matrix:
  attachments: [ATTACHMENTS]
  mtus: [1500, 9000]
  connections: [1, 4]
  profiles:
    - {name: tcp_stream, pattern: stream, message_size: 16384, duration: 5}
    - {name: tcp_rr, pattern: rr, message_size: 1, response_size: 1, duration: 5}
"""


def matrix() -> dict:
    """A matrix of at least 24 cells over every mode this host supports: wall time of the
    measuring phase against the sum of measurement windows, and the number of boots."""
    from testbed import attachments
    from testbed.measure import runner
    from testbed.topology import config
    modes = attachments.supported_single_host()
    topo = config.parse(MATRIX.replace("ATTACHMENTS", ", ".join(m.value for m in modes)), "<bench matrix>")
    out = runner.execute(topo, progress=lambda s: None)
    run = results.read_run(out.run_dir)
    t = run.value_of("timing")
    return {"cells": len(run.cells), "modes": [m.value for m in modes], "boots": run.counts.boots,
            "measure_wall_s": t["measure_wall_s"], "sum_of_windows_s": t["sum_of_windows_s"],
            "ratio": round(t["measure_wall_s"] / t["sum_of_windows_s"], 3) if t["sum_of_windows_s"] else None,
            "failed": out.failed, "run_dir": str(out.run_dir)}


def chain_table(ns: tuple[int, ...] = (1, 2, 4, 8), duration_s: int = 3) -> list[dict]:
    """Study B: throughput through N chained OVS bridges joined by patch ports or by veth
    pairs, two namespaces as source and sink. One netperf TCP_STREAM per point."""
    import tempfile

    from testbed.topology.model import Pattern, Profile
    profile = Profile("tcp_stream", pattern=Pattern.STREAM, message_size=16384, duration_s=duration_s)
    rows = []
    with Session(default()) as ses, tempfile.TemporaryDirectory(prefix="tb-chain-") as out:
        for link in ovsns.ChainLink:
            for n in ns:
                with ovsns.ovs_chain(ses.tag, n, link) as conn:
                    t = transfer.netperf(conn, profile, out_dir=out)
                rows.append({"link": link.value, "bridges": n, "ok": t.result.ok,
                             "throughput_mbps": t.result.metrics.get("throughput_mbps"),
                             "reason": t.result.reason})
    return rows


def format_chain(rows: list[dict]) -> str:
    ns = sorted({r["bridges"] for r in rows})
    links = sorted({r["link"] for r in rows})
    cell = {(r["link"], r["bridges"]): r for r in rows}
    lines = ["bridges  " + "  ".join(f"{l + ' Mbit/s':>16}" for l in links)]
    for n in ns:
        vals = []
        for l in links:
            r = cell.get((l, n))
            vals.append(f"{r['throughput_mbps']:16.0f}" if r and r["ok"] else f"{'failed':>16}")
        lines.append(f"{n:>7}  " + "  ".join(vals))
    return "\n".join(lines)


BARE_PORT = 12866    # the hand-run netserver's port; the testbed's own uses netperf's default


def bare_netperf_argv(server_addr: str, duration_s: int, message_size: int) -> list[str]:
    """What someone measuring by hand would type: plain TCP_STREAM, one result line."""
    return ["netperf", "-H", server_addr, "-p", str(BARE_PORT), "-t", "TCP_STREAM",
            "-l", str(duration_s), "-P", "0", "--", "-m", str(message_size)]


def parse_bare(stdout: str) -> float | None:
    """Pure: the last field of netperf's classic result line (10^6 bits/s), or None."""
    for line in reversed(stdout.strip().splitlines()):
        parts = line.split()
        if len(parts) == 5:
            try:
                return float(parts[4])
            except ValueError:
                return None
    return None


def fidelity(rounds: int = 5, duration_s: int = 5, message_size: int = 16384) -> dict:
    """Harness fidelity: on one namespace veth pair, the throughput the testbed reports
    (its agent, servers, collectors, counters) against bare netperf typed by hand, the two
    alternating in the same run so drift on a shared machine hits both alike. Also the
    host collector's cost as a fraction of one core."""
    from testbed import attachments
    from testbed.measure import cpu
    from testbed.measure import sampling as measure
    from testbed.topology.model import Attachment, Backend, Cell, Pattern, Profile
    profile = Profile("tcp_stream", pattern=Pattern.STREAM, message_size=message_size, duration_s=duration_s)
    cell = Cell(Attachment("netns-veth"), Backend.QEMU, 1500, 1, profile)
    bare: list[float] = []
    harness: list[float] = []
    samples: list[SampleRecord] = []
    reasons: list[str] = []
    with contextlib.ExitStack() as stack:
        tmp, writer, path = stack.enter_context(netns_bench(Attachment("netns-veth")))
        client_ns = path.client.guest.agent.netns  # type: ignore[union-attr]
        server_ns = path.server.guest.agent.netns  # type: ignore[union-attr]
        server = stack.enter_context(proc.background(["netserver", "-D", "-p", str(BARE_PORT)], out_dir=tmp,
                                                     name="bare-netserver", netns=server_ns))
        transfer.wait_listening(server_ns, BARE_PORT, server)
        for i in range(rounds):
            # Alternate which goes first, so neither always inherits a warm or cold path.
            for who in (("bare", "harness") if i % 2 == 0 else ("harness", "bare")):
                if who == "bare":
                    res = proc.run(bare_netperf_argv(path.server.address, duration_s, message_size),
                                   netns=client_ns, timeout=duration_s + 60, check=False)
                    v = parse_bare(res.stdout) if res.rc == 0 else None
                    if v is None:
                        reasons.append(f"bare netperf: rc {res.rc}: {res.stderr.strip()[:200]}")
                    else:
                        bare.append(v)
                else:
                    smp = measure.measure_once(cell, path, writer, i, False, {}, {}, None)
                    samples.append(smp)
                    if smp.status == "ok":
                        harness.append(smp.metrics["throughput_mbps"])
                    else:
                        reasons.append(f"testbed: {smp.reason}")
    # The wire ratio through a bridge and an OVS bridge too, in the same run: one sample each.
    wire = {"veth": _wire_row(samples)}
    for att in (Attachment("netns-bridge"), Attachment("netns-ovs-veth")):
        why = attachments.unavailable(att)
        if why:
            wire[att.value] = {"unavailable": why}
            continue
        with netns_bench(att) as (_, writer, path):
            c = Cell(att, Backend.QEMU, 1500, 1, profile)
            wire[att.value] = _wire_row([measure.measure_once(c, path, writer, 0, False, {}, {}, None)])
    cost = cpu.collector_cost({})
    out = {"rounds": rounds, "duration_s": duration_s, "bare_mbps": bare, "testbed_mbps": harness,
           "failures": reasons,
           "collector_s_per_reading": round(cost, 6),
           # two readings (before and after) per window of duration_s
           "collector_fraction_of_core": round(2 * cost / duration_s, 6),
           "wire": wire, "coverage": _coverage(samples)}
    if bare and harness:
        mb, mh = statistics.median(bare), statistics.median(harness)
        out.update({"bare_median_mbps": round(mb, 1), "testbed_median_mbps": round(mh, 1),
                    "ratio": round(mh / mb, 3), "target_ratio": 0.97})
    return out


def _wire_row(samples: list[SampleRecord]) -> dict:
    """Median wire ratio (payload / wire bytes) of the samples that carry a cross-check,
    the expected ratio, and their verdicts."""
    checks = [s.crosscheck for s in samples if s.crosscheck.to_dict()]
    if not checks:
        return {"unavailable": "; ".join(s.reason or "" for s in samples) or "no samples"}
    return {"ratio": statistics.median(c.ratio for c in checks),
            "expected": statistics.median(c.expected_ratio for c in checks),
            "verdicts": [c.verdict for c in checks]}


def _coverage(samples: list[SampleRecord]) -> dict:
    """How much of the tool's interval the collectors covered (worst sample), and by how
    much their windows were longer (median)."""
    wins = [w for s in samples if (w := s.window) is not None and w.tool_s]
    if not wins:
        return {}
    out = {}
    for who in wins[0].coverage:
        cov = [w.coverage[who] for w in wins if w.coverage.get(who) is not None]
        exc = [w.excess_s[who] for w in wins if w.excess_s.get(who) is not None]
        if cov:
            out[who] = {"min_coverage": min(cov), "median_excess_s": round(statistics.median(exc), 3)}
    return out


BARE_IPERF3_PORT = 5301   # the hand-run iperf3 servers; the testbed's own use iperf3's default


def harness(ns: tuple[int, ...] = (1, 2, 4), rounds: int = 3, duration_s: int = 3) -> list[dict]:
    """Per-pair harness overhead: at each N, N namespace veth pairs; the aggregate
    the testbed reports for a cell with N pairs (testbed.measure.sampling: agents, servers, collectors,
    counters, skew check) against N bare iperf3 clients started by hand at once, the two
    alternating in the same run. One row per N: medians and their ratio."""
    import tempfile

    from testbed.measure import sampling as measure
    from testbed.measure import testpaths
    from testbed.tools import iperf3 as iperf3_tool
    from testbed.topology.config import default
    from testbed.topology.model import Attachment, Backend, Cell, Pattern, Profile, Tool
    profile = Profile("tcp_stream", tool=Tool("iperf3"), pattern=Pattern.STREAM, message_size=131072,
                      duration_s=duration_s)
    rows = []
    for n in ns:
        cell = Cell(Attachment("netns-veth"), Backend.QEMU, 1500, 1, profile, pairs=n)
        bare: list[float] = []
        tb: list[float] = []
        reasons: list[str] = []
        with contextlib.ExitStack() as stack:
            # Held like a run (testbed.measure.session): host lock, leftovers check, owned state.
            tmp = stack.enter_context(tempfile.TemporaryDirectory(prefix="tb-harness-"))
            ses = stack.enter_context(Session(default(), results_dir=Path(tmp), keep_logs=False))
            writer = ses.open_run(None)
            paths = stack.enter_context(testpaths.pair_paths(Attachment("netns-veth"), Backend.QEMU, ses.tag, default(),
                                                          None, n=n, max_mtu=1500,
                                                          workdir=ses.state / "netns"))
            nss = [(p.client.guest.agent.netns, p.server.guest.agent.netns, p.server.address)  # type: ignore[union-attr]
                   for p in paths]
            for i, (cns, sns, addr) in enumerate(nss):
                # -1 is not used: the bare servers serve every round, as someone would leave them
                srv = stack.enter_context(proc.background(["iperf3", "-s", "-p", str(BARE_IPERF3_PORT)],
                                                          out_dir=tmp, name=f"bare-iperf3-s{i}", netns=sns))
                transfer.wait_listening(sns, BARE_IPERF3_PORT, srv)
            for r in range(rounds):
                for who in (("bare", "testbed") if r % 2 == 0 else ("testbed", "bare")):
                    if who == "bare":
                        argv = ["iperf3", "-c", "ADDR", "-p", str(BARE_IPERF3_PORT), "-J", "-t", str(duration_s),
                                "-l", "131072"]
                        clients = [proc.start([a if a != "ADDR" else addr for a in argv], out_dir=tmp,
                                              name=f"bare-{r}-{i}", netns=cns)
                                   for i, (cns, _, addr) in enumerate(nss)]
                        total, ok = 0.0, True
                        for c in clients:
                            rc = c.wait(duration_s + 60)
                            res = iperf3_tool.parse(c.stdout(), c.stderr(), rc)
                            if not res.ok:
                                ok = False
                                reasons.append(f"bare iperf3: {res.reason}")
                            else:
                                total += res.metrics["throughput_mbps"]
                        if ok:
                            bare.append(total)
                    else:
                        smp = measure.sample_paths(cell, paths, writer, r, False, {}, {}, None)
                        if smp.status == "ok":
                            tb.append(smp.metrics["throughput_mbps"])
                        else:
                            reasons.append(f"testbed: {smp.reason}")
        row = {"pairs": n, "bare_mbps": bare, "testbed_mbps": tb, "failures": reasons}
        if bare and tb:
            mb, mt = statistics.median(bare), statistics.median(tb)
            row.update({"bare_median_mbps": round(mb, 1), "testbed_median_mbps": round(mt, 1),
                        "ratio": round(mt / mb, 3)})
        rows.append(row)
    return rows


#: the rate search's benchmark: a veth pair whose sender is shaped by tbf to this rate
NDR_LIMIT_MBIT = 20
#: the shaper's bucket and queue, bytes: a few frames each, so that what the queue absorbs over
#: a one-second trial (limit x 8 / rate) stays well inside the search's precision
NDR_BURST, NDR_QUEUE = 4 * 1514, 10 * 1514
#: MLRsearch's goal exceed ratio and duration sum for the benchmark: a load is a lower bound
#: when at most half of its trial seconds lost anything, over at least 4 s of trials (RFC
#: 9971's median goal, as CSIT runs it). On a shared, busy host the sender is now and then
#: descheduled for more than the 14 frames the shaper holds (~10 ms) and loses a few datagrams
#: at 99 % of the rate; with an exceed ratio of 0 that one trial made the load the upper bound
#: (the NDR was found at 76-89 % of the limit in busy test runs). The sum is counted with each
#: trial's overheads, so a 1 s trial counts ~1.3 s: one lossy trial (< 2 s) does not decide a
#: load, two do, and two clean ones make a lower bound. Above the limit every trial loses, so
#: the upper bound stays where the shaper is.
NDR_EXCEED_RATIO, NDR_DURATION_SUM_S = 0.5, 4


def ndr(limit_mbit: int = NDR_LIMIT_MBIT, precision: float = 0.05, trial_s: tuple[int, int] = (1, 1),
        message_size: int = 1472, lock: bool = True) -> dict:
    """Rate search on a namespace veth pair whose sending end is shaped by a tbf qdisc to a
    known rate: NDR and PDR found against the limit (as payload rates: the shaper counts
    whole frames), the trials, their wire verdicts and the wall time of the search."""
    from testbed.host.net import ops
    from testbed.measure import ratesearch, ratesearch_cell
    from testbed.topology.model import Attachment, Backend, Cell, Pattern, Profile, Protocol, RateSearch, Tool
    spec = RateSearch(trial_s=trial_s, precision=precision, min_rate_bps=limit_mbit * 10**6 // 20,
                      max_rate_bps=limit_mbit * 10**6 * 4, max_search_s=600, exceed_ratio=NDR_EXCEED_RATIO,
                      duration_sum_s=max(NDR_DURATION_SUM_S, 2 * trial_s[1]))
    profile = Profile("udp_ndr", tool=Tool("iperf3"), protocol=Protocol.UDP, pattern=Pattern.STREAM,
                      message_size=message_size, duration_s=trial_s[1], search=spec)
    cell = Cell(Attachment("netns-veth"), Backend.QEMU, 1500, 1, profile)
    with netns_bench(Attachment("netns-veth"), lock=lock) as (_, writer, path):
        links = ops.on(ops.netns_executor(path.client.guest.agent.netns))  # type: ignore[union-attr]
        links.shape(path.client.ifname, limit_mbit * 10**6, NDR_BURST, NDR_QUEUE)
        r = ratesearch_cell.measure_cell(cell, path, writer, {}, {})
        drops = links.qdisc_drops(path.client.ifname)
    if r is None:
        raise TestbedError("the rate search did not start (MTU check failed)")
    frame = ratesearch.frame_bytes(message_size, 1500)
    expected = limit_mbit * message_size / frame          # payload Mbit/s at the shaper's limit
    ndr_lo, pdr_lo = r.ndr.mbps(r.ndr.lower_pps), r.pdr.mbps(r.pdr.lower_pps)
    return {"limit_mbit": limit_mbit, "expected_payload_mbps": round(expected, 4), "precision": precision,
            "exceed_ratio": spec.exceed_ratio, "duration_sum_s": spec.duration_sum_s,
            "search": r.as_dict(), "stopped": r.stopped, "qdisc_drops": drops,
            "ndr_ratio": round(ndr_lo / expected, 4) if ndr_lo else None,
            "pdr_ratio": round(pdr_lo / expected, 4) if pdr_lo else None,
            "trials": [t.as_dict() for t in r.trials],
            "wire_verdicts": [t.wire.get("verdict") for t in r.trials]}


def main(what: str, args: argparse.Namespace) -> int:
    if what == "gate":
        from testbed.bench import gate_seq
        return gate_seq.main(args.rounds or gate_seq.NIGHTS, args.cells or gate_seq.CELLS, args.seed)
    if what == "cost":
        from testbed.bench import cost as bench_cost
        o = bench_cost.Options(rounds=args.rounds or max(bench_cost.Options.rounds, 2 * args.gate_samples),
                               duration_s=args.duration,
                               added=args.added, gate_samples=args.gate_samples, threshold=args.threshold,
                               rules=args.rules)
        o.check()       # options that disagree: exit 2 before anything is created
        return bench_cost.main(o)
    if what == "soak":
        from testbed.bench import soak as bench_soak
        return bench_soak.main(args.cells or 300)
    if what == "placement":
        from testbed.bench import placement as bench_placement
        return bench_placement.main(args.rounds)
    if what == "tracing":
        from testbed.bench import tracing as bench_tracing
        return bench_tracing.main(args.rounds, args.duration)
    if what == "ndr":
        r = ndr()
        s = r["search"]
        print(f"shaper               tbf {r['limit_mbit']} Mbit/s of frames = {r['expected_payload_mbps']:.3f} "
              f"Mbit/s of 1472-byte UDP payload (namespace veth pair, iperf3)")
        print(f"goals                exceed ratio {r['exceed_ratio']:g}, duration sum {r['duration_sum_s']} s "
              "(a load is a lower bound when at most that share of its trial seconds missed the goal)")
        for g in ("ndr", "pdr"):
            b = s[g]
            print(f"{g.upper()} (loss <= {b['loss_ratio']:g})  {b['lower_mbps']}..{b['upper_mbps']} Mbit/s  "
                  f"ratio to limit {r[g + '_ratio']}  (precision {r['precision']:g})")
        print(f"trials               {s['trials']} ({s['trial_seconds']:.1f} s of trials), wall {s['wall_s']:.1f} s")
        print(f"wire cross-check     {', '.join(sorted(set(map(str, r['wire_verdicts']))))} "
              f"on every trial; shaper dropped {r['qdisc_drops']} packets")
        if r["stopped"]:
            print(f"stopped: {r['stopped']}")
        return 0 if not r["stopped"] and r["ndr_ratio"] else 1
    if what == "density":
        from testbed.measure import density
        from testbed.measure import pairs as pairs_mod
        counts = density.parse_pairs(args.pairs)       # bad input: exit 2 before anything starts
        r = density.run(counts, window_s=pairs_mod.idle_window_s(), progress=lambda s: print(s, flush=True))
        print(f"accelerator {r['accelerator']}, {r['cores']} cores, guests of {r['memory_mib']} MiB; "
              f"up to {density.workers(2 * max(counts))} restores in flight")
        print(density.format_boot_line(r))
        print(density.format_table(r["one_pair_s"], r["rows"]))
        for row in r["rows"]:
            if row.get("steps"):
                print(f"  {row['pairs']} pairs, median per guest: "
                      + ", ".join(f"{k} {v:.2f} s" for k, v in row["steps"].items()))
        return 0 if all("ready_s" in row for row in r["rows"]) else 1
    if what == "harness":
        rows = harness(rounds=args.rounds or 3)
        print("pairs  bare iperf3 (Mbit/s, sum)  testbed (Mbit/s, aggregate)  ratio  (namespace veth pairs, "
              "alternating, medians)")
        for r in rows:
            if "ratio" in r:
                print(f"{r['pairs']:>5}  {r['bare_median_mbps']:>25.1f}  {r['testbed_median_mbps']:>27.1f}  "
                      f"{r['ratio']:.3f}")
            else:
                print(f"{r['pairs']:>5}  -  ({'; '.join(r['failures'])[:200]})")
            for reason in r["failures"]:
                print(f"       failed: {reason}")
        return 0 if all("ratio" in r and not r["failures"] for r in rows) else 1
    if what == "chain":
        rows = chain_table()
        print(format_chain(rows))
        for r in rows:
            if not r["ok"]:
                print(f"{r['link']} x{r['bridges']}: {r['reason']}")
        return 0 if all(r["ok"] for r in rows) else 1
    if what == "matrix":
        r = matrix()
        print(f"cells                {r['cells']} over {', '.join(r['modes'])}")
        print(f"guest boots          {r['boots']}  (target 2)")
        print(f"measuring wall time  {r['measure_wall_s']:.1f} s")
        print(f"sum of windows       {r['sum_of_windows_s']:.1f} s")
        print(f"ratio                {r['ratio']}  (target <= 1.15)")
        print(f"failed samples       {r['failed']}")
        print(r["run_dir"])
        return 0
    if what == "fidelity":
        r = fidelity(args.rounds or 5)
        print(f"rounds               {r['rounds']} x {r['duration_s']} s, alternating (namespace veth pair)")
        if "ratio" in r:
            print(f"bare netperf         {r['bare_median_mbps']:.1f} Mbit/s (median of {len(r['bare_mbps'])})")
            print(f"testbed              {r['testbed_median_mbps']:.1f} Mbit/s (median of {len(r['testbed_mbps'])})")
            print(f"ratio                {r['ratio']:.3f}  (target >= {r['target_ratio']})")
        print(f"collector cost       {r['collector_s_per_reading'] * 1e3:.2f} ms CPU per reading, "
              f"{r['collector_fraction_of_core'] * 100:.3f} % of one core  (target < 1 %)")
        for name, w in r["wire"].items():
            if "ratio" in w:
                print(f"wire ratio {name:<15} {w['ratio']:.4f}  (expected {w['expected']:.4f}; "
                      f"{', '.join(w['verdicts'])})")
            else:
                print(f"wire ratio {name:<15} -  ({w['unavailable']})")
        for who, c in r["coverage"].items():
            print(f"window {who:<13} covers {c['min_coverage']:.1%} of the tool's interval (worst), "
                  f"{c['median_excess_s']:.3f} s longer (median)")
        for reason in r["failures"]:
            print(f"failed: {reason}")
        return 0 if "ratio" in r and not r["failures"] else 1
    if what == "boot":
        r = boot(args.rounds or 1)
        print(f"accelerator          {r['accelerator']} ({r['rounds']} round(s), medians)")
        print(f"floor (kernel->init) {r['floor_s']:.2f} s")
        print(f"cold: agent answers  {r['agent_s']:.2f} s")
        print(f"cold ready           {r['cold_s']:.2f} s  (agent + cloud-init final)")
        print(f"snapshot saved in    {r['save_s']:.2f} s")
        print(f"restore ready        {r['restore_s']:.2f} s  (restore to agent answering, clock set, boot checked)")
        print("  " + ", ".join(f"{k} {v:.2f} s" for k, v in r["restore_steps"].items()))
        print(f"ratio cold/floor     {r['cold_ratio']:.1f}x  (target <= {r['cold_target']:.0f}x)")
        print(f"ratio restore/floor  {r['restore_ratio']:.2f}x  (target <= {r['restore_target']})")
        b = r["breakdown"]
        print(f"cold boot breakdown (last round, read in the guest; system {b.get('system_state') or '?'}):")
        for line in bootprofile.format_breakdown(b):
            print(line)
        k = (b.get("systemd") or {}).get("kernel_s")
        if k is not None:
            print(f"  kernel + initrd       {k:.2f} s = {k / r['floor_s']:.1f}x the floor; userspace "
                  f"{b['systemd'].get('userspace_s', 0) / r['floor_s']:.1f}x the floor")
        for reason in b.get("failed", []):
            print(f"  failed: {reason}")
        return 0
    return 2
