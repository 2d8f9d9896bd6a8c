from __future__ import annotations

from testbed import cpu

# Two CPUs over a window of 100 ticks each: every CPU line adds up to 100 ticks.
STAT_A = """cpu  100 0 50 1000 0 0 10 0 0 0
cpu0 60 0 30 500 0 0 5 0 0 0
cpu1 40 0 20 500 0 0 5 0 0 0
intr 1 2 3
"""
STAT_B = """cpu  200 0 100 1030 0 0 30 0 0 0
cpu0 110 0 60 510 0 0 15 0 0 0
cpu1 90 0 40 520 0 0 15 0 0 0
"""


def test_parse_and_delta():
    a, b = cpu.parse_proc_stat(STAT_A), cpu.parse_proc_stat(STAT_B)
    assert set(a) == {"cpu", "cpu0", "cpu1"}
    hz = cpu.USER_HZ
    d = cpu.stat_delta(a, b, seconds=100 / hz)
    assert d["cpu"]["user"] == 1.0
    assert d["cpu"]["softirq"] == 0.2
    # busy is what was not idle: 2 CPUs minus 0.3 idle, which here equals the categories' sum
    assert d["cpu"]["busy"] == 1.7 == round(d["cpu"]["user"] + d["cpu"]["system"] + d["cpu"]["softirq"], 4)
    assert abs(d["cpu0"]["busy"] + d["cpu1"]["busy"] - d["cpu"]["busy"]) < 1e-9


def test_busy_comes_from_idle_not_from_tick_samples():
    """Tick-sampled categories can miss or double-count a tick; busy follows idle, which
    tickless kernels keep exactly."""
    a = cpu.parse_proc_stat("cpu  0 0 0 0 0 0 0 0\ncpu0 0 0 0 0 0 0 0 0\n")
    b = cpu.parse_proc_stat("cpu  97 0 0 10 0 0 0 0\ncpu0 97 0 0 10 0 0 0 0\n")
    d = cpu.stat_delta(a, b, seconds=100 / cpu.USER_HZ)
    assert d["cpu0"]["busy"] == 0.9 and d["cpu0"]["user"] == 0.97


def test_qemu_thread_classes():
    assert cpu.classify_qemu_thread("CPU 0/KVM") == "vcpu"
    assert cpu.classify_qemu_thread("CPU 3/TCG") == "vcpu"
    assert cpu.classify_qemu_thread("IO iothread1") == "iothread"
    assert cpu.classify_qemu_thread("qemu-system-x86") == "emulator"
    assert cpu.classify_qemu_thread("worker") == "emulator"


def test_host_reading_of_this_process():
    import os
    import time
    r1 = cpu.host_reading({"me": os.getpid()})
    end = time.monotonic() + 0.5
    while time.monotonic() < end:
        pass
    r2 = cpu.host_reading({"me": os.getpid()})
    d = cpu.host_delta(r1, r2)
    assert d["per_guest"]["me"]["emulator"] > 0.5
    # What is attributed to one process never exceeds what the whole host used: thread run
    # time is exact (schedstat) and so is busy (from idle); idle is kept in whole ticks, so
    # one tick of rounding at each end.
    tick = 2 / cpu.USER_HZ / d["window_s"]
    assert d["per_guest"]["me"]["total"] <= d["host"]["busy"] + tick
