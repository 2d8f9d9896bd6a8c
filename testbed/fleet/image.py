"""The controller's cached guest image, shipped to the fleet's targets.

A target gets the image the controller runs (the same recipe digest, the same bytes) instead
of building its own: it needs no mmdebstrap, no mirror and no ten minutes. The image folder
is shipped as fixed-size chunks (``CHUNK_BYTES``), each copied by Ansible's ``copy`` module,
which compares checksums first: a chunk already on the target is not sent again, so a
shipment cut off half way goes on where it stopped. On the target the chunks are joined,
every file is checked against the controller's SHA-256 (``sha256sum -c``), and the folder is
renamed into the target's image cache in one step; a target whose image folder already
carries the same sums file is skipped without sending a byte.

The chunks are made once per image on the controller (under its cache, beside the images)
and reused by every fleet run.
"""
from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

#: bytes per chunk: a resumed shipment resends at most this much of what was cut off
CHUNK_BYTES = 64 << 20
#: the file in a shipped image folder that lists every file's SHA-256 (sha256sum's format)
SUMS = "testbed-image.sha256"
_PREFIX = "tb-"


@dataclass(frozen=True)
class Shipment:
    folder: str                          # the image folder's name: <recipe>-<digest>
    sums: str                            # sha256sum lines of its files
    files: tuple[str, ...]
    #: (chunk name, controller path): chunk names are <file>.<NNNN>
    chunks: tuple[tuple[str, str], ...]

    def as_var(self) -> dict:
        """What the role is given (testbed_image)."""
        return {"folder": self.folder, "sums": self.sums, "files": list(self.files),
                "chunks": [{"name": n, "src": s} for n, s in self.chunks]}


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 20):
            h.update(block)
    return h.hexdigest()


def prepare(folder: Path, store: Path) -> Shipment:
    """The shipment of the image folder ``folder``: its sums and its chunks, made under
    ``store`` once (a folder per image, renamed into place when whole)."""
    files = sorted(p.name for p in folder.iterdir() if p.is_file() and p.name != SUMS)
    dest = store / folder.name
    if not (dest / SUMS).is_file():
        store.mkdir(parents=True, exist_ok=True)
        work = Path(tempfile.mkdtemp(prefix=f"{_PREFIX}chunks-{folder.name}-", dir=store))
        try:
            lines = []
            for name in files:
                lines.append(f"{_sha256(folder / name)}  {name}")
                with open(folder / name, "rb") as src:
                    k = 0
                    while block := src.read(CHUNK_BYTES):
                        (work / f"{name}.{k:04d}").write_bytes(block)
                        k += 1
                    if k == 0:
                        (work / f"{name}.0000").write_bytes(b"")
            (work / SUMS).write_text("\n".join(lines) + "\n")
            os.rename(work, dest)
        except BaseException:
            shutil.rmtree(work, ignore_errors=True)
            raise
        for other in store.iterdir():          # chunks of images no longer cached
            if other.name != folder.name and not other.name.startswith(_PREFIX):
                shutil.rmtree(other, ignore_errors=True)
    sums = (dest / SUMS).read_text()
    chunks = tuple(sorted((p.name, str(p)) for p in dest.iterdir() if p.name != SUMS))
    return Shipment(folder.name, sums, tuple(files), chunks)


def controller_image() -> Path:
    """The image folder the controller's runs use (its recipe: $TESTBED_IMAGE, else
    debian12), built here first when it is not cached yet."""
    from testbed.guests import images
    return images.ensure().disk.parent
