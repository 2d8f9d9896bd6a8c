"""The sample loop's hook (testbed.measure.sampling.sample_paths): a traced cell's tracers
around its sample's window. Every other cell passes through untouched."""
from __future__ import annotations

import contextlib
from collections.abc import Iterator

from testbed.measure.hops.session import HopSession, SampleHops
from testbed.topology.model import Cell

#: the cells being traced now, by definition hash (testbed.measure.hops.interleave sets them)
ACTIVE: dict[str, HopSession] = {}


@contextlib.contextmanager
def window(cell: Cell) -> Iterator[SampleHops | None]:
    """Enter before the sample's CPU readings, leave after them; None for an untraced cell.
    Once the tool's figures are known, ``SampleHops.apply(metrics, extra)`` adds the hops."""
    session = ACTIVE.get(cell.hash)
    if session is None:
        yield None
        return
    with session.window() as hops:
        yield hops


__all__ = ["ACTIVE", "window"]
