"""Run tags are four hex digits drawn at random: beside other runs (a shared host, a test
suite's workers) or a dead run's state folder, a drawn tag is now and then taken. A run, a
claimed tag and the extra pairs of a namespace cell then draw again; they are never refused
with FileExistsError (as a capacity run was, beside a test suite's other workers)."""
from __future__ import annotations

import json
import os

import pytest

from testbed import errors
from testbed.admin import cleanup
from testbed.measure import session


@pytest.fixture()
def state(tmp_path, monkeypatch):
    d = tmp_path / "state"
    monkeypatch.setenv("TESTBED_STATE", str(d))
    d.mkdir()
    return d


TOPOLOGY = """\
guests: [{name: g1}, {name: g2}]
matrix:
  attachments: [netns-veth]
  profiles: [{name: s, tool: iperf3, protocol: tcp, pattern: stream}]
"""


def taken(state, *tags):
    for t in tags:
        (state / f"tb-{t}").mkdir()
        (state / f"tb-{t}" / "owner.json").write_text(json.dumps({"pid": 1, "run_id": f"other-{t}"}))


def draws(*pairs):
    it = iter(pairs)
    return lambda: next(it)


def test_a_taken_tag_is_drawn_again_and_the_other_runs_folder_is_left_as_it_was(state):
    taken(state, "aaaa", "bbbb")
    with cleanup.owned_fresh_state(draws(("r-aaaa", "aaaa"), ("r-bbbb", "bbbb"), ("r-cccc", "cccc"))) as got:
        run_id, tag, d = got
        assert (run_id, tag, d) == ("r-cccc", "cccc", state / "tb-cccc")
        owner = json.loads((d / "owner.json").read_text())
        assert owner["pid"] == os.getpid() and owner["run_id"] == "r-cccc"
        for t in ("aaaa", "bbbb"):
            assert json.loads((state / f"tb-{t}" / "owner.json").read_text())["run_id"] == f"other-{t}"
    assert not (state / "tb-cccc").exists() and (state / "tb-aaaa").is_dir()
    # no half-made folder of a refused draw is left behind
    assert sorted(p.name for p in state.iterdir()) == ["tb-aaaa", "tb-bbbb"]


def test_the_fixed_tag_form_still_refuses_a_taken_tag(state):
    taken(state, "aaaa")
    with pytest.raises(FileExistsError, match="tb-aaaa"):
        with cleanup.owned_state("aaaa", "r-aaaa"):
            pass


def test_a_state_folder_full_of_tags_is_one_clear_error(state):
    taken(state, "aaaa")
    with pytest.raises(errors.TestbedError) as e:
        cleanup.register_fresh(lambda: ("r-aaaa", "aaaa"), lambda r: {"run_id": r})
    text = str(e.value)
    assert f"{cleanup.TAG_DRAWS} draws" in text and str(state) in text and "\n" not in text


def test_a_claimed_tag_draws_again(state, monkeypatch):
    from testbed.records import results
    taken(state, "aaaa")
    monkeypatch.setattr(results, "new_run_id", draws(("r-aaaa", "aaaa"), ("r-dddd", "dddd")))
    tag = session.claim_tag()
    try:
        assert tag == "dddd" and json.loads((state / "tb-dddd" / "owner.json").read_text())["claimed"]
    finally:
        session.release_tag(tag)
    assert not (state / "tb-dddd").exists()


def test_a_session_whose_tag_is_taken_runs_under_a_fresh_one(state, monkeypatch):
    from testbed.records import results
    from testbed.topology import config
    topo = config.parse(TOPOLOGY, "t.yaml")
    monkeypatch.setattr(results, "new_run_id", draws(("20990101T000000Z-aaaa", "aaaa"),
                                                     ("20990101T000001Z-eeee", "eeee")))
    taken(state, "aaaa")
    s = session.Session(topo, lock=False, check_leftovers=False)
    assert s.tag == "aaaa"
    with s:
        assert (s.run_id, s.tag, s.state) == ("20990101T000001Z-eeee", "eeee", state / "tb-eeee")
        assert json.loads((s.state / "owner.json").read_text())["run_id"] == s.run_id
    assert not (state / "tb-eeee").exists()


def test_a_resumed_session_keeps_its_run_id_under_a_fresh_tag(state, monkeypatch, tmp_path):
    from testbed.records import results
    from testbed.topology import config
    topo = config.parse(TOPOLOGY, "t.yaml")
    monkeypatch.setattr(results, "new_run_id", draws(("20990101T000000Z-aaaa", "aaaa"),
                                                     ("20990101T000001Z-ffff", "ffff")))
    taken(state, "aaaa")
    old = tmp_path / "results" / "20980101T000000Z-1234"
    old.mkdir(parents=True)
    with session.Session(topo, lock=False, check_leftovers=False, resume=old) as s:
        assert (s.run_id, s.tag) == ("20980101T000000Z-1234", "ffff")
