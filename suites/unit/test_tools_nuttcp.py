"""nuttcp -fparse parser, on real output (fixtures/nuttcp/SOURCES.md)."""
from pathlib import Path

from testbed.tools import nuttcp

FIX = Path(__file__).parent / "fixtures" / "nuttcp"


def test_parses_intervals_and_summary():
    r = nuttcp.parse((FIX / "udp-cbr-parse.out").read_text())
    assert r.ok and r.reason is None
    assert [round(i.mbps) for i in r.intervals] == [2007, 2000]
    assert r.intervals[0].packets == 31361 and r.intervals[0].dropped == 0
    assert r.mbps == 2001.9299 and r.packets == 93750 and r.loss_pct == 0.0
    assert (r.tx_cpu_pct, r.rx_cpu_pct) == (99.0, 18.0)


def test_failure_keeps_the_message():
    r = nuttcp.parse((FIX / "connect-failed.out").read_text(), "", 1)
    assert not r.ok and "Connection timed out" in r.reason and r.mbps is None


def test_no_summary_is_a_failure_not_zero():
    r = nuttcp.parse((FIX / "udp-cbr-human.out").read_text())
    assert not r.ok and r.mbps is None


def test_client_argv_is_the_studys_command():
    assert nuttcp.client_argv("198.18.0.2", rate="20G") == [
        "nuttcp", "-P5000", "-fparse", "-l8000", "-u", "-w4m", "-R20G", "-i1", "-N4", "-T10", "198.18.0.2"]


def test_nothing_received_is_a_failure_not_a_zero_rate():
    # Real: a study run over an OVS LACP bond whose control connection worked while none of
    # the UDP data reached the receiver (no -i line printed, only the summary).
    out = ("megabytes=0.0000 real_seconds=5.00 rate_Mbps=0.0000 tx_cpu=76 rx_cpu=0 drop=93716 pkt=93716 "
           "data_loss=100.00000\n")
    r = nuttcp.parse(out)
    assert not r.ok and r.mbps is None
    assert "none of the 93716 datagrams" in r.reason
