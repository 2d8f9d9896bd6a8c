"""A traced cell's twin: pure.

``expand`` puts a traced twin (context ``hops: traced``, id ``...-hops``) right after each
cell whose profile asks for hops; the twin has its own definition hash, so the untraced
cell stays the same test it was before tracing existed, and the two are one step of the
run's schedule (testbed.measure.hops.interleave).
"""
from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from testbed.topology.model import Cell


def traced(cell: Cell) -> bool:
    return dict(cell.context).get("hops") == "traced"


def untraced(cell: Cell) -> Cell:
    """The cell without its tracing: a twin's untraced self (a cell that is not a twin: itself)."""
    return dataclasses.replace(cell, context=tuple(kv for kv in cell.context if kv[0] != "hops"))


def expand(cells: Sequence[Cell]) -> list[Cell]:
    """Each cell whose profile asks for hops (one pair), followed by its traced twin."""
    out = []
    for c in cells:
        out.append(c)
        if c.profile.hops and c.pairs == 1 and not traced(c):
            out.append(dataclasses.replace(c, context=tuple(sorted((*c.context, ("hops", "traced"))))))
    return out


__all__ = ["expand", "traced", "untraced"]
