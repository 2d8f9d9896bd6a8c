"""Guests entered in parallel (virt.enter_parallel): every one entered is left with the
stack, also when another failed; entries overlap in time."""
import contextlib
import threading
import time

import pytest

from testbed.guests import virt


def test_all_entered_are_left_and_entries_and_exits_overlap():
    log, active, peak, lock = [], [0], {"in": 0, "out": 0}, threading.Lock()

    def busy(phase):
        with lock:
            active[0] += 1
            peak[phase] = max(peak[phase], active[0])
        time.sleep(0.2)
        with lock:
            active[0] -= 1

    @contextlib.contextmanager
    def cm(i):
        busy("in")
        log.append(("in", i))
        yield i * 10
        busy("out")
        log.append(("out", i))

    with contextlib.ExitStack() as stack:
        got = virt.enter_parallel(stack, [cm(i) for i in range(4)], workers=2)
        assert got == [0, 10, 20, 30]
        assert not [x for x in log if x[0] == "out"]
    assert peak == {"in": 2, "out": 2}
    assert sorted(i for what, i in log if what == "out") == [0, 1, 2, 3]


def test_every_one_is_left_when_an_exit_fails_and_the_error_is_raised():
    left = []

    @contextlib.contextmanager
    def cm(i):
        yield i
        left.append(i)
        if i == 2:
            raise RuntimeError("guest 2 would not go")

    with pytest.raises(RuntimeError, match="guest 2"):
        with contextlib.ExitStack() as stack:
            virt.enter_parallel(stack, [cm(i) for i in range(4)], workers=4)
    assert sorted(left) == [0, 1, 2, 3]


def test_the_exception_of_the_block_reaches_every_exit_and_is_not_swallowed():
    seen = []

    @contextlib.contextmanager
    def cm(i):
        try:
            yield i
        except ValueError as e:
            seen.append((i, str(e)))
            raise

    with pytest.raises(ValueError, match="measuring failed"):
        with contextlib.ExitStack() as stack:
            virt.enter_parallel(stack, [cm(i) for i in range(3)], workers=3)
            raise ValueError("measuring failed")
    assert sorted(seen) == [(0, "measuring failed"), (1, "measuring failed"), (2, "measuring failed")]


def test_a_failure_still_leaves_the_others():
    left = []

    @contextlib.contextmanager
    def cm(i):
        if i == 1:
            raise RuntimeError("guest 1 did not start")
        try:
            yield i
        finally:
            left.append(i)

    with pytest.raises(RuntimeError, match="guest 1"):
        with contextlib.ExitStack() as stack:
            virt.enter_parallel(stack, [cm(i) for i in range(3)], workers=3)
    assert sorted(left) == [0, 2]


def test_map_parallel_raises_after_all_finished():
    done = []

    def f(x):
        time.sleep(0.05 * x)
        done.append(x)
        if x == 0:
            raise ValueError("first")
        return x

    with pytest.raises(ValueError):
        virt.map_parallel(f, [0, 1, 2], workers=3)
    assert sorted(done) == [0, 1, 2]
    assert virt.map_parallel(lambda x: x * 2, [1, 2, 3], workers=2) == [2, 4, 6]
