"""What the cells of one run share (:class:`Context`) and what one arm of a schedule is
(:class:`Arm`): the cell loop (``sampling.measure``) takes both, so that every schedule,
sequential, interleaved variants, N pairs, a rate search and the gate's re-measured cells,
is judged by the same noise guard, host guard, placement check, cross-checks and hooks.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from testbed.analysis import stats
from testbed.measure import window
from testbed.measure.hooks import SampleHook
from testbed.topology.model import Cell, Repetitions

if TYPE_CHECKING:
    from testbed.records.results import RunWriter


@dataclass
class Context:
    """One run's shared state for its cells.

    ``watch`` is the run's noise guard and pin check (one per run: its retry budget is reset
    per cell); ``qemu_pids`` the QEMU of every local guest (the CPU collectors' host side);
    ``placement`` guest -> host for the records; ``rule`` and ``warmup`` the topology's
    repetitions, ``rules`` per cell hash a rule that replaces it (the sequential gate's
    second stage: exactly N more samples); ``hooks`` run over every sample's window
    (testbed.measure.hooks)."""

    writer: RunWriter
    watch: window.Watch = field(default_factory=window.Watch)
    qemu_pids: Mapping[str, int] = field(default_factory=dict)
    placement: Mapping[str, str] = field(default_factory=dict)
    clock_ghz: float | None = None
    rule: stats.StoppingRule = field(default_factory=lambda: stats.StoppingRule(Repetitions()))
    warmup: int = 0
    rules: Mapping[str, stats.StoppingRule] = field(default_factory=dict)
    hooks: Sequence[SampleHook] = ()
    progress: Callable[[str], None] = field(default=lambda s: None)

    def rule_for(self, cell: Cell) -> stats.StoppingRule:
        return self.rules.get(cell.hash, self.rule)


@dataclass(frozen=True)
class Arm:
    """One cell on its test paths, as a schedule measures it: ``paths`` (the first
    ``cell.pairs`` are measured at once), ``qemu_pids`` the QEMUs its CPU record names
    (None: the context's), ``by_pair`` how its samples are recorded (None: as the cell says,
    pairs.by_pair)."""

    cell: Cell
    paths: Sequence[Any]
    qemu_pids: Mapping[str, int] | None = None
    by_pair: bool | None = None

    def pids(self, ctx: Context) -> Mapping[str, int]:
        return ctx.qemu_pids if self.qemu_pids is None else self.qemu_pids


__all__ = ["Arm", "Context"]
