"""testbed.measure.session: the one set-up of runs, scenarios, benchmarks and measuring pytest
sessions. Its owner registration keeps a live run's tb- objects from being taken for a dead
run's; its leftovers check refuses to start beside a dead run's objects, creating nothing."""
from __future__ import annotations

import fcntl
import json
import os

import pytest

from testbed.admin import cleanup
from testbed.errors import LeftoversError
from testbed.host import paths
from testbed.host.net import links
from testbed.measure.session import Session, claim_tag, release_tag
from testbed.pytest_plugin import require_root
from testbed.records import results
from testbed.topology.config import default

# alone: dead runs' objects, cleanup of them, and the host lock free between sessions
pytestmark = pytest.mark.alone


def _lock_free() -> bool:
    fd = os.open(cleanup.lock_path(), os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        return False
    finally:
        os.close(fd)


def test_a_claimed_tag_is_alive_until_released():
    require_root()
    tag = claim_tag()
    name = f"tb-{tag}-x"
    with links.veth(name, f"tb-{tag}-xp", 1500):
        assert tag in cleanup.live_tags()
        assert name not in cleanup.find().links         # a concurrent cleanup leaves it alone
        release_tag(tag)
        assert tag not in cleanup.live_tags()
        assert name in cleanup.find().links              # unowned now: a dead run's
    assert not (paths.state_dir() / f"tb-{tag}").exists()


def test_session_registers_its_run_and_finishes_the_record(tmp_path):
    require_root()
    if not _lock_free():
        pytest.skip("another run holds the host lock")
    with Session(default(), results_dir=tmp_path, keep_logs=False) as ses:
        owner = json.loads((ses.state / "owner.json").read_text())
        assert owner["pid"] == os.getpid() and owner["run_id"] == ses.run_id
        assert ses.tag in cleanup.live_tags() and not _lock_free()
        w = ses.open_run(None)
        assert w.dir == tmp_path / ses.run_id
    assert not ses.state.exists() and _lock_free()
    run = results.read_run(tmp_path / ses.run_id).run
    assert run["status"] == "complete" and run["environment"]["accelerator"] == "none"
    assert run["environment"]["kernel"] == os.uname().release


def test_session_refuses_beside_a_dead_runs_objects_and_creates_nothing(tmp_path):
    require_root()
    if not _lock_free():
        pytest.skip("another run holds the host lock")
    tag = claim_tag()
    dead = f"tb-{tag}-x"
    with links.veth(dead, f"tb-{tag}-xp", 1500):
        release_tag(tag)                                 # its owner is gone: a dead run's link
        before = set(paths.state_dir().iterdir())
        with pytest.raises(LeftoversError, match=dead):
            with Session(default(), results_dir=tmp_path):
                pass
        assert set(paths.state_dir().iterdir()) == before and not list(tmp_path.iterdir())
        assert _lock_free()


def test_a_dead_domains_libvirt_log_is_found_and_removed_but_does_not_stop_a_run(tmp_path):
    """libvirt keeps a domain's log in its log folder after the domain is gone. One of a
    dead run's domains is found and removed by cleanup; a live run's is left alone; a run
    may start beside a dead one's (it is a file, and disturbs nothing)."""
    require_root()
    if not paths.QEMU_LOG_DIR.is_dir():
        pytest.skip(f"{paths.QEMU_LOG_DIR} missing (libvirt's QEMU driver not installed)")
    if not _lock_free():
        pytest.skip("another run holds the host lock")
    dead, live = claim_tag(), claim_tag()
    dead_log, live_log = paths.QEMU_LOG_DIR / f"tb-{dead}-g1.log", paths.QEMU_LOG_DIR / f"tb-{live}-g1.log"
    try:
        for f in (dead_log, live_log):
            f.write_text("2026-01-01 00:00:00.000+0000: starting up\n")
        release_tag(dead)
        found = cleanup.find()
        assert dead_log.name in found.domain_logs and live_log.name not in found.domain_logs
        with Session(default(), results_dir=tmp_path, keep_logs=False):
            pass                                          # not refused because of it
        cleanup.remove(found)
        assert not dead_log.exists() and live_log.exists()
    finally:
        release_tag(live)
        for f in (dead_log, live_log):
            f.unlink(missing_ok=True)
