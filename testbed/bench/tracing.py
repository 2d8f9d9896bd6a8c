"""`testbed bench tracing`: what per-hop tracing costs on this host, and how much of that
cost any program on the same probes would pay.

One namespace pair over a Linux bridge, its request/response client and server pinned to
one CPU (the steadiest placement: docs/placement.md), measured in four arms interleaved
round by round, the order rotated so drift hits them alike:

- ``untraced``: nothing attached;
- ``probes``: the tracepoints the hop tracer attaches on this host, each with an empty
  program: what the kernel's tracepoint and BPF dispatch cost per hit, the floor under any
  program on those probes;
- ``hops``: the hop tracer itself, as a traced cell's samples run it (testbed.measure.hops);
- ``counted``: the same with BPF's run-time statistics counted, as in a traced cell's first
  sample: what counting them costs on top.

Each arm's cost is paired with the untraced sample of the same round. The counted arm's
statistics, read as the sample's window opens and closes, give BPF's nanoseconds per event
and its cores, and its probe hits set against the transactions the tool counted give the
hits per transaction: a second source for what the tracer saw (a probe that missed the
test's packets would show fewer hits than the path has points; other traffic on the host
shows as more, since every probe fires for every packet).
"""
from __future__ import annotations

import contextlib
import os
import statistics
import tempfile
from collections.abc import Callable, Iterator, Mapping, Sequence

from testbed.analysis import stats
from testbed.errors import CapabilityError
from testbed.host import bpftrace, tracefs
from testbed.measure import sampling as measure
from testbed.measure import testpaths, window
from testbed.measure.hops import bpfstats, parse, tracer
from testbed.measure.hops.plan import HOST
from testbed.topology.model import (
    Attachment,
    Backend,
    Cell,
    EndpointPins,
    HopSpec,
    NoiseAction,
    NoiseSpec,
    Pattern,
    Profile,
    Repetitions,
)

ARMS = ("untraced", "probes", "hops", "counted")
ATTACHMENT = Attachment("netns-bridge")


def floor_program(flavour: bpftrace.Flavour) -> str:
    """Pure: the probes a hop tracer of ``flavour`` attaches on a namespace path, each with
    an empty body (testbed's templates/tracing/hops.bt.j2 attaches the same ones)."""
    probes = [f"tracepoint:net:{flavour.xmit_event}", "tracepoint:net:netif_receive_skb"]
    if flavour.send_probe:
        probes += [flavour.send_probe, flavour.ready_probe, flavour.recv_probe]
    body = "\n".join(f"{p} {{ }}" for p in probes if p)
    return f'{body}\nBEGIN {{ printf("{parse.READY}\\n"); }}\nEND {{ printf("{parse.END}\\n"); }}\n'


def summarize(rounds: Sequence[Mapping[str, Mapping[str, float]]]) -> dict:
    """Pure: per arm its median transactions/s, its cost against the same round's untraced
    sample (the median of the rounds' paired costs, in percent), BPF's nanoseconds per
    event and cores, and probe hits per transaction. ``rounds``: per round, arm -> its
    figures (``tps``; for the counted arm also ``run_cnt``, ``run_time_ns`` and ``window_s``
    over the sample's window and the ``transactions`` the tool counted); an arm missing
    from a round (its sample failed) is left out of it."""
    out: dict = {}
    for arm in ARMS:
        got = [r[arm] for r in rounds if arm in r]
        row: dict = {"n": len(got), "tps": round(statistics.median(g["tps"] for g in got), 1) if got else None}
        if arm != "untraced":
            costs = [100.0 * (1.0 - r[arm]["tps"] / r["untraced"]["tps"])
                     for r in rounds if arm in r and "untraced" in r and r["untraced"]["tps"]]
            row["cost_pct"] = round(statistics.median(costs), 2) if costs else None
            per = [g for g in got if g.get("run_cnt")]
            row["bpf_ns_per_event"] = round(statistics.median(g["run_time_ns"] / g["run_cnt"] for g in per), 1) \
                if per else None
            row["bpf_cores"] = round(statistics.median(g["run_time_ns"] / 1e9 / g["window_s"] for g in per), 4) \
                if per else None
            hits = [g["run_cnt"] / g["transactions"] for g in per if g.get("transactions")]
            row["hits_per_transaction"] = round(statistics.median(hits), 2) if hits else None
        out[arm] = row
    floor, hops, counted = (out[a].get("cost_pct") for a in ("probes", "hops", "counted"))
    out["program_pct"] = None if floor is None or hops is None else round(hops - floor, 2)
    out["counting_pct"] = None if hops is None or counted is None else round(counted - hops, 2)
    return out


@contextlib.contextmanager
def _floor(flavour: bpftrace.Flavour, out_dir: str) -> Iterator[None]:
    t = tracer.HostTracer(floor_program(flavour), out_dir, name="tb-probes-host")
    try:
        t.start()
        yield
        t.stop()
    finally:
        t.kill()


@contextlib.contextmanager
def _hops(session, out_dir: str, live: dict, count: bool) -> Iterator[None]:  # noqa: ANN001 (hops.HopSession)
    with session.window(out_dir, count_bpf=count) as hops:
        if HOST not in hops.live:
            raise CapabilityError(f"bench tracing: the hop tracer did not start: {hops.results[HOST].reason}")
        live["pid"] = hops.live[HOST].bg.popen.pid
        yield


def _counting(live: dict, got: dict) -> Callable[[str, int, int], contextlib.AbstractContextManager]:
    """The window hook of the counted arm: the tracer's BPF statistics as the sample's
    window opens and closes, so what it counted is the tool's run's, not the set-up's."""
    import time

    @contextlib.contextmanager
    def on_window(cell_id: str, rep: int, attempt: int) -> Iterator[None]:
        a, t0 = bpfstats.of_process(live["pid"]), time.monotonic()
        yield
        b, t1 = bpfstats.of_process(live["pid"]), time.monotonic()
        got.update(run_cnt=b.run_cnt - a.run_cnt, run_time_ns=b.run_time_ns - a.run_time_ns, window_s=t1 - t0)
    return on_window


def run(rounds: int = 5, duration: int = 5, progress: Callable[[str], None] = lambda s: None) -> dict:
    from testbed.bench.netns import netns_bench
    from testbed.measure.hops.session import HopSession
    if os.geteuid() != 0:
        raise CapabilityError("bench tracing needs root: it creates namespaces and attaches BPF programs")
    flavour, found = bpftrace.host_flavour()
    if flavour is None:
        raise CapabilityError(f"bench tracing: this host cannot trace: {found}")
    cpu = max(os.sched_getaffinity(0))
    prof = Profile("tcp_rr", pattern=Pattern.RR, message_size=1, response_size=1, duration_s=duration)
    rule = stats.StoppingRule(Repetitions(warmup=0, min_samples=1, max_samples=1, rsd_target=0))
    figures: list[dict[str, dict[str, float]]] = []
    failures: list[str] = []
    with netns_bench(ATTACHMENT) as (tmp, writer, path), tracefs.available() as why:
        if why:
            raise CapabilityError(f"bench tracing: {why}")
        testpaths.pin_endpoints([(path.client.guest, path.server.guest)], EndpointPins((cpu,), (cpu,)))
        session = HopSession(Cell(ATTACHMENT, Backend.QEMU, 1500, 1, prof), path, HopSpec())
        session.prepare(None)
        for r in range(rounds):
            figs: dict[str, dict[str, float]] = {}
            for arm in ARMS[r % len(ARMS):] + ARMS[:r % len(ARMS)]:       # rotate who goes first
                got: dict = {}
                live: dict = {}
                out_dir = tempfile.mkdtemp(prefix=f"tb-{arm}-", dir=tmp)
                ctx = _floor(flavour, out_dir) if arm == "probes" else \
                    _hops(session, out_dir, live, arm == "counted") if arm in ("hops", "counted") else \
                    contextlib.nullcontext()
                watch = window.Watch(NoiseSpec(action=NoiseAction.KEEP),
                                     on_window=_counting(live, got) if arm == "counted" else None)
                with ctx:
                    [s] = measure.measure_cell(Cell(ATTACHMENT, Backend.QEMU, 1500, 1, prof,
                                                    context=(("variant", arm),)),
                                               path, writer, rule, r, {}, {}, watch=watch)
                if s.status != "ok":
                    failures.append(f"round {r + 1} {arm}: {s.reason}")
                    continue
                tps = s.metrics["transactions_per_s"]
                figs[arm] = {"tps": tps, "transactions": tps * duration, **got}
            figures.append(figs)
            progress(f"round {r + 1}/{rounds}: " + ", ".join(f"{a} {f['tps']:.0f}/s" for a, f in figs.items()))
    return {"rounds": rounds, "duration_s": duration, "cpu": cpu, "tracer": f"bpftrace {bpftrace.version(bpftrace.run_local)}",
            "probes": flavour.name, "program": floor_program(flavour).count("{ }"), "figures": figures,
            "summary": summarize(figures), "failures": failures, "run_dir": str(writer.dir)}


def main(rounds: int | None, duration: int | None = None) -> int:
    import sys
    r = run(rounds or 5, duration or 5, progress=lambda s: print(s, file=sys.stderr, flush=True))
    s = r["summary"]
    print(f"tracing bench: {ATTACHMENT}, 1-byte TCP_RR, {r['rounds']} rounds of {r['duration_s']} s, "
          f"client and server on CPU {r['cpu']}; {r['tracer']} ({r['probes']}: {r['program']} probes)")
    print(f"{'arm':<9} {'n':>2}  {'median tps':>11}  {'cost':>7}  {'BPF ns/event':>12}  {'BPF cores':>9}  "
          f"{'hits/transaction':>16}")

    def cell(v, fmt: str) -> str:  # noqa: ANN001
        return "-" if v is None else format(v, fmt)
    for arm in ARMS:
        row = s[arm]
        print(f"{arm:<9} {row['n']:>2}  {cell(row['tps'], '11.0f')}  {cell(row.get('cost_pct'), '6.2f') + ' %' if arm != 'untraced' else '      -':>7}  "
              f"{cell(row.get('bpf_ns_per_event'), '12.1f'):>12}  {cell(row.get('bpf_cores'), '9.4f'):>9}  "
              f"{cell(row.get('hits_per_transaction'), '16.2f'):>16}")
    if s["program_pct"] is not None:
        print(f"the probes alone (empty programs) cost {s['probes']['cost_pct']:.2f} % of transactions/s: no "
              f"program on these probes can cost less here; the hop program adds {s['program_pct']:.2f} %")
    if s["counting_pct"] is not None:
        print(f"counting BPF's run time adds {s['counting_pct']:.2f} % (a traced cell counts it in its first "
              "sample only)")
    for f in r["failures"]:
        print(f"failed: {f}")
    print(r["run_dir"])
    return 0 if not r["failures"] else 1
