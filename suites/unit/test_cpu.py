from __future__ import annotations

import pytest

from testbed.measure import cpu

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
    assert cpu.classify_qemu_thread("vhost-4242") == "vhost"


def test_host_reading_of_this_process():
    import os
    import time
    c1 = time.process_time()
    r1 = cpu.host_reading({"me": os.getpid()})
    end = time.monotonic() + 0.5
    while time.monotonic() < end:
        pass
    r2 = cpu.host_reading({"me": os.getpid()})
    c2 = time.process_time()
    d = cpu.host_delta(r1, r2)
    # The share of a core the loop got is what this process's own CPU clock says, however
    # busy the host is (other tests may run beside this one).
    assert c2 - c1 > 0.05
    assert d["per_guest"]["me"]["emulator"] == pytest.approx((c2 - c1) / d["window_s"], abs=0.1)
    # What is attributed to one process never exceeds what the whole host used: thread run
    # time is exact (schedstat) and so is busy (from idle); idle is kept in whole ticks, so
    # one tick of rounding at each end.
    tick = 2 / cpu.USER_HZ / d["window_s"]
    assert d["per_guest"]["me"]["total"] <= d["host"]["busy"] + tick


# A helper process standing in for QEMU: it names its own threads with prctl(PR_SET_NAME),
# as QEMU and the kernel do, and keeps them busy. With "threads" its vhost workers live in
# its own thread group (Linux >= 6.4); with "kthread" a separate process is named
# vhost-<helper pid>, the way a pre-6.4 vhost kernel thread is named.
HELPER = r"""
import ctypes, os, sys, threading, time
libc = ctypes.CDLL(None, use_errno=True)
def name(n):
    libc.prctl(15, ctypes.c_char_p(n.encode()), 0, 0, 0)    # PR_SET_NAME
def spin(n, until):
    name(n)
    while time.monotonic() < until:
        pass
model = sys.argv[1]
until = time.monotonic() + float(sys.argv[2])
name("qemu-system-x86")
threads = [threading.Thread(target=spin, args=("CPU 0/TCG", until))]
if model == "threads":
    threads.append(threading.Thread(target=spin, args=(f"vhost-{os.getpid()}", until)))
for t in threads:
    t.start()
print("ready", flush=True)
for t in threads:
    t.join()
"""
KTHREAD = r"""
import ctypes, sys, time
ctypes.CDLL(None).prctl(15, ctypes.c_char_p(("vhost-" + sys.argv[1]).encode()), 0, 0, 0)
until = time.monotonic() + float(sys.argv[2])
print("ready", flush=True)
while time.monotonic() < until:
    pass
"""


def _spawn(code: str, *args: str):
    import subprocess
    import sys
    p = subprocess.Popen([sys.executable, "-c", code, *args], stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == "ready"
    return p


@pytest.mark.parametrize("model", ["threads", "kthread"])
def test_vhost_workers_found_both_ways(model):
    """Real threads named vhost-<pid> (in the group, or a separate task named so): the vhost
    column carries their run time and the emulator column does not."""
    import time
    qemu = _spawn(HELPER, model, "3")
    others = [_spawn(KTHREAD, str(qemu.pid), "3")] if model == "kthread" else []
    try:
        r1 = cpu.host_reading({"g": qemu.pid})
        time.sleep(1.0)
        r2 = cpu.host_reading({"g": qemu.pid})
    finally:
        for p in [qemu, *others]:
            p.kill()
            p.wait()
    d = cpu.host_delta(r1, r2)
    g = d["per_guest"]["g"]
    # Two spinning threads share two CPUs with whatever else runs here: each gets a share.
    assert g["vhost"] > 0.05, g
    assert g["vcpu"] > 0.05, g
    # The emulator is only the helper's main thread, asleep in join(): the vhost worker's
    # run time is not in it.
    assert g["emulator"] < 0.2 * g["vhost"], g
    assert d["vhost_model"]["g"] == {"threads": "thread", "kthread": "kthread"}[model]
    assert d["invariant"]["holds"], d["invariant"]
    assert abs(d["unattributed"] - (d["host"]["busy"] - d["attributed"])) < 1e-3


def test_guest_reading_uses_the_guests_own_clock():
    before = cpu.parse_guest_reading("100.00 150.00\n" + STAT_A)
    after = cpu.parse_guest_reading(f"{100 + 100 / cpu.USER_HZ:.2f} 151.00\n" + STAT_B)
    delta, secs = cpu.guest_delta(before, after)
    assert abs(secs - 100 / cpu.USER_HZ) < 1e-9
    assert delta["cpu"]["user"] == 1.0


def test_kernel_config_flag():
    assert cpu.parse_config_flag("CONFIG_IRQ_TIME_ACCOUNTING=y\n", "CONFIG_IRQ_TIME_ACCOUNTING")
    assert not cpu.parse_config_flag("# CONFIG_IRQ_TIME_ACCOUNTING is not set\n"
                                     "CONFIG_HAVE_IRQ_TIME_ACCOUNTING=y\n", "CONFIG_IRQ_TIME_ACCOUNTING")
    k = cpu.kernel()
    assert k["release"] and k["irq_time_accounting_source"]


def _reading(at, vcpu, busy_ticks, libvirt):
    # one CPU, cumulative ticks: as much idle as busy
    stat = cpu.parse_proc_stat(f"cpu  {busy_ticks} 0 0 {busy_ticks} 0 0 0 0\n"
                               f"cpu0 {busy_ticks} 0 0 {busy_ticks} 0 0 0 0\n")
    return cpu.HostReading(at, {"g": {"vcpu": vcpu}}, {"ovs-vswitchd": 0.0, "ksoftirqd": 0.0}, stat,
                           {"g": "none"}, {"g": libvirt})


def test_libvirt_figure_and_the_invariant_from_two_readings():
    hz = cpu.USER_HZ
    # one CPU, 1 s: 0.5 s busy; QEMU's threads ran 0.4 s, libvirt says 0.4 s (agree)
    d = cpu.host_delta(_reading(0.0, 0.0, 0, 10.0), _reading(1.0, 0.4, hz // 2, 10.4))
    assert d["libvirt"]["g"]["status"] == "agree" and d["invariant"]["holds"]
    assert d["unattributed"] == 0.1 and d["attributed"] == 0.4
    # libvirt 10 % apart: a disagreement, with both figures
    d = cpu.host_delta(_reading(0.0, 0.0, 0, 10.0), _reading(1.0, 0.4, hz // 2, 10.44))
    assert d["libvirt"]["g"] == {"attributed_cores": 0.4, "libvirt_cores": 0.44, "gap": 0.0909,
                                 "status": "disagree"}
    # threads that ran longer than the host was busy: the invariant fails
    d = cpu.host_delta(_reading(0.0, 0.0, 0, "libvirt getCPUStats: no cgroup"),
                       _reading(1.0, 0.6, hz // 2, "libvirt getCPUStats: no cgroup"))
    assert not d["invariant"]["holds"] and d["unattributed"] < 0
    assert d["libvirt"]["g"]["status"] == "unavailable"
