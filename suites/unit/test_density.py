"""The density bench's pure parts: its argument, the memory fit refusal, smaps, the table."""
import pytest

from testbed.errors import ConfigError
from testbed.measure import density

SMAPS = """\
55d0c1a2b000-7ffd5c3f4000 ---p 00000000 00:00 0                          [rollup]
Rss:             1193216 kB
Pss:              986430 kB
Pss_Dirty:        950000 kB
Pss_Anon:         950000 kB
Pss_File:          36430 kB
Pss_Shmem:             0 kB
Shared_Clean:      52000 kB
Shared_Dirty:       4096 kB
Private_Clean:     12000 kB
Private_Dirty:   1125120 kB
Referenced:      1190000 kB
Anonymous:       1125120 kB
"""


def test_pairs_argument():
    assert density.parse_pairs("8,1, 2,4,2") == (1, 2, 4, 8)
    for bad in ("0", "1,x", "", "-1", "1.5"):
        with pytest.raises(ConfigError) as e:
            density.parse_pairs(bad)
        assert "--pairs" in str(e.value) and "\n" not in str(e.value)
        assert e.value.exit_status == 2


def test_fit_refuses_with_the_figures_and_says_how_many_fit():
    # 1024 MiB guests: 1280 MiB each with QEMU's allowance; 10000 MiB available keeps 1024
    # for the host, leaving 8976 MiB: 7 guests, 3 pairs.
    f = density.fit(4, 1024, 10000)
    assert not f.ok and f.max_pairs == 3 and f.per_guest_mib == 1280
    assert f.need_mib == 8 * 1280 + density.HOST_RESERVE_MIB
    msg = f.refusal()
    assert "4 pairs (8 guests) need 11264 MiB" in msg
    assert "10000 MiB is available" in msg and "at most 3 pairs fit" in msg
    assert density.fit(3, 1024, 10000).ok
    none = density.fit(1, 1024, 500)
    assert not none.ok and none.max_pairs == 0 and "at most 0 pairs fit" in none.refusal()


def test_smaps_rollup():
    s = density.parse_smaps_rollup(SMAPS)
    assert s["Rss"] == 1193216 and s["Shared_Clean"] == 52000 and s["Pss"] == 986430
    assert "55d0c1a2b000-7ffd5c3f4000 ---p 00000000 00" not in s


def test_memory_row_of_this_process():
    import os
    row = density.memory_row({"me": os.getpid()})
    assert row["guests_read"] == 1 and row["rss_mib"] > 1 and row["pss_mib"] <= row["rss_mib"]
    assert density.memory_row({"gone": 2**22 + 7})["guests_read"] == 0


def test_table():
    ok = {"pairs": 2, "ready_s": 6.5, "ratio": 0.41, "memory": {"rss_per_guest_mib": 610.2,
          "pss_per_guest_mib": 600.0, "shared_mib": 40.0}, "ksm": {"enabled": False, "saved_mib": 0.0},
          "disk_layer_cached_mib": 300.0, "harness_cpu_pct_per_pair": 0.05, "agent_cpu_pct_per_pair": None,
          "qemu_idle_cores_per_pair": 0.12}
    refused = {"pairs": 8, "refused": density.fit(8, 1024, 10000).refusal()}
    failed = {"pairs": 4, "failed": "guest tb-x-g1-p3 (waiting for guest agent)"}
    text = density.format_table(8.0, [ok, failed, refused])
    lines = text.splitlines()
    assert lines[0] == "one pair restored one guest after the other: 8.00 s"
    assert lines[2].split()[:3] == ["2", "6.50", "0.41"] and "610.2" in lines[2] and "off" in lines[2]
    assert lines[2].split()[-2:] == ["-", "0.120"]     # agents not read: "-", never 0
    assert lines[3].startswith("    4 failed: guest tb-x-g1-p3")
    assert lines[4].startswith("    8 refused: 8 pairs (16 guests) need") and "at most 3 pairs fit" in lines[4]


def test_workers_capped_by_cores(monkeypatch):
    monkeypatch.setattr(density.os, "cpu_count", lambda: 2)
    assert density.workers(16) == 2 and density.workers(1) == 1
