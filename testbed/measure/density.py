"""`testbed bench density`: N guest pairs brought up together from the snapshot cache.

For each N: 2N guests restored from the first pair's snapshots (one slot per role, as a
run's clones are, testbed.measure.runner), in parallel up to the host's cores; the time until all
of them are ready, against N times one pair restored one guest after the other in the same
run; the host memory they hold (each QEMU's RSS and what of it /proc says is shared, the
frozen disk layer's pages in the host page cache, which every guest reads through, and
KSM's merged pages when KSM runs); and the harness's own CPU per pair over an idle window
(this process with its threads, and each guest's agent) next to the guests' QEMU cores.

An N whose guests do not fit the host's available memory is refused before anything of it
is started, with the figures and how many pairs would fit.

The pure parts (argument parsing, the fit check, smaps parsing, the table) are tested in
suites/unit/test_density.py; the bench itself is run by hand (docs/performance.md).
"""
from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from testbed.errors import ConfigError, TestbedError

#: QEMU's own memory beside the guest's RAM, per guest, allowed for in the fit check. TCG's
#: translation cache and device state; measured here at 60-150 MiB above the guest RAM a
#: restored guest touches (docs/performance.md), so 256 MiB leaves a margin.
QEMU_OVERHEAD_MIB = 256
#: Host memory kept free for everything else on the machine when fitting guests.
HOST_RESERVE_MIB = 1024


def parse_pairs(raw: str) -> tuple[int, ...]:
    """``--pairs 1,2,4,8``: distinct positive counts, ascending. Bad input: ConfigError
    naming the argument."""
    out = []
    for part in raw.split(","):
        part = part.strip()
        if not part.isdigit() or int(part) < 1:
            raise ConfigError("testbed bench density", "--pairs",
                              f"{part!r} is not a positive whole number (expected e.g. 1,2,4,8)")
        out.append(int(part))
    if not out:
        raise ConfigError("testbed bench density", "--pairs", "no pair counts given (expected e.g. 1,2,4,8)")
    return tuple(sorted(set(out)))


@dataclass(frozen=True)
class Fit:
    """Whether ``pairs`` pairs of guests fit the host's available memory."""

    pairs: int
    need_mib: int              # 2N x (guest RAM + QEMU overhead) + host reserve
    available_mib: int         # psutil: MemAvailable
    per_guest_mib: int
    max_pairs: int             # how many pairs would fit

    @property
    def ok(self) -> bool:
        return self.pairs <= self.max_pairs

    def refusal(self) -> str:
        return (f"{self.pairs} pairs ({2 * self.pairs} guests) need {self.need_mib} MiB "
                f"({2 * self.pairs} x {self.per_guest_mib} MiB guest RAM and QEMU overhead + "
                f"{HOST_RESERVE_MIB} MiB kept for the host) but {self.available_mib} MiB is available; "
                f"at most {self.max_pairs} pairs fit")


def fit(pairs: int, memory_mib: int, available_mib: int) -> Fit:
    """Pure: the fit check for ``pairs`` pairs of guests of ``memory_mib`` each."""
    per_guest = memory_mib + QEMU_OVERHEAD_MIB
    usable = max(0, available_mib - HOST_RESERVE_MIB)
    return Fit(pairs=pairs, need_mib=2 * pairs * per_guest + HOST_RESERVE_MIB, available_mib=available_mib,
               per_guest_mib=per_guest, max_pairs=usable // (2 * per_guest))


def available_mib() -> int:
    import psutil
    return int(psutil.virtual_memory().available // 2**20)


def parse_smaps_rollup(text: str) -> dict[str, int]:
    """Pure: /proc/<pid>/smaps_rollup's 'Field: N kB' lines, in KiB."""
    out = {}
    for line in text.splitlines():
        name, _, rest = line.partition(":")
        parts = rest.split()
        if len(parts) == 2 and parts[1] == "kB" and parts[0].isdigit():
            out[name.strip()] = int(parts[0])
    return out


def smaps(pid: int) -> dict[str, int] | None:
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            return parse_smaps_rollup(f.read())
    except OSError:
        return None


def ksm() -> dict | None:
    """KSM's state; None where the kernel has no KSM. Pages: 4 KiB each."""
    base = "/sys/kernel/mm/ksm"
    try:
        vals = {k: int(open(f"{base}/{k}").read()) for k in ("run", "pages_shared", "pages_sharing")}
    except (OSError, ValueError):
        return None
    return {"enabled": vals["run"] == 1, "pages_shared": vals["pages_shared"],
            "saved_mib": round(vals["pages_sharing"] * 4096 / 2**20, 1)}


def page_cache_mib(path: str) -> float | None:
    """How much of a file sits in the host page cache (util-linux fincore); None: unknown."""
    from testbed.host import proc
    try:
        res = proc.run(["fincore", "--bytes", "--noheadings", "--output", "RES", path], timeout=30, check=False)
    except Exception:       # noqa: BLE001 - fincore missing: the figure is unknown, not zero
        return None
    try:
        return round(int(res.stdout.split()[0]) / 2**20, 1) if res.rc == 0 else None
    except (ValueError, IndexError):
        return None


def memory_row(qemu_pids: Mapping[str, int]) -> dict:
    """Each QEMU's RSS, PSS and shared pages (smaps_rollup), summed and per guest."""
    rss, pss, shared = [], [], []
    for pid in qemu_pids.values():
        s = smaps(pid)
        if s is None:
            continue
        rss.append(s.get("Rss", 0))
        pss.append(s.get("Pss", 0))
        shared.append(s.get("Shared_Clean", 0) + s.get("Shared_Dirty", 0))
    n = len(rss)
    mib = lambda kib: round(kib / 1024, 1)    # noqa: E731
    return {"guests_read": n, "rss_mib": mib(sum(rss)), "pss_mib": mib(sum(pss)),
            "shared_mib": mib(sum(shared)),
            "rss_per_guest_mib": mib(sum(rss) / n) if n else None,
            "pss_per_guest_mib": mib(sum(pss) / n) if n else None}


def workers(n_guests: int) -> int:
    """Restores in flight at once: up to the host's cores."""
    return max(1, min(n_guests, os.cpu_count() or 1))


def format_table(one_pair_s: float | None, rows: Sequence[dict]) -> str:
    """Pure: the density report, one line per N (a refused or failed N says why)."""
    lines = []
    if one_pair_s is not None:
        lines.append(f"one pair restored one guest after the other: {one_pair_s:.2f} s")
    lines.append(f"{'pairs':>5} {'ready s':>8} {'vs N x one':>10} {'RSS MiB/guest':>13} {'PSS MiB/guest':>13} "
                 f"{'shared MiB':>10} {'disk layer cached MiB':>21} {'KSM saved MiB':>13} "
                 f"{'harness CPU %/pair':>18} {'agent CPU %/pair':>16} {'QEMU idle cores/pair':>20}")
    for r in rows:
        if "refused" in r or "failed" in r:
            what = "refused" if "refused" in r else "failed"
            lines.append(f"{r['pairs']:>5} {what}: {r.get('refused') or r.get('failed')}")
            continue
        m = r["memory"]
        k = r.get("ksm")
        ksm_s = ("off" if k and not k["enabled"] else f"{k['saved_mib']:.1f}") if k else "n/a"
        cache = r.get("disk_layer_cached_mib")
        lines.append(
            f"{r['pairs']:>5} {r['ready_s']:>8.2f} "
            f"{(format(r['ratio'], '.2f') if r.get('ratio') is not None else '-'):>10} "
            f"{_f(m['rss_per_guest_mib']):>13} {_f(m['pss_per_guest_mib']):>13} {m['shared_mib']:>10.1f} "
            f"{_f(cache):>21} {ksm_s:>13} {r['harness_cpu_pct_per_pair']:>18.3f} "
            f"{_f3(r.get('agent_cpu_pct_per_pair')):>16} {r['qemu_idle_cores_per_pair']:>20.3f}")
    return "\n".join(lines)


def _f(v: float | None) -> str:
    return "-" if v is None else f"{v:.1f}"


def _f3(v: float | None) -> str:
    return "-" if v is None else f"{v:.3f}"


# --------------------------------------------------------------------------- the bench

def _proc_cpu_s(pid: int) -> float | None:
    import psutil
    try:
        t = psutil.Process(pid).cpu_times()
        return t.user + t.system
    except psutil.Error:
        return None


def _libvirtd_pids() -> list[int]:
    import psutil
    return [p.pid for p in psutil.process_iter(["name"]) if p.info["name"] in ("libvirtd", "virtqemud")]


def _agent_cpu_s(g) -> float | None:
    """CPU seconds the guest's own qemu-ga has used (its /proc stat, in the guest)."""
    try:
        res = g.agent.run(["/bin/sh", "-c", "cat /proc/$(pidof qemu-ga)/stat; getconf CLK_TCK"],
                          check=False, timeout=30)
        lines = res.stdout.split("\n")
        fields = lines[0].rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / int(lines[1])
    except Exception:       # noqa: BLE001 - unknown is reported as missing, not zero
        return None


def idle_cost(guests: Sequence, qemu_pids: Mapping[str, int], window_s: float) -> dict:
    """Over an idle window with every guest ready and no traffic: this process's CPU (the
    harness: its threads, nothing polled) and libvirtd's, each guest agent's CPU inside its
    guest, and the guests' QEMU cores (testbed.measure.cpu), per pair."""
    import time

    from testbed.measure import cpu
    me = os.getpid()
    lv = _libvirtd_pids()
    a0 = [_agent_cpu_s(g) for g in guests]
    h0, l0 = _proc_cpu_s(me), sum(_proc_cpu_s(p) or 0.0 for p in lv)
    before = cpu.host_reading(qemu_pids)
    t0 = time.monotonic()
    time.sleep(window_s)          # the window itself: nothing polled on purpose
    wall = time.monotonic() - t0
    after = cpu.host_reading(qemu_pids)
    h1, l1 = _proc_cpu_s(me), sum(_proc_cpu_s(p) or 0.0 for p in lv)
    a1 = [_agent_cpu_s(g) for g in guests]
    d = cpu.host_delta(before, after)
    pairs = max(1, len(guests) // 2)
    agents = [b - a for a, b in zip(a0, a1) if a is not None and b is not None]
    harness = (h1 - h0) if h0 is not None and h1 is not None else 0.0
    return {"window_s": round(wall, 2), "pairs": pairs,
            "harness_cpu_s": round(harness, 4), "libvirtd_cpu_s": round(l1 - l0, 4),
            "agents_read": len(agents), "agent_cpu_s": round(sum(agents), 4),
            "harness_cpu_pct_per_pair": round(100 * (harness + (l1 - l0)) / wall / pairs, 3),
            "agent_cpu_pct_per_pair": round(100 * sum(agents) / wall / pairs, 3) if agents else None,
            "qemu_idle_cores_per_pair": round(sum(v["total"] for v in d["per_guest"].values()) / pairs, 4),
            "host_busy_cores": round(d["host"].get("busy", 0.0), 3)}


def run(pair_counts: Sequence[int], window_s: float = 10.0, progress=print) -> dict:
    """The density bench (see the module's docstring). One Session (host lock, owned
    state); the snapshots of the two slots are made first when missing."""
    import contextlib
    import time

    from testbed.admin import capabilities
    from testbed.guests import guestcache, images, virt
    from testbed.measure import pairs as pairs_mod
    from testbed.measure.session import Session
    from testbed.topology.config import default

    t = default()
    img = images.ensure()
    assert img.kernel is not None
    accel = capabilities.choose_accelerator("auto", img.kernel)
    base = pairs_mod.guest_pairs(t, 1)[0]
    memory_mib = max(s.memory_mib for s in base)
    rows: list[dict] = []
    one_steps: list[dict[str, float]] = []
    with Session(t) as ses:
        conn = ses.stack.enter_context(virt.connect("qemu:///system"))
        # The boot figures' floor in the same run (testbed bench boot): the restores are
        # also read as a multiple of it.
        probe = capabilities.probe_boot(img.kernel, accel)
        floor = probe.seconds if probe.ok else None

        def guest(spec, slot):
            return virt.guest(conn, spec, img, accel, ses.run_id, ses.tag, ses.state, slot=slot)

        # The slots' snapshots: a cold boot and save when missing (not measured).
        with contextlib.ExitStack() as st:
            gs = [st.enter_context(guest(s, None)) for s in base]
            for g in gs:
                g.wait_ready(t.ready_timeout_s)
                progress(f"slot {g.name}: {g.boot} ({g.ready_s:.1f} s)")
        # One pair restored one guest after the other: the unit of the ratio.
        with contextlib.ExitStack() as st:
            one = 0.0
            for s in base:
                g = st.enter_context(guest(s, None))
                if g.boot != "restored":
                    raise TestbedError(f"density: {g.name} was not restored: {g.boot_reason}")
                one += g.wait_ready(120)
                one_steps.append(dict(g.steps))
        progress(f"one pair, one guest after the other: {one:.2f} s")
        snap_disks = sorted({str(s.disk) for s in guestcache.all_snapshots()
                             if s.key.slot in {b.name for b in base} and s.key.image_digest == img.digest})
        for n in pair_counts:
            f = fit(n, memory_mib, available_mib())
            if not f.ok:
                rows.append({"pairs": n, "refused": f.refusal()})
                progress(f"{n} pairs refused: {f.refusal()}")
                continue
            specs = [(s, b.name) for p in pairs_mod.guest_pairs(t, n) for s, b in zip(p, base)]
            with contextlib.ExitStack() as st:
                started = time.monotonic()
                try:
                    gs = virt.enter_parallel(st, [guest(s, slot) for s, slot in specs], workers(len(specs)))
                    # Every guest's wait at once: each is agent calls and its own guest's work.
                    virt.map_parallel(lambda g: g.wait_ready(t.ready_timeout_s), gs, len(gs))
                except Exception as e:     # noqa: BLE001 - the row says why (Ctrl-C still stops it)
                    rows.append({"pairs": n, "failed": str(e).splitlines()[0][:300]})
                    progress(f"{n} pairs failed: {e}")
                    continue
                ready = time.monotonic() - started
                cold = [g.name for g in gs if g.boot != "restored"]
                pids = {g.name: p for g in gs if (p := virt.qemu_pid(g))}
                row = {"pairs": n, "guests": len(gs), "ready_s": round(ready, 2),
                       "ratio": round(ready / (n * one), 3) if one else None,
                       "max_guest_ready_s": round(max(g.ready_s for g in gs), 2),
                       "steps": median_steps([g.steps for g in gs]),
                       "not_restored": cold, "fit": {"available_mib": f.available_mib, "max_pairs": f.max_pairs},
                       "memory": memory_row(pids), "ksm": ksm(),
                       "disk_layer_cached_mib": _sum_or_none([page_cache_mib(p) for p in
                                                              [str(img.disk), *snap_disks]])}
                row.update(idle_cost(gs, pids, window_s))
                rows.append(row)
                progress(f"{n} pairs: all {len(gs)} ready in {ready:.2f} s")
    return {"accelerator": accel.value, "memory_mib": memory_mib, "one_pair_s": round(one, 2),
            "floor_s": round(floor, 2) if floor else None, "one_steps": median_steps(one_steps),
            "cores": os.cpu_count(), "rows": rows}


def median_steps(steps: Sequence[Mapping[str, float]]) -> dict[str, float]:
    """Pure: the median seconds of each restore step (testbed.guests.virt.RESTORE_STEPS) over
    guests, in the steps' order; steps no guest recorded are left out."""
    import statistics
    names = [k for k in dict.fromkeys(k for st in steps for k in st)]
    return {k: round(statistics.median(st[k] for st in steps if k in st), 3) for k in names}


def format_boot_line(r: Mapping) -> str:
    """Pure: the run's boot figures, before the table: the floor, one guest's restore and
    its steps (medians of the pair restored one guest after the other)."""
    floor, one = r.get("floor_s"), r.get("one_pair_s")
    head = f"floor (kernel->init) {floor:.2f} s" if floor else "floor (kernel->init) - (probe failed)"
    if one is not None:
        head += f"; one restore {one / 2:.2f} s" + (f" = {one / 2 / floor:.2f}x the floor" if floor else "")
    steps = r.get("one_steps") or {}
    if steps:
        head += " (" + ", ".join(f"{k} {v:.2f} s" for k, v in steps.items()) + ")"
    return head


def _sum_or_none(vals: Sequence[float | None]) -> float | None:
    return None if any(v is None for v in vals) else round(sum(vals), 1)  # type: ignore[arg-type]
