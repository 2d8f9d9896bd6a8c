"""The suite's time: the quick tier (``--quick``) and the critical path printed after a session.

Registered by suites/conftest.py (``pytest_plugins``), so it is the project's own machinery,
not part of the testbed's public pytest plugin.

**Quick tier** (``./tb test --quick``): the unit tier plus one real namespace run and one
cell measured between restored guests (QUICK_ROOT_TESTS), without the unit tier's longest
statistical replays (QUICK_LEAVES_OUT, or marked ``slow``), a few minutes in all, for a change
that does not need the whole suite. The root tests go out first, so the workers take the unit
tier beside them; everything else is deselected. A listed test that its module no longer
has is an error, not a quieter tier.

**Critical path**: after a session, which worker ended last, how long its tests held it,
and which of them held it longest (with xdist each root-tier module goes whole to one worker,
so one long module decides the session's length); every worker's busy time beside it.
"""
from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

import pytest

#: the root tests the quick tier runs besides the unit tier
QUICK_ROOT_TESTS = (
    # `testbed run`'s runner on a namespace pair: plumbing, tools, samples, the run record
    "suites/netns/test_netns_run.py::test_offloads_switched_for_the_run_and_recorded",
    # the session's guest pair, restored from the snapshot cache (booted cold and saved the
    # first time), one cell measured through a Linux bridge with the wire cross-check
    "suites/vm/test_pair.py::test_cell_measures[bridge-qemu-mtu1500-conn1-tcp_stream]",
)
#: unit tests the quick tier leaves to the whole suite: long statistical replays (hundreds
#: of seeds or cells), repeated pytest start-ups and the docs site's build; about 20 of the
#: unit tier's 1,200 tests, about two thirds of its time. They check designs, plugins and
#: the site, not a parser or a renderer; a test marked ``slow`` is left out the same way.
#: An entry no test matches any more is simply unused.
QUICK_LEAVES_OUT = (
    "suites/unit/test_sequential.py::test_the_design_replayed_meets_its_targets_at_small_size",
    "suites/unit/test_gate.py::test_hundred_unchanged_cells_over_many_seeds_give_at_most_one_regression",
    "suites/unit/test_gate.py::test_heterogeneous_noise_stays_controlled",
    "suites/unit/test_bench_gate.py::test_a_cell_failing_nine_of_ten_samples_is_broken_among_200",
    "suites/unit/test_bench_gate.py::test_one_transient_failure_among_200_unchanged_cells_does_not_fail_the_gate",
    "suites/unit/test_examples.py::test_pytest_example_collects_the_modes_attach_names",
    "suites/unit/test_examples.py::test_pytest_describes_every_testbed_option_fixture_and_marker",
    "suites/unit/test_gate.py::test_five_of_a_hundred_cells_dropped_by_fifteen_percent_at_n5_over_many_seeds",
    "suites/unit/test_gate.py::test_five_of_a_hundred_cells_dropped_by_twelve_percent_at_the_gate_preset_max",
    "suites/unit/test_gate.py::test_hundred_unchanged_cells_with_3pct_noise_give_at_most_one_regression",
    "suites/unit/test_bench_gate.py::test_history_finds_a_lasting_five_percent_step_within_a_week_and_rarely_alarms",
    "suites/unit/test_sequential.py::test_the_stopping_rule_does_not_inflate_the_moderated_false_alarm_rate",
    "suites/unit/test_sequential.py::test_a_transient_failure_among_200_unchanged_cells_is_measured_again_not_red",
    "suites/unit/test_tailgate.py::test_integer_p99_up_twenty_percent_in_ten_of_a_hundred_cells_is_found",
    # a pytest of its own that collects with --quick: a quick run checks its ids itself
    "suites/unit/test_suite_time.py::test_the_quick_tier_collects_its_listed_tests",
    # the docs site built and every page opened in a browser: docs, not code
    "suites/unit/test_site.py::test_the_site_builds_and_every_page_renders_in_a_browser",
)
#: the config fuzzer's examples in the quick tier (the whole suite: 300, test_fuzz_config)
QUICK_FUZZ_EXAMPLES = "60"
#: how many of the critical worker's tests and modules the summary lists
TOP = 8


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.getgroup("testbed").addoption(
        "--quick", action="store_true", default=False,
        help="the quick tier: the unit tier, one namespace run and one restored-guest cell")


def quick_selection(nodeids: Iterable[str], quick: Iterable[str] = QUICK_ROOT_TESTS,
                    leave_out: Iterable[str] = QUICK_LEAVES_OUT) -> tuple[list[str], list[str]]:
    """Pure: (kept, missing) for the quick tier over collected ``nodeids``: the unit tier
    but the tests in ``leave_out`` (a parametrized test's every case), and the ``quick``
    tests, those first; ``missing``: quick tests whose module was collected without them
    (renamed or removed)."""
    ids = list(nodeids)
    quick = list(quick)
    out = tuple(leave_out)
    present = set(ids)
    modules = {i.split("::", 1)[0] for i in ids}
    missing = [q for q in quick if q not in present and q.split("::", 1)[0] in modules]
    kept = [q for q in quick if q in present] + [
        i for i in ids if i.startswith("suites/unit/") and i not in out and i.split("[", 1)[0] not in out]
    return kept, missing


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not config.getoption("--quick"):
        return
    slow = tuple(i.nodeid for i in items if i.get_closest_marker("slow"))
    kept, missing = quick_selection([i.nodeid for i in items], leave_out=QUICK_LEAVES_OUT + slow)
    if missing:
        raise pytest.UsageError(f"--quick: {', '.join(missing)} not found (renamed? update "
                                "QUICK_ROOT_TESTS in suites/suite_time.py)")
    by_id = {i.nodeid: i for i in items}
    keep = set(kept)
    config.hook.pytest_deselected(items=[i for i in items if i.nodeid not in keep])
    items[:] = [by_id[k] for k in kept]


@dataclass
class Held:
    """One test on one worker: its phases' seconds, and when it started and ended."""

    nodeid: str
    seconds: float = 0.0
    start: float | None = None
    stop: float | None = None


@dataclass
class Timeline:
    """Every test per worker, as the reports came in (the controller sees all workers')."""

    tests: dict[tuple[str, str], Held] = field(default_factory=dict)

    def add(self, worker: str, nodeid: str, duration: float, start: float | None, stop: float | None) -> None:
        h = self.tests.setdefault((worker, nodeid), Held(nodeid))
        h.seconds += duration
        if start is not None:
            h.start = start if h.start is None else min(h.start, start)
        if stop is not None:
            h.stop = stop if h.stop is None else max(h.stop, stop)


def critical_path(tl: Timeline) -> dict:
    """Pure: per worker its busy seconds (its tests' setup, call and teardown), the end of
    its last test since the session's first test started, and the critical worker (the one
    that ended last) with its longest tests and modules."""
    workers: dict[str, list[Held]] = {}
    for (w, _), h in tl.tests.items():
        workers.setdefault(w, []).append(h)
    if not workers:
        return {}
    starts = [h.start for hs in workers.values() for h in hs if h.start is not None]
    t0 = min(starts) if starts else 0.0
    rows = {}
    for w, hs in sorted(workers.items()):
        stops = [h.stop for h in hs if h.stop is not None]
        rows[w] = {"tests": len(hs), "busy_s": round(sum(h.seconds for h in hs), 1),
                   "end_s": round(max(stops) - t0, 1) if stops else None}
    crit = max(rows, key=lambda w: (rows[w]["end_s"] or 0.0, rows[w]["busy_s"]))
    held = sorted(workers[crit], key=lambda h: -h.seconds)
    modules: dict[str, float] = {}
    for h in held:
        mod = h.nodeid.split("::", 1)[0]
        modules[mod] = modules.get(mod, 0.0) + h.seconds
    return {"workers": rows, "critical": crit,
            "top_tests": [(h.nodeid, round(h.seconds, 1)) for h in held[:TOP]],
            "top_modules": sorted(((m, round(s, 1)) for m, s in modules.items()), key=lambda x: -x[1])[:TOP]}


def format_critical_path(cp: Mapping) -> list[str]:
    """Pure: the summary's lines."""
    if not cp:
        return []
    rows, crit = cp["workers"], cp["critical"]
    c = rows[crit]
    out = [f"worker {crit} ended last: its {c['tests']} tests held it {c['busy_s']:.1f} s, "
           f"its last ended {_s(c['end_s'])} after the session's first test started"]
    for w, r in rows.items():
        out.append(f"  {w:<6} {r['tests']:>5} tests  busy {r['busy_s']:>7.1f} s  ended at {_s(r['end_s']):>8}"
                   + ("  <- critical" if w == crit else ""))
    out.append(f"  longest modules on {crit}: " + ", ".join(f"{m} {s:.1f} s" for m, s in cp["top_modules"]))
    out.append(f"  longest tests on {crit}:")
    out += [f"    {s:>7.1f} s  {n}" for n, s in cp["top_tests"]]
    return out


def _s(v: float | None) -> str:
    return "-" if v is None else f"{v:.1f} s"


#: this process's timeline (xdist's controller gets every worker's reports)
_TIMELINE = Timeline()


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "slow: a long unit test the quick tier (--quick) leaves to the whole suite")
    if config.getoption("--quick"):
        # before xdist starts its workers, which inherit the environment
        os.environ.setdefault("TESTBED_FUZZ_EXAMPLES", QUICK_FUZZ_EXAMPLES)
    _TIMELINE.tests.clear()


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    node = getattr(report, "node", None)       # xdist's controller: the worker that ran it
    worker = getattr(getattr(node, "gateway", None), "id", None) or "main"
    _TIMELINE.add(worker, report.nodeid, report.duration, getattr(report, "start", None),
                  getattr(report, "stop", None))


def pytest_terminal_summary(terminalreporter, exitstatus: int, config: pytest.Config) -> None:
    if hasattr(config, "workerinput"):
        return
    lines = format_critical_path(critical_path(_TIMELINE))
    if lines:
        terminalreporter.write_sep("-", "critical path")
        for line in lines:
            terminalreporter.write_line(line)
