"""Output a parser was not written for (a corrupted line, a field of another type) fails
that sample with the parser's error in its reason; it never stops the run."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from testbed.tools import get_tool
from testbed.tools.base import read_sample
from testbed.topology.model import Pattern, Profile, Tool

pytestmark = pytest.mark.unit

RECORDED = Path(__file__).parent / "fixtures" / "recorded"


def _uperf_with_a_garbled_timestamp() -> str:
    text = (RECORDED / "uperf" / "uperf_pbench_tcp-rr-64B-1i_raw-R-a-i1.txt").read_text()
    return text.replace("timestamp_ms:1459955120427.3816", "timestamp_ms:1459955120427.38.16")


def _iperf3_with(field: str) -> str:
    doc = json.loads((RECORDED / "iperf3" / "iperf3_json_tcp_sender_macos_3.14_opte.json").read_text())
    doc["end"][field] = 1.5
    return json.dumps(doc)


@pytest.mark.parametrize(("tool", "pattern", "output", "error"), [
    ("uperf", Pattern.RR, _uperf_with_a_garbled_timestamp(), "ValueError"),
    ("iperf3", Pattern.STREAM, _iperf3_with("sum_sent"), "AttributeError"),
    ("iperf3", Pattern.STREAM, _iperf3_with("sum_received"), "TypeError"),
], ids=["uperf-timestamp", "iperf3-sum_sent", "iperf3-sum_received"])
def test_output_the_parser_raises_on_is_a_failed_sample_naming_the_error(tool, pattern, output, error):
    driver = get_tool(tool)
    profile = Profile("p", tool=Tool(tool), pattern=pattern, duration_s=10)
    with pytest.raises(Exception) as raised:          # the parser alone raises on it
        driver.parse_sample(output, "", 0, profile=profile)
    assert type(raised.value).__name__ == error
    res = read_sample(driver, output, "", 0, profile=profile)
    assert not res.ok and not res.metrics
    assert res.reason.startswith(f"{tool} output could not be read ({error}: ")
    assert "raw output is kept" in res.reason


def test_the_unaltered_outputs_read_as_before():
    profile = Profile("p", tool=Tool("uperf"), pattern=Pattern.RR, duration_s=10)
    text = (RECORDED / "uperf" / "uperf_pbench_tcp-rr-64B-1i_raw-R-a-i1.txt").read_text()
    driver = get_tool("uperf")
    assert read_sample(driver, text, "", 0, profile=profile) == driver.parse_sample(text, "", 0, profile=profile)
