"""`testbed bench cost`'s pure parts: the rules it adds, the calibration's parser, the gate's
power and false alarms from a run's samples, and its options refused before anything runs."""
from __future__ import annotations

import numpy as np
import pytest

from testbed import cli
from testbed.bench import cost as bench
from testbed.analysis import sample_cost as cost
from testbed.records.records import SampleRecord

#: a ping flood's summary, as ping printed it on this host (namespace veth pair)
PING = """--- 198.18.77.2 ping statistics ---
20000 packets transmitted, 20000 received, 0% packet loss, time 219ms
rtt min/avg/max/mdev = 0.018/0.021/3.043/0.037 ms, ipg/ewma 0.029/0.020 ms
"""


def test_ruleset_walks_every_rule_on_each_device_and_matches_nothing_of_ours():
    text = bench.ruleset("tb-ab12-cost", ["tb-ab12-t2", "tb-ab12-t3"], 300)
    assert text.startswith("table netdev tb-ab12-cost {")
    assert text.count("meta mark 0x") == 300 and "meta mark 0x0 " not in text
    assert text.count("counter") == 300 and "drop" not in text and "accept" not in text
    for i, dev in enumerate(("tb-ab12-t2", "tb-ab12-t3")):
        assert f'chain in{i} {{\n    type filter hook ingress device "{dev}" priority 0;\n    jump rules' in text


def test_ping_summary():
    assert bench.parse_ping_avg(PING) == pytest.approx(21000.0)
    assert bench.parse_ping_avg("ping: connect: Network is unreachable") is None


def _rows(rng, path: float, host: float, k: int, noise: float = 0.02) -> list[dict[str, float]]:
    """Samples of the two deciding metrics: the host side's noise shared by the path."""
    out = []
    for _ in range(k):
        h = host * rng.normal(1, noise)
        out.append({cost.METRIC: (path - host) * rng.normal(1, noise) + h, cost.HOST_METRIC: h})
    return out


def test_gate_rates_find_a_five_percent_cost_and_rarely_alarm_without_one():
    rng = np.random.default_rng(5)
    a = _rows(rng, 1000.0, 300.0, 20)
    b = _rows(rng, 1050.0, 350.0, 20)          # 50 ns more on the host's side: +5 % of the path
    r = bench.gate_rates(a, b, n=10, threshold=0.05, draws=300)
    assert r["power"] >= 0.9 and r["false_alarms"] <= 0.05 and r["false_alarms_measured"] <= 0.05
    assert r["metrics"] == sorted([cost.METRIC, cost.HOST_METRIC])
    same = bench.gate_rates(a, _rows(rng, 1000.0, 300.0, 20), n=10, threshold=0.05, draws=300)
    assert same["power"] <= 0.1
    few = bench.gate_rates(a[:8], b, n=5, threshold=0.05, draws=50)
    assert few["false_alarms_measured"] is None          # 8 A samples: no two halves of 5
    with pytest.raises(ValueError, match="too few"):
        bench.gate_rates(a[:2], b, n=5, threshold=0.05)


def _samples(rng, n: int, emulator_extra: float = 0.0) -> list[SampleRecord]:
    out = []
    for i in range(n):
        vcpu, emulator = rng.normal(750.0, 15.0), rng.normal(250.0, 5.0) + emulator_extra
        m = {**{cost.role_metric(r): 0.0 for r in cost.ROLES}, cost.role_metric("vcpu"): vcpu,
             cost.role_metric("emulator"): emulator, cost.METRIC: vcpu + emulator, cost.HOST_METRIC: emulator}
        out.append(SampleRecord.new("r", {"id": "c"}, i, False, "ok", None, m, {}, "", ""))
    return out


def test_figures_name_the_role_that_took_the_added_cost():
    rng = np.random.default_rng(9)
    a, b = _samples(rng, 20), _samples(rng, 20, emulator_extra=50.0)      # +5 % of the path
    f = bench.figures(a, b, known_ns=48.0, n=10, threshold=0.05, draws=300)
    assert f["role"] == "emulator" and f["moved"].startswith("emulator +")
    assert f["added"] == pytest.approx(0.05, abs=0.015) and f["known"] == pytest.approx(0.048, abs=0.002)
    assert f["host_added"] == pytest.approx(0.2, abs=0.03)
    assert f["gate"]["power"] >= 0.9 and f["gate"]["false_alarms"] <= 0.05
    assert 0 < f["spread"]["a"]["path"]["gate_mean_rsd"] < f["spread"]["a"]["path"]["sample_rsd"]
    lines, ok = bench.report({**f, "rules": 2600, "run_dir": "/r", "failed": [],
                              "options": {"threshold": 0.05}})
    assert ok and any(line.startswith("role that took it    emulator") for line in lines)
    lines, ok = bench.report({**f, "gate": {**f["gate"], "false_alarms_measured": 0.2}, "rules": 2600,
                              "run_dir": "/r", "failed": [], "options": {"threshold": 0.05}})
    assert not ok


@pytest.mark.parametrize("argv, field", [
    (["--added", "0"], "--added"), (["--added", "1.5"], "--added"), (["--gate-samples", "1"], "--gate-samples"),
    (["--threshold", "nan"], "--threshold"), (["--rules", "-3"], "--rules"), (["--duration", "x"], "--duration"),
    (["--rounds", "8", "--gate-samples", "5"], "--rounds"), (["--threshold", "1"], "--threshold"),
])
def test_bad_options_are_refused_with_one_line_before_anything_runs(argv, field, capsys):
    with pytest.raises(SystemExit) as e:
        raise SystemExit(cli.main(["bench", "cost", *argv]))
    assert e.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and field in err


def test_gate_size_is_the_smallest_that_reaches_the_power_target_and_is_printed():
    """At a TCG guest's spread (20 % a sample) a 5 % cost needs far more than the nightly
    gate's 10 samples a side; at 2 % it needs the smallest size; the bench says which."""
    rng = np.random.default_rng(11)
    a, b = _rows(rng, 1000.0, 300.0, 30, noise=0.2), _rows(rng, 1100.0, 400.0, 30, noise=0.2)
    wide = bench.gate_size(a, b, threshold=0.05, sizes=(10, 40), draws=60)
    assert wide["power"][10] < 0.9 <= wide["power"][40] and wide["needed"] == 40
    calm = bench.gate_size(_rows(rng, 1000.0, 300.0, 20), _rows(rng, 1100.0, 400.0, 20), threshold=0.05,
                           sizes=(10,), draws=60)
    assert calm["needed"] == 10
    none = bench.gate_size(a, a, threshold=0.05, sizes=(10,), draws=40)
    assert none["needed"] is None
    # the headline gate's power is taken as drawn, not drawn again beside it
    given = bench.gate_size(a, b, threshold=0.05, sizes=(10, 40), draws=60, known={25: 0.93})
    assert given["power"] == {10: wide["power"][10], 25: 0.93} and given["needed"] == 25
    f = bench.figures(_samples(rng, 20), _samples(rng, 20, emulator_extra=50.0), known_ns=48.0, n=10,
                      threshold=0.05, draws=40)
    lines, _ = bench.report({**f, "size": wide, "rules": 2600, "run_dir": "/r", "failed": [],
                             "options": {"threshold": 0.05}})
    assert any(line.startswith("gate size            40 samples a side reach 90%") for line in lines)
    lines, _ = bench.report({**f, "size": none, "rules": 2600, "run_dir": "/r", "failed": [],
                             "options": {"threshold": 0.05}})
    assert any("no size up to 10 samples a side reaches 90%" in line for line in lines)
