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
