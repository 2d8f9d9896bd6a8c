"""A host-wide thing several processes use at once (tracefs, sshd's privilege separation
folder), with real flocks: made by the first user when missing, kept while any user in any
process holds it, removed by the last one out only if a user made it."""
from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from testbed.host import shareduse


@pytest.fixture
def state(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("TESTBED_STATE", str(tmp_path / "state"))
    return tmp_path


def _held(thing: Path):
    return shareduse.held("tb-thing", thing.is_dir, thing.mkdir, thing.rmdir)


def test_the_last_user_out_removes_what_a_user_made(state):
    thing = state / "thing"
    with _held(thing):
        assert thing.is_dir()
        with _held(thing):                  # a second user in the same process
            pass
        assert thing.is_dir()               # the first still holds it
    assert not thing.exists() and not shareduse.left("tb-thing")


def test_a_thing_the_host_had_stays(state):
    thing = state / "thing"
    thing.mkdir()
    with _held(thing):
        pass
    assert thing.is_dir()


def test_a_user_in_another_process_keeps_it_and_removes_it_when_it_leaves(state):
    thing = state / "thing"
    child = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import sys
        from pathlib import Path
        from testbed.host import shareduse
        thing = Path({str(thing)!r})
        with shareduse.held("tb-thing", thing.is_dir, thing.mkdir, thing.rmdir):
            print("in", flush=True)
            sys.stdin.readline()
        """)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "in"
        assert thing.is_dir()                                   # the child made it
        with _held(thing):
            pass
        assert thing.is_dir()                                   # the child still holds it
        assert shareduse.holders(state / "state" / "tb-thing.users") == {child.pid}
    finally:
        child.communicate("go\n", timeout=30)
    assert child.returncode == 0 and not thing.exists()         # the child was the last out


def test_a_user_that_died_leaves_a_leftover_the_next_last_one_removes(state):
    thing = state / "thing"
    child = subprocess.run([sys.executable, "-c", textwrap.dedent(f"""
        import os
        from pathlib import Path
        from testbed.host import shareduse
        thing = Path({str(thing)!r})
        with shareduse.held("tb-thing", thing.is_dir, thing.mkdir, thing.rmdir):
            os._exit(0)                     # dies inside: no removal
        """)], timeout=30)
    assert child.returncode == 0 and thing.is_dir() and shareduse.left("tb-thing")
    with _held(thing):
        pass
    assert not thing.exists() and not shareduse.left("tb-thing")
