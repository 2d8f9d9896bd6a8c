"""Extension points of the one cell loop: what runs over each sample's window, and what a
sample's record gains from it.

Every schedule of a run (sequential cells, interleaved variants, N pairs at once, a rate
search's trials, the gate's re-measured cells) takes its samples through
``sampling.sample``, and that function gives each :class:`SampleHook` of the run the same
three moments:

1. ``applies(window)``: whether the hook takes part in this sample at all (a tracer that
   interleaves traced and untraced samples answers by ``window.rep``; warm-ups are offered
   too, ``window.warmup`` says so);
2. ``window(window)``: a context manager entered just before the sample's CPU and counter
   readings and the tools' clients start, and left once they ended and were read (start and
   stop a tracer, a perf counter, a cost collector here): what the hook costs to start and
   stop (a tracer's compile and attach) stays outside the window the CPU and the noise
   guard are measured over, and what it costs while running is inside it;
3. ``finding(window, sample)``: after the tool, the host guard, the placement check, the
   CPU invariant and the wire cross-check passed, with the sample as it would be written
   (status ok): what the hook adds (:class:`Finding`): figures derived from the sample
   (``metrics``, added to the sample's metrics: cost per packet, say), data kept under
   ``extra[hook.name]``, or a ``failure`` that fails the sample with the reason
   ``"<hook.name>: <failure>"`` (a tracer that lost events, a cost that does not add up).

A noisy sample is judged after the hooks, so a retried sample gets their figures too. A
hook raising an exception is a bug, not a failed sample: it stops the run.

Hooks come from two places: the run's caller (``testbed.api.run(..., hooks=[...])``,
``runner.execute(hooks=...)``) and :data:`FACTORIES`, a registry of callables that look at
the topology and return a hook or None (one line each, for features that a topology field
switches on).
"""
from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from testbed.topology.model import Cell, Topology

if TYPE_CHECKING:
    from testbed.records.records import SampleRecord


@dataclass(frozen=True)
class SampleWindow:
    """One sample as the hooks see it: the cell, which repetition, whether a warm-up, the
    test paths measured at once (one, or one per pair), and the QEMU pids the CPU collectors
    read (guest name -> pid; empty for namespaces)."""

    cell: Cell
    rep: int
    warmup: bool
    paths: Sequence[Any]
    qemu_pids: Mapping[str, int] = field(default_factory=dict)
    #: which try of this rep it is (0, then 1, 2... for samples the noise guard retried)
    attempt: int = 0


@dataclass(frozen=True)
class Finding:
    """What a hook adds to one sample: derived figures, its own data, or a failure."""

    #: figures added to the sample's metrics (numbers only; a name the tool already gave is
    #: refused: a hook derives, it does not overwrite a measurement)
    metrics: Mapping[str, float] = field(default_factory=dict)
    #: kept under ``extra[<hook name>]`` of the sample
    data: Mapping[str, Any] = field(default_factory=dict)
    #: fails the sample with ``"<hook name>: <failure>"``
    failure: str | None = None


class SampleHook:
    """Base class of a per-sample hook; override what the hook needs (all do nothing)."""

    #: the key of its data in a sample's ``extra`` and the prefix of its failures
    name: str = "hook"

    def applies(self, window: SampleWindow) -> bool:
        return True

    @contextlib.contextmanager
    def window(self, window: SampleWindow) -> Iterator[None]:
        yield

    def finding(self, window: SampleWindow, sample: SampleRecord) -> Finding:
        return Finding()


def _cost(t: Topology) -> SampleHook:
    """Every sample's host CPU per packet by role (testbed.measure.costprobe.CostHook); by
    name, as the attachment modes are registered, since the hook's module builds on this one."""
    import importlib
    return importlib.import_module("testbed.measure.costprobe").CostHook()


#: callables that turn a topology into a hook of its runs (or None): one line per feature;
#: the cost per packet is here, other features append theirs from their own module
#: (testbed.measure.hops.hook: per-hop latency)
FACTORIES: list[Callable[[Topology], SampleHook | None]] = [_cost]


def for_topology(t: Topology, extra: Sequence[SampleHook] = ()) -> tuple[SampleHook, ...]:
    """The hooks of a run of ``t``: those the registry makes for it, then ``extra``."""
    made = [h for f in FACTORIES if (h := f(t)) is not None]
    return (*made, *extra)


def apply(findings: Sequence[tuple[SampleHook, Finding]], metrics: dict[str, float],
          extra: dict[str, Any]) -> str | None:
    """Pure: the hooks' findings folded into a sample's ``metrics`` and ``extra``; returns
    the first failure's reason, or None."""
    for hook, f in findings:
        clash = sorted(set(f.metrics) & set(metrics))
        if clash:
            return f"{hook.name}: would overwrite measured {', '.join(clash)}"
        bad = sorted(k for k, v in f.metrics.items() if isinstance(v, bool) or not isinstance(v, (int, float)))
        if bad:
            return f"{hook.name}: derived figures that are not numbers: {', '.join(bad)}"
        metrics.update(f.metrics)
        if f.data:
            extra[hook.name] = dict(f.data)
        if f.failure:
            return f"{hook.name}: {f.failure}"
    return None


__all__ = ["FACTORIES", "Finding", "SampleHook", "SampleWindow", "apply", "for_topology"]
