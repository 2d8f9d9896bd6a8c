"""A/B in one run: the `variants` matrix axis, measured interleaved.

Each variant (model.Variant: QEMU binary, machine type, guest image, NIC driver options)
gets its own guest pair, booted once (testbed.measure.run, the guests phase). Per attachment
mode, one host segment carries the NICs of every pair (the pairs never send at the same
time, so they share it without disturbing each other); per cell, the variants are the arms
of one step of the cell loop (sampling.measure): samples are taken in A B B A order (each
round reverses the one before: A B | B A | A B ...) until every variant's stopping rule is
satisfied, so a linear drift of the machine (thermal, neighbours, page cache) falls on both
variants alike, where A B A B would favour the variant measured first in each round. The
noise guard, host guard and placement check are the run's, as for any other schedule. The
order taken is the order of the lines in samples.jsonl. `testbed compare RUN --variants A B`
then compares them.

Two guest pairs alive at once rather than re-plugging one pair: re-plugging would need a
reboot to change the emulator, machine type or image, which is what is being compared.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from testbed.errors import CommandError
from testbed.host import proc
from testbed.measure.sampling import round_order
from testbed.topology.model import Attachment, Cell, GuestSpec, Topology, Variant

#: attachments a variant pair can share a segment on
SUPPORTED = (Attachment("bridge"), Attachment("ovs"))


def expand(cells: Sequence[Cell], variants: Sequence[Variant]) -> list[Cell]:
    """Each cell once per variant, adjacent, the variant in its context (and so its hash)."""
    return [dataclasses.replace(c, context=tuple(sorted((*c.context, ("variant", v.name),
                                                         ("variant.settings", v.label())))))
            for c in cells for v in variants]


def variant_of(cell: Cell) -> str:
    return dict(cell.context)["variant"]


def describe(variants: Sequence[Variant]) -> dict:
    """What run.json records per variant: its settings and its emulator's version line."""
    out = {}
    for v in variants:
        binary = v.emulator or "/usr/bin/qemu-system-x86_64"
        try:
            version = proc.run([binary, "--version"], timeout=20).stdout.splitlines()[0]
        except (CommandError, IndexError):
            version = None
        out[v.name] = {**dataclasses.asdict(v), "nic": dict(v.nic), "emulator_version": version,
                       "label": v.label()}
    return out


def guest_pairs(t: Topology) -> list[tuple[GuestSpec, GuestSpec]]:
    """One client/server pair per variant, each guest named <guest><variant>."""
    return [tuple(dataclasses.replace(spec, name=f"{spec.name}{v.name}")  # type: ignore[misc]
                  for spec in (t.guest(t.client), t.guest(t.server)))
            for v in t.matrix.variants]


def by_guest(t: Topology) -> dict[str, Variant]:
    """Guest name -> the variant it boots as."""
    return {g.name: v for v, pair in zip(t.matrix.variants, guest_pairs(t)) for g in pair}


__all__ = ["SUPPORTED", "by_guest", "describe", "expand", "guest_pairs", "round_order", "variant_of"]
