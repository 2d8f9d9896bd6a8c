"""sshd's privilege-separation folder, shared by tests on several workers: made if missing,
kept while any test still uses it, removed by the last one out, and never removed when it
was there before (a host's own)."""
from __future__ import annotations

import contextlib

import pytest

from testbed._suite_plugin import sshd_privsep_dir


@pytest.fixture()
def state(tmp_path, monkeypatch):
    monkeypatch.setenv("TESTBED_STATE", str(tmp_path / "state"))
    return tmp_path


def test_the_first_user_out_leaves_it_for_the_last(state):
    d = state / "run-sshd"
    first, second = contextlib.ExitStack(), contextlib.ExitStack()
    first.enter_context(sshd_privsep_dir(d))
    assert d.is_dir()
    second.enter_context(sshd_privsep_dir(d))
    first.close()               # one test ends while the other's sshd still needs the folder
    assert d.is_dir()
    second.close()
    assert not d.exists()


def test_the_last_user_removes_it_even_when_it_came_in_second(state):
    d = state / "run-sshd"
    with sshd_privsep_dir(d):
        with sshd_privsep_dir(d):
            (d / "x").write_text("")
        assert d.is_dir()
    assert not d.exists()
    with sshd_privsep_dir(d):   # and a later test makes it afresh
        assert d.is_dir()
    assert not d.exists()


def test_a_folder_that_was_there_before_stays(state):
    d = state / "run-sshd"
    d.mkdir()
    with sshd_privsep_dir(d), sshd_privsep_dir(d):
        pass
    assert d.is_dir()


def test_a_failure_inside_still_lets_the_last_one_out_remove_it(state):
    d = state / "run-sshd"
    with pytest.raises(RuntimeError), sshd_privsep_dir(d):
        raise RuntimeError("sshd did not start")
    assert not d.exists()
