"""A scenario's run: one normal run directory (run.json + samples.jsonl, so index, compare
and report work) for experiments the runner's matrix cannot express (chains, offloads,
nuttcp at a constant rate, packet rates, flow counts). Namespace-only: accelerator "none".
"""
from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from testbed.analysis import stats
from testbed.errors import CommandError, GuestError, TestbedError
from testbed.measure import sampling as measure
from testbed.measure import testpaths
from testbed.measure.session import Session as RunSession
from testbed.records import results
from testbed.records.records import CellOutcome, as_outcome
from testbed.topology.model import (
    Attachment,
    Backend,
    Cell,
    GuestSpec,
    HostSpec,
    Matrix,
    Offloads,
    Profile,
    Repetitions,
    Topology,
    TunnelSpec,
)

log = logging.getLogger(__name__)
ONE = Repetitions(min_samples=1, max_samples=1)
#: Studies B and D ran iperf, which writes 128 KiB per call; netperf gets the same write size.
#: With 16 KiB writes one stream here is limited by the per-call cost, not by the offloads.
IPERF_WRITE = 131072


def topology(name: str, attachments: Sequence[Attachment], profiles: Sequence[Profile],
             mtus: Sequence[int] = (1500,), connections: Sequence[int] = (1,)) -> Topology:
    """What run.json records as the run's topology: the scenario's axes."""
    return Topology(name=f"scenario-{name}", source="<scenario>", hosts=(HostSpec("local"),),
                    guests=(GuestSpec("ns-a", "local"), GuestSpec("ns-b", "local")),
                    client="ns-a", server="ns-b",
                    matrix=Matrix(attachments=tuple(dict.fromkeys(attachments)), backends=(Backend.QEMU,),
                                  mtus=tuple(mtus), connections=tuple(connections),
                                  profiles=tuple(profiles), repetitions=ONE))


def guests_topology(name: str, source: str, attachments: Sequence[Attachment], profiles: Sequence[Profile], *,
                    mtus: Sequence[int], connections: Sequence[int] = (1,), two_hosts: bool = False,
                    underlay_mtu: int = 1500, offloads: Offloads | None = None) -> Topology:
    """A guest-to-guest topology for the runner, built from the model's constructors (what
    the YAML loader would make of the same fields, defaults included): two guests g1 and g2
    on this host, or on two hosts h1 and h2 emulated on this machine joined by a tunnel
    whose underlay carries ``underlay_mtu``."""
    if two_hosts:
        hosts = (HostSpec("h1", transport="netns"), HostSpec("h2", transport="netns"))
        guests = (GuestSpec("g1", "h1"), GuestSpec("g2", "h2"))
    else:
        hosts = (HostSpec("local"),)
        guests = (GuestSpec("g1", "local"), GuestSpec("g2", "local"))
    return Topology(name=name, source=source, hosts=hosts, guests=guests, client="g1", server="g2",
                    matrix=Matrix(attachments=tuple(attachments), backends=(Backend.QEMU,),
                                  mtus=tuple(mtus), connections=tuple(connections),
                                  profiles=tuple(profiles), repetitions=Repetitions()),
                    offloads=offloads, tunnel=TunnelSpec(underlay_mtu=underlay_mtu))


@dataclass
class Session:
    writer: results.RunWriter
    tag: str
    state: Path
    env: Mapping[str, Any]
    progress: Callable[[str], None]
    rule: stats.StoppingRule = field(default_factory=lambda: stats.StoppingRule(ONE))

    @property
    def clock_ghz(self) -> float | None:
        mhz = self.env.get("cpu_mhz")
        return mhz / 1000 if mhz else None

    def out_dir(self, name: str) -> str:
        d = self.state / name
        d.mkdir(parents=True, exist_ok=True)
        return str(d)

    def measure(self, cell: Cell, conn: Any) -> CellOutcome:
        """One cell through the runner's measurement (tool + CPU over one window) across a
        namespace Connection. Returns the cell record (status, reason, summary)."""
        self.progress(f"  {cell.id}")
        try:
            with testpaths.connection_path(conn, self.out_dir("agents")) as path:
                measure.measure_cell(cell, path, self.writer, self.rule, 0, {}, {}, self.clock_ghz)
        except (TestbedError, CommandError, GuestError) as e:
            measure.fail_cell(cell, self.writer, str(e), {})
        return self.writer.cells[-1]

    def fail(self, cell: Cell, reason: str) -> CellOutcome:
        self.progress(f"  {cell.id}: {reason}")
        measure.fail_cell(cell, self.writer, reason, {})
        return self.writer.cells[-1]

    def record(self, cell: Cell, metrics: Mapping[str, float], *, started: str,
               extra: Mapping[str, Any] | None = None, raw: Sequence[str] = (),
               cpu: Mapping[str, Any] | None = None) -> CellOutcome:
        """A sample measured by a scenario's own experiment (one repetition)."""
        s = results.SampleRecord.new(self.writer.run_id, cell.as_dict(), 0, False, "ok", None, dict(metrics),
                                     dict(cpu or {}), started, results.now(), tuple(raw), {}, dict(extra or {}))
        self.writer.add_sample(s)
        summary = {k: {"n": 1, "mean": v, "median": v, "stddev": None, "ci95": [None, None]}
                   for k, v in metrics.items()}
        self.writer.add_cell(cell, "ok", None, None, summary)
        return self.writer.cells[-1]

    def raw(self, cell: Cell, name: str, text: str) -> str:
        p = self.writer.write_raw(cell.id, name, text)
        return str(p.relative_to(self.writer.dir))


@contextlib.contextmanager
def session(name: str, topo: Topology, quick: bool,
            progress: Callable[[str], None]) -> Iterator[Session]:
    # The run's session (testbed.measure.session): host lock, the leftovers check a dead run's tb-
    # objects would fail, owned state, environment and writer, as `testbed run` holds them.
    with RunSession(topo, keep_logs=False) as run:
        writer = run.open_run(None, extra={"scenario": name, "quick": quick})
        writer.update(scenario={"name": name, "quick": quick})
        progress(f"scenario {name}: run {run.run_id} (namespaces, accelerator none)")
        yield Session(writer, run.tag, run.state, run.env, progress)  # type: ignore[arg-type]


def summary_mean(cell_record: CellOutcome | Mapping[str, Any] | None, metric: str) -> float | None:
    """A cell's measured mean of one metric; None when the cell failed (never 0)."""
    c = as_outcome(cell_record)
    return None if c is None else c.summary_mean(metric)


def reason(cell_record: CellOutcome | Mapping[str, Any] | None) -> str:
    """Why a cell failed, or ''."""
    c = as_outcome(cell_record)
    return (c.reason if c is not None else None) or ""


@contextlib.contextmanager
def namespace(name: str) -> Iterator[str]:
    """One extra tb- namespace (e.g. for a private OVS), removed on exit: the host layer's
    (loopback up, IPv6 off, refused unless a tb- name)."""
    from testbed.host.net import ops
    with ops.namespace(name) as ns:
        yield ns.name


def placed(topo: Topology, hosts: Topology | None, *, two_hosts: bool) -> Topology:
    """``topo`` with the hosts and guests of a --hosts file, when that file places the client
    and server the way this part of the scenario needs (one host, or two); otherwise ``topo``
    as it is (this machine, or hosts emulated on it), so a two-host file never turns a
    one-host part into a cross-host one or the reverse. A two-host file brings its tunnel."""
    if hosts is None:
        return topo
    apart = hosts.guest(hosts.client).host != hosts.guest(hosts.server).host
    if apart != two_hosts:
        return topo
    import dataclasses
    return dataclasses.replace(topo, hosts=hosts.hosts, guests=hosts.guests, client=hosts.client,
                               server=hosts.server, accelerator=hosts.accelerator,
                               tunnel=hosts.tunnel if two_hosts else topo.tunnel)
