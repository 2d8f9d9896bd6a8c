"""The results disk: the space a run needs, checked before it starts, and a full disk met
mid-run turned into one clear stop that leaves every file readable.

What a full file system must not do to a run directory:
- leave half a line at the end of samples.jsonl: a line is appended with one write and, when
  the write fails or is short, the file is cut back to where the line began;
- leave a truncated raw output: each is written to a temporary file beside it and renamed
  over its name only once complete;
- leave run.json half written: it is always replaced by rename (results.atomic_write).

The run then stops with :class:`DiskFull` (exit status 4, like the other states of the host
that block a run): which file, how many bytes it needed and how many were free, and the
command that goes on once space is freed (`testbed run ... --resume RUN`).
"""
from __future__ import annotations

import contextlib
import errno
import os
import shutil
import tempfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from testbed.errors import TestbedError

KIB, MIB = 1024, 1024 * 1024

#: The estimate, per sample: its JSON line (5 KiB measured on real runs; histograms and
#: percentiles make it larger) plus each client instance's raw output (netperf ~1 KiB, an
#: iperf3 JSON report with per-second intervals a few tens of KiB).
SAMPLE_LINE_BYTES = 8 * KIB
RAW_BYTES_PER_CLIENT = 32 * KIB
#: run.json grows by about 10 KiB per finished cell; replacing it atomically needs the old
#: and the new copy at once
RUN_JSON_BYTES_PER_CELL = 12 * KIB
#: the report written at the end, guest console logs, the index when it sits beside the runs
FIXED_BYTES = 2 * MIB

NO_SPACE = (errno.ENOSPC, errno.EDQUOT)


class DiskFull(TestbedError):
    """The results file system has no room: before a run (the estimate does not fit) or in
    the middle of one (a write failed). One line, exit status 4."""

    exit_status = 4


@dataclass(frozen=True)
class Estimate:
    """What a matrix will write, and how that figure was made (stated in the refusal)."""

    samples: int
    clients: int                # client instances over all samples (each writes raw output)
    cells: int

    @property
    def bytes(self) -> int:
        return (self.samples * SAMPLE_LINE_BYTES + self.clients * RAW_BYTES_PER_CLIENT
                + 2 * self.cells * RUN_JSON_BYTES_PER_CELL + FIXED_BYTES)

    def explain(self) -> str:
        return (f"{self.samples} samples x {SAMPLE_LINE_BYTES // KIB} KiB + {self.clients} client outputs "
                f"x {RAW_BYTES_PER_CLIENT // KIB} KiB + run.json 2 x {self.cells} cells x "
                f"{RUN_JSON_BYTES_PER_CELL // KIB} KiB + {FIXED_BYTES // MIB} MiB for the report and logs")


def estimate(cells: Iterable, warmup: int, max_samples: int) -> Estimate:
    """Pure: the estimate for ``cells`` (testbed.topology.model.Cell) measured with ``warmup`` warm-ups
    and at most ``max_samples`` samples each. Every pair runs its own clients, one per
    connection at most (tools that take a connection count in one process write less)."""
    samples = clients = n = 0
    for c in cells:
        per = warmup + max_samples
        samples += per
        clients += per * max(1, getattr(c, "pairs", 1)) * max(1, c.connections)
        n += 1
    return Estimate(samples, clients, n)


def free_bytes(path: Path) -> tuple[int, Path]:
    """Free bytes (for an unprivileged writer) on the file system that holds ``path`` or,
    when it does not exist yet, its nearest existing parent; and that folder."""
    p = Path(path).absolute()
    while not p.exists() and p != p.parent:
        p = p.parent
    return shutil.disk_usage(p).free, p


def human(n: float) -> str:
    for unit in ("bytes", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "bytes" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


def require(root: Path, est: Estimate) -> None:
    """Refuse a run whose estimate does not fit on the results file system, before anything
    is created."""
    free, where = free_bytes(root)
    if free < est.bytes:
        raise DiskFull(f"{root}: not enough space for this run: it needs about {human(est.bytes)} "
                       f"({est.explain()}), {human(free)} free on {where}")


def snapshot_shortfall(memory_mib: int, disk_bytes: int, folder: Path) -> str | None:
    """Why a guest snapshot would not fit in the cache folder ``folder``, or None. The
    estimate: the saved state holds at most the guest's memory, and the disk overlay moves
    into the cache beside it."""
    need = memory_mib * MIB + disk_bytes
    free, where = free_bytes(folder)
    if free >= need:
        return None
    return (f"the snapshot needs about {human(need)} (memory {memory_mib} MiB + disk overlay "
            f"{human(disk_bytes)}), {human(free)} free on {where}")


# --------------------------------------------------------------------------- writing

def _full(path: Path, needed: int, run_dir: Path | None) -> DiskFull:
    free, _ = free_bytes(path.parent)
    go_on = (f"; the run stopped, its finished cells kept: free space and go on with "
             f"`testbed run TOPOLOGY --resume {run_dir}`") if run_dir else ""
    return DiskFull(f"results disk full: writing {path} needed {human(needed)}, "
                    f"{human(free)} free{go_on}")


@contextlib.contextmanager
def mapped(path: Path, needed: int, run_dir: Path | None = None) -> Iterator[None]:
    """An out-of-space error inside becomes :class:`DiskFull` naming ``path``."""
    try:
        yield
    except OSError as e:
        if e.errno in NO_SPACE:
            raise _full(path, needed, run_dir) from None
        raise


def write_file(path: Path, data: bytes | str, run_dir: Path | None = None) -> None:
    """``data`` into ``path`` completely or not at all: a temporary file beside it, renamed
    over it once written and synced."""
    b = data.encode() if isinstance(data, str) else data
    with mapped(path, len(b), run_dir):
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(b)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise


def append_line(fd: int, path: Path, line: str, run_dir: Path | None = None) -> None:
    """One line appended to the file open on ``fd`` (O_APPEND) and synced, or nothing: a
    failed or short write is cut back, so the file never ends in half a line."""
    b = line.encode()
    start = os.fstat(fd).st_size
    with mapped(path, len(b), run_dir):
        try:
            view = memoryview(b)
            while view:
                n = os.write(fd, view)
                if n <= 0:
                    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
                view = view[n:]
            os.fsync(fd)
        except BaseException:
            with contextlib.suppress(OSError):
                os.ftruncate(fd, start)
            raise


__all__ = ["snapshot_shortfall", "DiskFull", "Estimate", "append_line", "estimate", "free_bytes", "human", "mapped",
           "require", "write_file"]
