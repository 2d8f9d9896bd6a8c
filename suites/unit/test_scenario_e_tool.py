"""Scenario E says which tool ran: uperf when the guest image has it, else netperf with why."""
from __future__ import annotations

import pytest

from testbed.scenarios import e_macvtap_vs_ovs as e
from testbed.topology.model import Attachment, Tool

pytestmark = pytest.mark.unit


def test_profiles_use_the_tool_chosen() -> None:
    t = e._topology("x", [Attachment("ovs")], True, False, None, "uperf")
    assert {p.tool for p in t.matrix.profiles} == {Tool("uperf")}
    assert {p.tool for p in e._topology("x", [Attachment("ovs")], True, False, None).matrix.profiles} == {Tool("netperf")}


def test_report_names_the_tool_that_ran() -> None:
    up = e.report({}, {}, True, "run", (), {}, None, None, "uperf")
    assert "(uperf ran;" in up.tables[0].title
    assert not any("instead of uperf" in c for c in up.caveats)
    net = e.report({}, {}, True, "run", (), {}, None, None, "netperf", "guest image x has no uperf")
    assert "(netperf ran;" in net.tables[0].title
    assert any("instead of uperf: guest image x has no uperf" in c for c in net.caveats)
