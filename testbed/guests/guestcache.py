"""Booted guests, cached: a libvirt save image of a ready guest plus the frozen disk layer
under it, so later runs restore a guest in seconds instead of booting it for minutes.

(Not to be confused with testbed/host/snapshot.py, the host-networking snapshot of the tests.)

One snapshot per guest slot (its name is baked in: hostname, cloud-init instance). It lives
in ``cache_dir()/snapshots/<slot>-<key>/``:

- ``state.save``  libvirt save image (virDomainSaveFlags): memory and device state, and the
  domain XML it was saved with;
- ``disk.qcow2``  the guest's overlay at the moment of the save, frozen: every restore puts
  a new overlay of its own on top, so this layer is never written again;
- ``seed.iso``    the cloud-init seed the guest booted with (the domain still has it);
- ``manifest.json`` the key's fields, written last.

A folder is built under a tb- temporary name and renamed into place, so a crash never
leaves one half-written that looks usable. The key covers everything the saved state
depends on; any change means no snapshot, a cold boot, and a new snapshot afterwards.
"""
from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import os
import shutil
import struct
import tempfile
import time
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

from testbed import PREFIX
from testbed.errors import TestbedError
from testbed.guests import render
from testbed.guests.lazy import libvirt
from testbed.host import paths

log = logging.getLogger(__name__)

#: Bump when what is saved, or how, changes in a way the key fields cannot see.
FORMAT = "1"
#: How a snapshot is made (measured; see docs/images.md, "Guest snapshots").
METHOD = "libvirt-save-image"


@dataclass(frozen=True)
class Key:
    """Everything a saved guest state depends on."""

    slot: str                  # guest name: hostname and cloud-init instance are inside
    image_digest: str
    memory_mib: int
    vcpus: int
    hotplug_slots: int         # spare PCIe root ports NICs are hot-plugged into later
    accelerator: str
    machine: str               # the machine type libvirt expands q35 to
    qemu_version: int
    libvirt_version: int
    host_cpu: str
    templates: str             # hash of the domain and cloud-init templates
    kernel_cmdline: str
    #: the image's build (images.Image.build): a rebuilt image of the same recipe boots cold
    image_build: str = ""
    format: str = FORMAT

    @property
    def digest(self) -> str:
        return hashlib.sha256(json.dumps(asdict(self), sort_keys=True).encode()).hexdigest()[:16]

    @property
    def folder_name(self) -> str:
        return f"{self.slot}-{self.digest}"


def templates_digest() -> str:
    h = hashlib.sha256()
    for rel in ("libvirt/domain.xml.j2", "cloud-init/user-data.j2", "cloud-init/meta-data.j2",
                "cloud-init/network-config.j2"):
        h.update(rel.encode())
        h.update((paths.templates_dir() / rel).read_bytes())
    return h.hexdigest()[:16]


#: machine_type per (libvirt URI, domain type, QEMU version): libvirt's domain capabilities
#: are asked once per process, not once per guest (a density run keys 2N guests at once)
_MACHINES: dict[tuple[str, str, int], str] = {}


def machine_type(conn: libvirt.virConnect, domain_type: str) -> str:
    """What libvirt makes of the template's 'q35' on this host (e.g. pc-q35-7.2)."""
    import re
    key = (conn.getURI(), domain_type, conn.getVersion())
    if key not in _MACHINES:
        caps = conn.getDomainCapabilities(None, "x86_64", "q35", domain_type, 0)
        m = re.search(r"<machine>([^<]+)</machine>", caps)
        _MACHINES[key] = m.group(1) if m else "q35"
    return _MACHINES[key]


def key_for(conn: libvirt.virConnect, slot: str, *, image_digest: str, memory_mib: int, vcpus: int,
            accelerator: str, domain_type: str, kernel_cmdline: str, image_build: str = "",
            hotplug_slots: int = render.DomainParams.hotplug_slots) -> Key:
    from testbed.host import environment
    return Key(slot=slot, image_digest=image_digest, memory_mib=memory_mib, vcpus=vcpus,
               hotplug_slots=hotplug_slots, accelerator=accelerator,
               machine=machine_type(conn, domain_type), qemu_version=conn.getVersion(),
               libvirt_version=conn.getLibVersion(), host_cpu=environment.cpu_model()[0],
               templates=templates_digest(), kernel_cmdline=kernel_cmdline, image_build=image_build)


def root() -> Path:
    return paths.cache_dir() / "snapshots"


class _Layout:
    """The files of a snapshot folder, one layout for the one being written (Builder) and
    the finished one (Snapshot)."""

    folder: Path

    @property
    def state(self) -> Path:
        return self.folder / "state.save"

    @property
    def disk(self) -> Path:
        return self.folder / "disk.qcow2"

    @property
    def seed(self) -> Path:
        return self.folder / "seed.iso"


@dataclass(frozen=True)
class Snapshot(_Layout):
    folder: Path
    key: Key
    created: float
    saved_name: str            # the domain name inside the save image
    saved_uuid: str
    save_s: float

    def size_bytes(self) -> int:
        return sum(f.stat().st_size for f in self.folder.iterdir() if f.is_file())


def _load(folder: Path) -> Snapshot | None:
    try:
        m = json.loads((folder / "manifest.json").read_text())
        return Snapshot(folder=folder, key=Key(**m["key"]), created=m["created"], saved_name=m["saved_name"],
                        saved_uuid=m["saved_uuid"], save_s=m["save_s"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def all_snapshots() -> list[Snapshot]:
    d = root()
    found = [_load(f) for f in sorted(d.iterdir())] if d.is_dir() else []
    return [s for s in found if s is not None]


def lookup(key: Key) -> tuple[Snapshot | None, str]:
    """The snapshot for ``key``, or None and why not (naming what changed, when an older
    snapshot of the same slot exists)."""
    snap = _load(root() / key.folder_name)
    if snap is not None:
        return snap, ""
    same_slot = [s for s in all_snapshots() if s.key.slot == key.slot]
    if not same_slot:
        return None, f"no snapshot of guest {key.slot} yet (key {key.digest})"
    newest = max(same_slot, key=lambda s: s.created)
    old, new = asdict(newest.key), asdict(key)
    diff = [f"{k} {old[k]} -> {new[k]}" for k in new if old.get(k) != new[k]]
    return None, f"snapshot key changed ({'; '.join(diff)}): cold boot, new snapshot {key.digest}"


class Builder(_Layout):
    """A snapshot being written: a tb- temporary folder beside the final one, renamed into
    place by commit(); removed by discard() (and by prune --partial after a crash)."""

    def __init__(self, key: Key) -> None:
        root().mkdir(parents=True, exist_ok=True)
        self.key = key
        # The writer's pid in the name: prune removes a partial folder only once it is dead.
        self.tmp = Path(tempfile.mkdtemp(prefix=f"{PREFIX}snap-{key.folder_name}-{os.getpid()}-", dir=root()))
        os.chmod(self.tmp, 0o755)

    @property
    def folder(self) -> Path:
        return self.tmp

    def commit(self, saved_name: str, saved_uuid: str, save_s: float, replace: bool = False) -> Snapshot:
        for f in self.tmp.iterdir():
            # Read-only: the frozen layer and the state are shared by every later restore.
            os.chmod(f, 0o444)
        (self.tmp / "manifest.json").write_text(json.dumps(
            {"key": asdict(self.key), "key_digest": self.key.digest, "created": time.time(),
             "method": METHOD, "saved_name": saved_name, "saved_uuid": saved_uuid,
             "save_s": round(save_s, 3)}, indent=2))
        final = root() / self.key.folder_name
        if replace and final.exists():
            # Renewed (bench): moved aside first, so the final name is never half there.
            old = final.with_name(f"{PREFIX}snap-old-{final.name}-{os.getpid()}-x")
            os.rename(final, old)
            shutil.rmtree(old, ignore_errors=True)
        try:
            os.rename(self.tmp, final)
        except OSError:
            # Another run committed the same key first: theirs is as good as ours.
            shutil.rmtree(self.tmp, ignore_errors=True)
        snap = _load(final)
        if snap is None:
            raise TestbedError(f"snapshot {final} unreadable after commit")
        return snap

    def discard(self) -> None:
        shutil.rmtree(self.tmp, ignore_errors=True)


def partial() -> list[Path]:
    """Temporary folders of snapshots whose writer died."""
    d = root()
    return sorted(p for p in d.glob(f"{PREFIX}snap-*") if p.is_dir()) if d.is_dir() else []


def writer_dead(partial_dir: Path) -> bool:
    try:
        pid = int(partial_dir.name.rsplit("-", 2)[-2])
    except (ValueError, IndexError):
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


def remove(snap: Snapshot) -> None:
    shutil.rmtree(snap.folder, ignore_errors=True)


# libvirt's save image: a 92-byte header (magic, version, length of the XML area, whether
# it was running, compression, offset of the cookie in the XML area, reserved words), the
# XML area (domain XML, NUL, cookie XML, NUL, padding), then QEMU's migration stream.
# libvirt refuses a restore XML with another name or UUID (measured: "Target domain name
# ... does not match source"), so each restore reads its own image with the XML area
# rewritten: new tb- name, UUID and paths; QEMU's stream follows as it is (streamed_image).
_MAGIC = b"LibvirtQemudSave"
_HEADER = struct.Struct("<16s5I14I")


def restore_xml(saved_xml: str, *, name: str, uuid: str, run_id: str, disk: str, seed: str,
                console_log: str) -> str:
    """Pure: the saved domain XML with what is this guest's own replaced: name, UUID, title,
    run id, writable overlay, seed and console log. Everything the guest's state depends
    on (devices, addresses, machine) is kept exactly as saved."""
    ET.register_namespace("tb", "https://testbed.invalid/xmlns/1")
    root_el = ET.fromstring(saved_xml)
    root_el.find("name").text = name                                 # type: ignore[union-attr]
    root_el.find("uuid").text = uuid                                 # type: ignore[union-attr]
    title = root_el.find("title")
    if title is not None:
        title.text = f"testbed guest {name} (run {run_id})"
    for run in root_el.iter("{https://testbed.invalid/xmlns/1}run"):
        run.text = run_id
    disks = {d.find("target").get("dev"): d for d in root_el.iter("disk")}  # type: ignore[union-attr]
    for dev, path in (("vda", disk), ("vdb", seed)):
        d = disks.get(dev)
        if d is None or d.find("source") is None:
            raise TestbedError(f"saved domain XML has no disk {dev}")
        d.find("source").set("file", path)                           # type: ignore[union-attr]
        bs = d.find("backingStore")
        if bs is not None:
            d.remove(bs)    # libvirt reads the chain from the new overlay itself
    for log_el in root_el.iter("log"):
        log_el.set("file", console_log)
    return ET.tostring(root_el, encoding="unicode")


def read_image_xml(path: Path) -> str:
    with open(path, "rb") as f:
        magic, version, data_len, _running, compressed, cookie_off, *_ = _HEADER.unpack(f.read(_HEADER.size))
        if magic != _MAGIC or version != 2 or compressed != 0:
            raise TestbedError(f"{path}: not an uncompressed libvirt save image version 2")
        data = f.read(data_len)
    return data[:cookie_off or data_len].split(b"\0", 1)[0].decode()


def _head(f, src: Path, xml: str) -> bytes:
    """Read a save image's header and XML area from ``f`` (left at the start of QEMU's
    stream); return them with ``xml`` in place of the domain XML (the cookie kept)."""
    head = f.read(_HEADER.size)
    magic, version, data_len, running, compressed, cookie_off, *unused = _HEADER.unpack(head)
    if magic != _MAGIC or version != 2 or compressed != 0:
        raise TestbedError(f"{src}: not an uncompressed libvirt save image version 2")
    data = f.read(data_len)
    cookie = data[cookie_off:].split(b"\0", 1)[0] if cookie_off else b""
    new = xml.encode() + b"\0"
    new_cookie_off = len(new) if cookie else 0
    new += cookie + b"\0" if cookie else b""
    if len(new) > data_len:
        raise TestbedError(f"{src}: rewritten XML ({len(new)} bytes) exceeds the image's XML area ({data_len})")
    return _HEADER.pack(magic, version, data_len, running, compressed, new_cookie_off, *unused) + \
        new.ljust(data_len, b"\0")


#: the FIFO's buffer while a save image streams through it (Linux's default is 64 KiB)
STREAM_PIPE_BYTES = 1 << 20


@contextlib.contextmanager
def streamed_image(src: Path, dest: Path, xml: str, timeout: float = 300) -> Iterator[Path]:
    """Save image ``src`` with ``xml`` as its domain XML, readable once at ``dest``: a FIFO
    that a thread fills as libvirt reads it (the header and XML, then QEMU's stream straight
    from ``src``, which stays in the page cache for every restore). A restore reads the image
    from start to end once, so nothing is copied to disk first (a copy per restore wrote the
    whole image again, 150 MB here, and libvirt read it back). On exit the FIFO is removed; a writer
    still waiting for a reader (the restore failed before libvirt opened it) or for one that
    went away is let go."""
    import threading
    with open(src, "rb") as f:           # a bad image is refused before anything is made
        head = _head(f, src, xml)
        start = f.tell()
    os.mkfifo(dest, 0o600)
    failed: list[BaseException] = []

    def feed() -> None:
        try:
            with open(src, "rb") as f, open(dest, "wb", buffering=0) as out:
                with contextlib.suppress(OSError):
                    fcntl.fcntl(out.fileno(), fcntl.F_SETPIPE_SZ, STREAM_PIPE_BYTES)
                view = memoryview(head)
                while view:
                    view = view[out.write(view):]
                offset, size = start, os.fstat(f.fileno()).st_size
                while offset < size:
                    n = os.sendfile(out.fileno(), f.fileno(), offset, size - offset)
                    if n <= 0:
                        raise TestbedError(f"{src}: stream ended at {offset} of {size} bytes")
                    offset += n
        except BrokenPipeError:
            pass            # the reader went away: the restore says why
        except BaseException as e:      # noqa: BLE001 - handed to the caller
            failed.append(e)

    writer = threading.Thread(target=feed, name="tb-restore-stream", daemon=True)
    writer.start()
    try:
        yield dest
    finally:
        if writer.is_alive():
            # Still in open() (no reader came) or in a write nobody reads (the restore
            # stopped reading): what is left is read here and dropped, so the writer ends.
            _drain(dest, writer, timeout)
        writer.join(timeout)
        with contextlib.suppress(OSError):
            dest.unlink()
    if failed:
        raise TestbedError(f"{src}: streaming the save image failed: {failed[0]}")


def _drain(fifo: Path, writer, timeout: float) -> None:
    try:
        fd = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return
    try:
        deadline = time.monotonic() + timeout
        while writer.is_alive() and time.monotonic() < deadline:
            try:
                if not os.read(fd, 1 << 20):
                    writer.join(0.01)       # no writer yet, or it has just closed
            except BlockingIOError:
                writer.join(0.01)
    finally:
        os.close(fd)
