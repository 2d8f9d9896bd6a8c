"""Guests entered in parallel (virt.enter_parallel): every one entered is left with the
stack, also when another failed; entries overlap in time."""
import contextlib
import threading
import time

import pytest

from testbed.guests import virt


def test_all_entered_are_left_and_entries_overlap():
    log, active, peak, lock = [], [0], [0], threading.Lock()

    @contextlib.contextmanager
    def cm(i):
        with lock:
            active[0] += 1
            peak[0] = max(peak[0], active[0])
        time.sleep(0.2)
        with lock:
            active[0] -= 1
        log.append(("in", i))
        yield i * 10
        log.append(("out", i))

    with contextlib.ExitStack() as stack:
        got = virt.enter_parallel(stack, [cm(i) for i in range(4)], workers=2)
        assert got == [0, 10, 20, 30]
        assert not [x for x in log if x[0] == "out"]
    assert peak[0] == 2
    assert sorted(i for what, i in log if what == "out") == [0, 1, 2, 3]
    # left in reverse order of registration, like the stack always does
    assert [i for what, i in log if what == "out"] == [3, 2, 1, 0]


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
