"""One test per cell of the team's matrix (conftest.py), per attachment mode chosen with
--attach. Each measures the cell once into the session's run record and asserts what was
measured: the sample succeeded (the tool ran, and the wire's counters and the host's CPU
accounting agreed with it), and, on a KVM host, the floors the team expects."""
from __future__ import annotations

from testbed.analysis import stats
from testbed.guests import virt
from testbed.measure import sampling as measure
from testbed.topology.model import Accelerator, Cell, Repetitions

# The team's floors per profile (primary metric, at least), checked on KVM hosts only:
# figures measured under TCG (no usable KVM) are functional checks, not performance.
FLOORS = {"tcp_stream": 5000.0,         # Mbit/s
          "tcp_rr": 10000.0}            # transactions/s
ONE_SAMPLE = stats.StoppingRule(Repetitions())   # warm-up 0, one sample: a smoke test per cell


def _check(cell: Cell, s, accelerator) -> None:
    assert s.status == "ok", s.reason
    metric = measure.primary_metric(cell.profile)
    assert s.metrics[metric] > 0, s.metrics
    assert s.metrics["latency_p99_us"] >= s.metrics["latency_p50_us"] > 0, s.metrics
    if accelerator is Accelerator.KVM and cell.profile.name in FLOORS:
        assert s.metrics[metric] >= FLOORS[cell.profile.name], (metric, s.metrics[metric])


def test_guests(guest_cell: Cell, guest_path, guest_pair, run_writer) -> None:
    gp = guest_pair
    pids = {g.spec.name: virt.qemu_pid(g) for g in (gp.client, gp.server)}   # CPU per guest
    [s] = measure.measure_cell(guest_cell, guest_path, run_writer, ONE_SAMPLE, 0, pids,
                               {g.spec.name: "local" for g in (gp.client, gp.server)})
    _check(guest_cell, s, gp.accelerator)
    assert s.cpu.guest[gp.client.spec.name]["busy"] > 0      # the client guest did the work


def test_namespaces(ns_cell: Cell, ns_path, run_writer) -> None:
    [s] = measure.measure_cell(ns_cell, ns_path, run_writer, ONE_SAMPLE, 0, {}, {})
    _check(ns_cell, s, None)
