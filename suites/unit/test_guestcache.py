"""Snapshot cache of booted guests: the restore XML, the save image rewrite, keys and the
cache layout. The XML is the one libvirt stored in a real save image on this machine
(saveImageGetXMLDesc of a testbed guest)."""
from __future__ import annotations

import dataclasses
import json
import os
import stat
import struct
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from testbed import errors
from testbed.guests import guestcache

SAVED = (Path(__file__).parent / "fixtures" / "libvirt-save-image-domain.xml").read_text()


def _restore(**kw) -> ET.Element:
    args = dict(name="tb-abcd-g1", uuid="11111111-2222-3333-4444-555555555555", run_id="R1",
                disk="/var/lib/testbed/tb-abcd/tb-abcd-g1.qcow2", seed="/var/cache/testbed/snapshots/s/seed.iso",
                console_log="/var/lib/testbed/tb-abcd/tb-abcd-g1.console.log")
    args.update(kw)
    return ET.fromstring(guestcache.restore_xml(SAVED, **args))


def test_restore_xml_replaces_what_is_the_guests_own():
    x = _restore()
    assert x.findtext("name") == "tb-abcd-g1"
    assert x.findtext("uuid") == "11111111-2222-3333-4444-555555555555"
    assert "tb-abcd-g1" in x.findtext("title") and "R1" in x.findtext("title")
    assert x.find(".//{https://testbed.invalid/xmlns/1}run").text == "R1"
    src = {d.find("target").get("dev"): d.find("source").get("file") for d in x.iter("disk")}
    assert src == {"vda": "/var/lib/testbed/tb-abcd/tb-abcd-g1.qcow2",
                   "vdb": "/var/cache/testbed/snapshots/s/seed.iso"}
    assert {l.get("file") for l in x.iter("log")} == {"/var/lib/testbed/tb-abcd/tb-abcd-g1.console.log"}
    text = ET.tostring(x, encoding="unicode")
    assert "tb-7f21" not in text and "14e0e872" not in text


def test_restore_xml_keeps_devices_and_machine():
    before, after = ET.fromstring(SAVED), _restore()
    addrs = lambda e: sorted(ET.tostring(a, encoding="unicode") for a in e.iter("address"))  # noqa: E731
    assert addrs(before) == addrs(after) and addrs(after)
    assert before.find("os/type").get("machine") == after.find("os/type").get("machine")


def _image(path: Path, xml: str, stream: bytes, data_len: int = 8192) -> None:
    cookie = b"<qemuDomainSaveCookie/>"
    data = xml.encode() + b"\0"
    off = len(data)
    data = (data + cookie + b"\0").ljust(data_len, b"\0")
    path.write_bytes(struct.pack("<16s5I14I", b"LibvirtQemudSave", 2, data_len, 1, 0, off, *[0] * 14)
                     + data + stream)


def _read_fifo(path: Path, limit: int | None = None) -> bytes:
    with open(path, "rb") as f:
        return f.read() if limit is None else f.read(limit)


def test_streamed_image_rewrites_xml_and_keeps_stream_and_cookie(tmp_path):
    src, dst = tmp_path / "a.save", tmp_path / "b.save"
    stream = os.urandom(3_000_000)      # more than the FIFO holds: the writer waits for the reader
    _image(src, SAVED, stream, data_len=len(SAVED) + 4096)
    assert guestcache.read_image_xml(src) == SAVED
    new = guestcache.restore_xml(SAVED, name="tb-beef-g1", uuid="u", run_id="r", disk="d", seed="s",
                                 console_log="c")
    with guestcache.streamed_image(src, dst, new):
        assert stat.S_ISFIFO(dst.stat().st_mode)
        b = _read_fifo(dst)
    assert not dst.exists()
    magic, version, data_len, running, compressed, cookie_off, *_ = struct.unpack("<16s5I14I", b[:92])
    assert (magic, version, running, compressed) == (b"LibvirtQemudSave", 2, 1, 0)
    assert b[92:92 + data_len].split(b"\0", 1)[0].decode() == new
    assert b[92 + cookie_off:].startswith(b"<qemuDomainSaveCookie/>\0")
    assert b[92 + data_len:] == stream
    assert len(b) == src.stat().st_size


@pytest.mark.parametrize("read", [None, 0, 100_000])
def test_a_stream_nobody_reads_to_the_end_is_let_go(tmp_path, read):
    """A restore that failed before libvirt opened the image (None), or opened it and
    stopped reading (0, 100 kB): leaving the context ends the writer at once."""
    import threading
    import time
    src, dst = tmp_path / "a.save", tmp_path / "b.save"
    _image(src, SAVED, os.urandom(5_000_000), data_len=len(SAVED) + 4096)
    before = threading.active_count()
    t = time.monotonic()
    with guestcache.streamed_image(src, dst, SAVED):
        if read is not None:
            assert len(_read_fifo(dst, read + 1)) == read + 1
    assert time.monotonic() - t < 10
    assert threading.active_count() == before and not dst.exists()


def test_streamed_image_refuses_what_is_not_a_save_image(tmp_path):
    bad = tmp_path / "x"
    bad.write_bytes(b"\0" * 200)
    with pytest.raises(errors.TestbedError, match="not an uncompressed libvirt save image"):
        with guestcache.streamed_image(bad, tmp_path / "y", "<domain/>"):
            pass
    small = tmp_path / "s"
    _image(small, "<domain/>", b"x", data_len=64)
    with pytest.raises(errors.TestbedError, match="exceeds"):
        with guestcache.streamed_image(small, tmp_path / "y", "<domain>" + "x" * 100 + "</domain>"):
            pass
    assert not (tmp_path / "y").exists()


KEY = guestcache.Key(slot="g1", image_digest="d1", memory_mib=1024, vcpus=1, hotplug_slots=4,
                     accelerator="tcg", machine="pc-q35-7.2", qemu_version=7002022, libvirt_version=9000000,
                     host_cpu="cpu", templates="t", kernel_cmdline="root=/dev/vda")


def _commit(key: guestcache.Key) -> guestcache.Snapshot:
    b = guestcache.Builder(key)
    for f in (b.state, b.disk, b.seed):
        f.write_bytes(b"x")
    return b.commit("tb-abcd-g1", "uuid", 1.0)


def test_every_key_field_changes_the_digest():
    for f in dataclasses.fields(KEY):
        v = getattr(KEY, f.name)
        other = dataclasses.replace(KEY, **{f.name: v + 1 if isinstance(v, int) else v + "x"})
        assert other.digest != KEY.digest, f.name


def test_cache_lookup_names_what_changed(tmp_path, monkeypatch):
    monkeypatch.setenv("TESTBED_CACHE", str(tmp_path))
    snap, why = guestcache.lookup(KEY)
    assert snap is None and "no snapshot of guest g1" in why
    made = _commit(KEY)
    assert made.folder == tmp_path / "snapshots" / KEY.folder_name
    assert not list((tmp_path / "snapshots").glob("tb-*")), "temporary folder left"
    assert oct(made.disk.stat().st_mode & 0o777) == oct(0o444)
    snap, why = guestcache.lookup(KEY)
    assert snap == made and why == ""
    snap, why = guestcache.lookup(dataclasses.replace(KEY, memory_mib=2048))
    assert snap is None and "memory_mib 1024 -> 2048" in why
    assert json.loads((made.folder / "manifest.json").read_text())["method"] == guestcache.METHOD


def test_partial_snapshot_is_not_used_and_prunable_once_its_writer_died(tmp_path, monkeypatch):
    monkeypatch.setenv("TESTBED_CACHE", str(tmp_path))
    b = guestcache.Builder(KEY)
    assert guestcache.lookup(KEY)[0] is None
    assert guestcache.partial() == [b.tmp]
    assert not guestcache.writer_dead(b.tmp)       # this process writes it
    dead = b.tmp.with_name(f"tb-snap-{KEY.folder_name}-999999999-zz")
    b.tmp.rename(dead)
    assert guestcache.writer_dead(dead)


def test_cache_list_and_prune(tmp_path, monkeypatch, capsys):
    from testbed import cli
    monkeypatch.setenv("TESTBED_CACHE", str(tmp_path))
    foreign = tmp_path / "images" / "someone-else-0123456789abcdef"
    foreign.mkdir(parents=True)
    stale = tmp_path / "images" / "debian12-0000000000000000"
    stale.mkdir()
    made = _commit(KEY)
    dead = tmp_path / "snapshots" / f"tb-snap-{KEY.folder_name}-999999999-zz"
    dead.mkdir()
    assert cli.main(["cache", "list"]) == 0
    out = capsys.readouterr().out
    assert KEY.folder_name in out and "someone-else" in out and "foreign" in out and "stale" in out
    assert "partial" in out
    assert cli.main(["cache", "prune", "--images"]) == 0
    assert not made.folder.exists() and not dead.exists() and not stale.exists()
    assert foreign.exists(), "an image of a recipe this checkout does not have was pruned"


def test_prune_stale_removes_snapshots_of_an_earlier_build_of_the_current_image(tmp_path, monkeypatch, capsys):
    from testbed import cli
    from testbed.guests import images
    monkeypatch.setenv("TESTBED_CACHE", str(tmp_path))
    recipe = images.load_recipe()
    folder = tmp_path / "images" / f"{recipe.name}-{recipe.digest()}"
    folder.mkdir(parents=True)
    (folder / images.DISK).write_bytes(b"disk")
    build = images.build_of(folder / images.DISK)
    this = _commit(dataclasses.replace(KEY, slot="a", image_digest=recipe.digest(), image_build=build))
    earlier = _commit(dataclasses.replace(KEY, slot="b", image_digest=recipe.digest(), image_build="1-2"))
    unnamed = _commit(dataclasses.replace(KEY, slot="c", image_digest=recipe.digest()))     # saved before keys named builds
    gone = _commit(dataclasses.replace(KEY, slot="d", image_build=build))                   # another image's digest
    assert cli.main(["cache", "list"]) == 0
    out = capsys.readouterr().out
    line = {s.folder.name: next(ln for ln in out.splitlines() if s.folder.name in ln)
            for s in (this, earlier, unnamed, gone)}
    assert "stale" not in line[this.folder.name]
    assert "an earlier build of its image" in line[earlier.folder.name] and "earlier build" in line[unnamed.folder.name]
    assert "no longer current" in line[gone.folder.name]
    assert cli.main(["cache", "prune", "--stale"]) == 0
    assert this.folder.exists() and not earlier.folder.exists() and not unnamed.folder.exists()
    assert not gone.folder.exists() and folder.exists()


BUILD_CHILD = """
import sys, time
from testbed.guests import images
from testbed.host import proc
proc.run = lambda *a, **k: time.sleep(600)     # stand in for mmdebstrap: the build hangs
images.build(images.load_recipe())
"""


def test_an_image_build_killed_midway_is_found_and_removed_by_cleanup(tmp_path, monkeypatch):
    """SIGKILL skips images.build's own clean-up: its tb-build- folder then carries the dead
    builder's pid, which is what lets `testbed cleanup` remove it (and never a live build's)."""
    import signal
    import subprocess
    import sys
    import time

    from testbed.admin import cleanup
    from testbed.guests import images
    monkeypatch.setenv("TESTBED_CACHE", str(tmp_path))
    child = subprocess.Popen([sys.executable, "-c", BUILD_CHILD], env={**os.environ, "TESTBED_CACHE": str(tmp_path)})
    try:
        deadline = time.monotonic() + 60
        while not images.partial_builds() and time.monotonic() < deadline:
            time.sleep(0.05)
        [work] = images.partial_builds()
        assert f"-{child.pid}-" in work.name
        assert not guestcache.writer_dead(work), "a live build must not look dead"
        child.send_signal(signal.SIGKILL)
        child.wait(30)
    finally:
        child.kill()
    assert work.is_dir(), "SIGKILL left nothing to clean: the test proves nothing"
    assert guestcache.writer_dead(work)
    cleanup.remove(cleanup.Leftovers(partial_builds=[str(work)]))
    assert not work.exists() and images.partial_builds() == []


def test_waiting_for_the_host_returns_when_the_run_ends_or_its_holder_is_dead(tmp_path, monkeypatch):
    """Tests told "in progress on this host" go on the moment the other run releases the
    lock (its holder line cleared), not after a fixed pause; a dead holder's line is free."""
    import threading
    import time

    from testbed.admin import cleanup
    monkeypatch.setattr(cleanup, "lock_path", lambda: tmp_path / "run.lock")
    assert cleanup.wait_host_free(0)                                   # no lock file yet
    release = threading.Event()

    def run() -> None:
        with cleanup.host_lock("20990101T000000Z-abcd", shared=False):
            release.wait(5)
    th = threading.Thread(target=run)
    th.start()
    while not ((tmp_path / "run.lock").exists() and (tmp_path / "run.lock").read_text()):
        time.sleep(0.01)
    assert not cleanup.wait_host_free(0.2)                             # held by a live process
    threading.Timer(0.3, release.set).start()
    t0 = time.monotonic()
    assert cleanup.wait_host_free(10)
    assert time.monotonic() - t0 < 2
    th.join()
    (tmp_path / "run.lock").write_text("20990101T000000Z-dead pid 999999999\n")
    assert cleanup.wait_host_free(0)                                   # its holder died


def test_shared_runs_hold_the_host_together_and_a_run_alone_is_refused(tmp_path, monkeypatch):
    """--shared-host: shared runs hold the lock at once; a run that wants the host alone is
    refused while any goes on (named from its state folder), and waits see the host busy
    until the last one ends; a shared run is refused while one holds it alone."""
    import contextlib

    from testbed.admin import cleanup
    from testbed.errors import LeftoversError
    monkeypatch.setattr(cleanup, "lock_path", lambda: tmp_path / "run.lock")
    monkeypatch.setenv("TESTBED_STATE", str(tmp_path / "state"))
    with contextlib.ExitStack() as stack:
        stack.enter_context(cleanup.owned_state("abcd", "20990101T000000Z-abcd"))
        stack.enter_context(cleanup.host_lock("20990101T000000Z-abcd", shared=True))
        second = stack.enter_context(contextlib.ExitStack())
        second.enter_context(cleanup.host_lock("20990101T000000Z-beef", shared=True))   # beside it
        with pytest.raises(LeftoversError, match=r"run \(shared\) 20990101T000000Z-abcd pid \d+ in progress"):
            with cleanup.host_lock("20990101T000000Z-cafe", shared=False):
                pass
        assert not cleanup.wait_host_free(0.1)
        second.close()
        assert not cleanup.wait_host_free(0.1)          # the first still holds it
    assert cleanup.wait_host_free(0)
    with cleanup.host_lock("20990101T000000Z-cafe", shared=False):
        with pytest.raises(LeftoversError, match="run 20990101T000000Z-cafe pid"):
            with cleanup.host_lock("20990101T000000Z-beef", shared=True):
                pass


def test_a_rebuilt_image_of_the_same_recipe_is_another_build(tmp_path):
    """A cached image removed and built again from the same recipe keeps the recipe's digest
    but not its blocks: a guest state saved on the old build and restored on the new one
    failed its first command ("Bad message"). The build is part of the snapshot key."""
    from testbed.guests import images
    disk = tmp_path / "root.qcow2"
    disk.write_bytes(b"first build")
    first = images.build_of(disk)
    assert first and images.build_of(disk) == first
    fresh = tmp_path / "new.qcow2"
    fresh.write_bytes(b"second build")
    os.replace(fresh, disk)                 # how a build lands: a new file put in place
    assert images.build_of(disk) not in ("", first)
    assert dataclasses.replace(KEY, image_build=first).digest != dataclasses.replace(
        KEY, image_build=images.build_of(disk)).digest
    assert images.build_of(tmp_path / "missing") == ""
