"""The suite's own time machinery (suites/suite_time.py): the quick tier's selection and the
critical path printed after a session."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import suite_time as st

ROOT = Path(__file__).resolve().parents[2]


def test_quick_selection_keeps_the_unit_tier_and_the_listed_root_tests_first():
    ids = ["suites/unit/test_a.py::test_x", "suites/netns/test_n.py::test_run", "suites/netns/test_n.py::test_other",
           "suites/vm/test_v.py::test_cell[a]", "suites/unit/test_b.py::test_y", "suites/store/test_s.py::test_z"]
    kept, missing = st.quick_selection(ids, ["suites/vm/test_v.py::test_cell[a]", "suites/netns/test_n.py::test_run"])
    assert kept == ["suites/vm/test_v.py::test_cell[a]", "suites/netns/test_n.py::test_run",
                    "suites/unit/test_a.py::test_x", "suites/unit/test_b.py::test_y"]
    assert missing == []
    # a listed test its collected module no longer has is missing; one whose module was not
    # collected (pytest suites/unit --quick) is simply not run
    _, missing = st.quick_selection(ids, ["suites/netns/test_n.py::test_renamed", "suites/vm/test_gone.py::test_t"])
    assert missing == ["suites/netns/test_n.py::test_renamed"]


def test_quick_selection_leaves_the_long_unit_tests_to_the_whole_suite():
    ids = ["suites/unit/test_a.py::test_x", "suites/unit/test_g.py::test_long[1]", "suites/unit/test_g.py::test_long[2]",
           "suites/unit/test_g.py::test_longer", "suites/unit/test_g.py::test_marked[a]"]
    kept, _ = st.quick_selection(ids, [], ["suites/unit/test_g.py::test_long", "suites/unit/test_g.py::test_marked[a]",
                                           "suites/unit/test_gone.py::test_t"])
    # every case of a listed test, one case by its own id; a name that only starts alike stays
    assert kept == ["suites/unit/test_a.py::test_x", "suites/unit/test_g.py::test_longer"]
    # the listed long tests exist: the list is not quietly stale
    modules = {t.split("::", 1)[0] for t in st.QUICK_LEAVES_OUT}
    for t in st.QUICK_LEAVES_OUT:
        assert f"def {t.split('::', 1)[1]}(" in (ROOT / t.split("::", 1)[0]).read_text(), t
    assert len(modules) >= 3


def test_the_quick_tier_collects_its_listed_tests():
    """The listed tests' modules (and one unit module) collected with --quick: the listed tests
    exist under these ids and come first, then the unit tier; the rest is deselected."""
    modules = sorted({t.split("::", 1)[0] for t in st.QUICK_ROOT_TESTS})
    p = subprocess.run([sys.executable, "-m", "pytest", *modules, "suites/unit/test_suite_time.py", "--quick",
                        "--collect-only", "-q", "-p", "no:cacheprovider"],
                       capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    ids = [ln for ln in p.stdout.splitlines() if ln.startswith("suites/")]
    assert ids[:len(st.QUICK_ROOT_TESTS)] == list(st.QUICK_ROOT_TESTS)
    assert ids[len(st.QUICK_ROOT_TESTS):] and all(i.startswith("suites/unit/") for i in ids[len(st.QUICK_ROOT_TESTS):])
    assert "deselected" in p.stdout


def _timeline() -> st.Timeline:
    tl = st.Timeline()
    # gw0: a long guest module; gw1: unit tests, then a short module
    for phase, (dur, start) in enumerate([(2.0, 100.0), (60.0, 102.0), (1.0, 162.0)]):
        tl.add("gw0", "suites/vm/test_cli.py::test_run", dur, start, start + dur)
    tl.add("gw0", "suites/vm/test_cli.py::test_other", 30.0, 163.0, 193.0)
    tl.add("gw0", "suites/vm/test_pair.py::test_cell", 10.0, 193.0, 203.0)
    for i in range(50):
        tl.add("gw1", f"suites/unit/test_u.py::test_{i}", 1.0, 100.5 + i, 101.5 + i)
    tl.add("gw1", "suites/netns/test_n.py::test_run", 20.0, 151.0, 171.0)
    return tl


def test_critical_path_names_the_worker_that_ended_last_and_what_held_it():
    cp = st.critical_path(_timeline())
    assert cp["critical"] == "gw0"
    assert cp["workers"]["gw0"] == {"tests": 3, "busy_s": 103.0, "end_s": 103.0}
    assert cp["workers"]["gw1"] == {"tests": 51, "busy_s": 70.0, "end_s": 71.0}
    assert cp["top_tests"][0] == ("suites/vm/test_cli.py::test_run", 63.0)
    assert cp["top_modules"] == [("suites/vm/test_cli.py", 93.0), ("suites/vm/test_pair.py", 10.0)]
    lines = st.format_critical_path(cp)
    assert lines[0].startswith("worker gw0 ended last: its 3 tests held it 103.0 s")
    assert any(ln.strip().startswith("gw0") and ln.endswith("<- critical") for ln in lines)
    assert st.format_critical_path(st.critical_path(st.Timeline())) == []


@pytest.mark.parametrize("stops", [True, False])
def test_critical_path_without_times_of_day(stops):
    """A report without start and stop (an older pytest) still gives busy times."""
    tl = st.Timeline()
    tl.add("main", "suites/unit/test_u.py::test_a", 1.5, 5.0 if stops else None, 6.5 if stops else None)
    cp = st.critical_path(tl)
    assert cp["workers"]["main"]["busy_s"] == 1.5
    assert cp["workers"]["main"]["end_s"] == (1.5 if stops else None)
