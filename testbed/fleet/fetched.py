"""A target's fetched run archive, unpacked only when every member is what a run directory
holds: one top folder named like a run id, regular files and folders under it, plain names.

A target is not trusted further than its own results: an archive with an absolute name, a
``..``, a link (symbolic or hard), a device, a FIFO, more members or bytes than a run has, or
a second top folder unpacks nothing. What passes is then extracted with tarfile's ``data``
filter (the same rules, enforced again by the standard library), into a fresh folder beside
its place, and renamed into place: a failure half way leaves no half run behind.
"""
from __future__ import annotations

import re
import shutil
import tarfile
import tempfile
from pathlib import Path, PurePosixPath

from testbed.host.safeio import UserFileError

#: what one run directory may hold
MAX_MEMBERS = 100_000
MAX_BYTES = 8 << 30
_RUN_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
_PART = re.compile(r"^[A-Za-z0-9_.+@=:,-][A-Za-z0-9_.+@=:, -]{0,254}$")


def check_members(archive: Path, members: list[tarfile.TarInfo]) -> str:
    """The archive's one top folder, after every member passed; else UserFileError naming
    the first member that did not."""
    tops: set[str] = set()
    total = 0
    if len(members) > MAX_MEMBERS:
        raise UserFileError(archive, f"holds more than {MAX_MEMBERS} members")
    for m in members:
        name = m.name
        shown = repr(name[:80])
        p = PurePosixPath(name)
        if name.startswith("/") or p.is_absolute():
            raise UserFileError(archive, f"member {shown}: an absolute path")
        parts = [x for x in p.parts if x != "."]
        if not parts:
            continue
        if any(x == ".." for x in parts):
            raise UserFileError(archive, f"member {shown}: '..' leads out of the run directory")
        if any(not _PART.match(x) or x in (".", "..") for x in parts):
            raise UserFileError(archive, f"member {shown}: a name a run directory does not hold")
        if m.issym() or m.islnk():
            raise UserFileError(archive, f"member {shown}: a link (to {m.linkname[:80]!r}); a run "
                                         f"directory holds none")
        if not (m.isreg() or m.isdir()):
            raise UserFileError(archive, f"member {shown}: a device, FIFO or other special file")
        total += max(m.size, 0)
        if total > MAX_BYTES:
            raise UserFileError(archive, f"unpacks to more than {MAX_BYTES} bytes")
        tops.add(parts[0])
    if len(tops) != 1:
        raise UserFileError(archive, f"expected one run directory, found {sorted(tops)[:5]}")
    top = tops.pop()
    if not _RUN_ID.match(top):
        raise UserFileError(archive, f"top folder {top[:80]!r} is not a run id")
    return top


def unpack(archive: Path, fleet_dir: Path, folder: str) -> Path:
    """The run directory in ``archive``, checked, unpacked to <fleet_dir>/hosts/<folder>/."""
    hosts = fleet_dir / "hosts"
    dest = hosts / folder
    if dest.resolve().parent != hosts.resolve() or folder in ("", ".", ".."):
        raise UserFileError(folder, "a host folder outside the fleet run")
    try:
        with tarfile.open(archive) as t:
            members = t.getmembers()
            top = check_members(archive, members)
            hosts.mkdir(parents=True, exist_ok=True)
            work = Path(tempfile.mkdtemp(prefix=".unpack-", dir=hosts))
            try:
                t.extractall(work, members=members, filter="data")
                if dest.exists():
                    shutil.rmtree(dest)
                work.rename(dest)
            except BaseException:
                shutil.rmtree(work, ignore_errors=True)
                raise
    except (tarfile.TarError, EOFError, OSError, ValueError) as e:
        raise UserFileError(archive, f"not a readable run archive: {e}") from None
    archive.unlink()
    return dest / top
