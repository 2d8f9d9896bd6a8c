"""A/B in one run: the `variants` matrix axis, measured interleaved.

Each variant (model.Variant: QEMU binary, machine type, guest image, NIC driver options)
gets its own guest pair, booted once. Per attachment mode, one host segment carries the
NICs of every pair (the pairs never send at the same time, so they share it without
disturbing each other); per cell, samples are taken in A B B A order (each round reverses
the one before: A B | B A | A B ...) until every variant's stopping rule is satisfied, so a
linear drift of the machine (thermal, neighbours, page cache) falls on both variants alike,
where A B A B would favour the variant measured first in each round. The order taken is
the order of the lines in samples.jsonl. `testbed compare RUN --variants A B` then compares them.

Two guest pairs alive at once rather than re-plugging one pair: re-plugging would need a
reboot to change the emulator, machine type or image, which is what is being compared.
"""
from __future__ import annotations

import contextlib
import dataclasses
import itertools
import os
import tempfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TypeVar

from testbed.analysis import stats
from testbed.errors import CommandError, GuestError, ReadinessError, TestbedError
from testbed.guests import images, virt
from testbed.host import proc
from testbed.measure import sampling as measure
from testbed.records import results
from testbed.topology.model import Attachment, Backend, Cell, Topology, Variant

T = TypeVar("T")

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


@dataclasses.dataclass(frozen=True)
class Pair:
    variant: Variant
    client: virt.Guest
    server: virt.Guest


def boot(stack: contextlib.ExitStack, conn: object, t: Topology, recipe_image: images.Image,
         accel: object, run_id: str, tag: str, state: object,
         count_boot: Callable[[], None]) -> list[Pair]:
    """One guest pair per variant, each guest named <guest><variant>; all of them booted or
    restored in parallel (and destroyed so), up to the host's cores."""
    cms = []
    for v in t.matrix.variants:
        for spec in (t.guest(t.client), t.guest(t.server)):
            vspec = dataclasses.replace(spec, name=f"{spec.name}{v.name}")
            img = (images.user_image(v.image) if v.image else
                   images.user_image(spec.image) if spec.image else recipe_image)
            cms.append(virt.guest(conn, vspec, img, accel, run_id, tag, state,  # type: ignore[arg-type]
                                  emulator=v.emulator, machine=v.machine))
    booted = virt.enter_parallel(stack, cms, os.cpu_count() or 1)
    for _ in booted:
        count_boot()
    return [Pair(v, booted[2 * i], booted[2 * i + 1]) for i, v in enumerate(t.matrix.variants)]


@contextlib.contextmanager
def mode(attachment: Attachment, backend: Backend, tag: str, pairs: Sequence[Pair], subnet: str,
         max_mtu: int, *, queues: int = 1, offloads: object = None, topology: Topology | None = None,
         workdir: object = None) -> Iterator[dict[str, measure.TestPath]]:
    """One fabric with a NIC hot-plugged into every guest of every pair (testpaths.plug, each
    pair with its variant's NIC options); a TestPath per variant."""
    from testbed.measure import testpaths
    from testbed.topology import config
    t = dataclasses.replace(topology or config.default(), subnet=subnet)
    with contextlib.ExitStack() as stack:
        wd = workdir or stack.enter_context(tempfile.TemporaryDirectory(prefix="tb-"))
        fab = stack.enter_context(testpaths.fabric(attachment, tag, t, max_mtu, wd, offloads))  # type: ignore[arg-type]
        paths = stack.enter_context(testpaths.plug(
            fab, [(p.client, p.server) for p in pairs], tag=tag, subnet=subnet, backend=backend,
            max_mtu=max_mtu, queues=queues, offloads=offloads,  # type: ignore[arg-type]
            nic_options=[dict(p.variant.nic) for p in pairs]))
        yield {p.variant.name: path for p, path in zip(pairs, paths)}


def round_order(items: Sequence[T], rnd: int) -> list[T]:
    """Round ``rnd``'s order: as given on even rounds, reversed on odd ones, so consecutive
    rounds read A B B A (a counterbalanced design: linear drift cancels in the mean)."""
    return list(items) if rnd % 2 == 0 else list(reversed(items))


def measure_interleaved(cells: Sequence[Cell], paths: Mapping[str, measure.TestPath],
                        writer: results.RunWriter, rule: stats.StoppingRule, warmup: int,
                        pids: Mapping[str, Mapping[str, int]], placement: Mapping[str, str],
                        clock_ghz: float | None) -> None:
    """The variants of one cell (``cells``, one per variant), sampled A B A B ...: warm-ups
    first (alternating too), then one measured sample of each variant per round, until
    each variant's stopping rule is met (a variant that is done sits its turns out)."""
    live: list[Cell] = []
    for c in cells:
        path = paths[variant_of(c)]
        try:
            measure.set_mtu(path, c.mtu)
            why = measure.check_mtu(path, c.mtu)
        except (CommandError, GuestError, TestbedError) as e:
            why = f"could not set MTU {c.mtu}: {e}"
        if why:
            measure.fail_cell(c, writer, why, placement)
        else:
            live.append(c)
    for w in range(warmup):
        for c in live:
            v = variant_of(c)
            writer.add_sample(measure.measure_once(c, paths[v], writer, w, True, pids[v],
                                                   placement, clock_ghz))
    counted = {c: measure.CellSamples(c, rule) for c in live}
    active = list(live)
    rnd = 0
    while active:
        for c in round_order(list(active), rnd):
            v = variant_of(c)
            s = measure.measure_once(c, paths[v], writer, len(counted[c].samples), False, pids[v],
                                     placement, clock_ghz)
            writer.add_sample(s)
            if not counted[c].add(s):
                active.remove(c)
        rnd += 1
    for c in live:
        counted[c].finish(writer)


def run(t: Topology, cells: Sequence[Cell], stack: contextlib.ExitStack, writer: results.RunWriter,
        conn: object, recipe_image: images.Image, accel: object, run_id: str, tag: str,
        state: object, clock_ghz: float | None, progress: Callable[[str], None],
        rules: Mapping[str, stats.StoppingRule] | None = None) -> None:
    """Boot a pair per variant, then measure every cell's variants interleaved. ``rules``:
    per cell hash, a rule in place of the topology's (the gate's second stage: a fixed count)."""
    writer.update(variants=describe(t.matrix.variants))
    pairs = boot(stack, conn, t, recipe_image, accel, run_id, tag, state,
                 lambda: writer.count("boots"))
    placement = {g.spec.name: g.spec.host for p in pairs for g in (p.client, p.server)}
    try:
        for p in pairs:
            for g in (p.client, p.server):
                g.wait_ready(t.ready_timeout_s)
                progress(f"guest {g.name} ({p.variant.name}) ready in {g.ready_s:.1f} s")
    except (ReadinessError, GuestError) as e:
        progress(f"guests not ready: {e}")
        for c in cells:
            measure.fail_cell(c, writer, f"guest not ready: {e}", placement)
        return
    writer.update(guests={g.spec.name: {"domain": g.name, "host": g.spec.host, "ready_s": g.ready_s,
                                        "variant": p.variant.name}
                          for p in pairs for g in (p.client, p.server)})
    pids = {p.variant.name: {g.spec.name: pid for g in (p.client, p.server)
                             if (pid := virt.qemu_pid(g))} for p in pairs}
    rule = stats.StoppingRule(t.matrix.repetitions)
    n_variants = len(t.matrix.variants)
    groups = itertools.groupby(cells, key=lambda c: (c.attachment, c.backend, c.queues))
    for (attachment, backend, queues), group in groups:
        group = list(group)
        try:
            with mode(attachment, backend, tag, pairs, t.subnet, max(t.matrix.mtus),
                      queues=queues, offloads=t.offloads, topology=t, workdir=state) as paths:
                for k in range(0, len(group), n_variants):
                    these = group[k:k + n_variants]
                    progress(f"[{k // n_variants + 1}/{len(group) // n_variants}] "
                             f"{these[0].id} ... interleaved over {n_variants} variants")
                    measure_interleaved(these, paths, writer, (rules or {}).get(these[0].hash, rule),
                                        t.matrix.repetitions.warmup, pids, placement, clock_ghz)
        except (TestbedError, GuestError) as e:
            recorded = {c["id"] for c in writer.record["cells"]}
            for c in group:
                if c.id not in recorded:
                    measure.fail_cell(c, writer, f"{attachment.value}/{backend.value}: {e}", placement)
