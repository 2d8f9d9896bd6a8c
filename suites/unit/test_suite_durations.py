"""The recorded root-tier test times that order parallel work (longest first): a file that no
longer parses, or that names modules which are gone, would quietly order the suite worse."""
from __future__ import annotations

import json
from pathlib import Path

from testbed._suite_plugin import _ROOT_TIERS, DURATIONS_FILE, _tier_of

ROOT = Path(__file__).resolve().parents[2]


def test_recorded_durations_name_root_tier_tests_that_exist():
    recorded = json.loads((ROOT / DURATIONS_FILE).read_text())
    assert isinstance(recorded, dict) and recorded
    for nodeid, seconds in recorded.items():
        module = ROOT / nodeid.split("::", 1)[0]
        assert _tier_of(module) in _ROOT_TIERS, nodeid
        assert module.is_file(), f"{nodeid}: module gone (refresh with ./tb test --tb-store-durations)"
        assert isinstance(seconds, (int, float)) and seconds >= 0, nodeid
