"""How a cell's connection count becomes client processes is the tool driver's decision
(ToolDriver.client_plan); measure.py names no tool."""
from __future__ import annotations

import inspect

from testbed.measure import sampling as measure
from testbed.tools import get_tool
from testbed.topology.model import Pattern, Profile, Tool


def test_netperf_runs_one_instance_per_connection() -> None:
    p = Profile("s", tool=Tool("netperf"), pattern=Pattern.STREAM, message_size=16384, duration_s=5)
    argv, n = get_tool(Tool("netperf")).client_plan(p, "198.18.0.2", port=12865, connections=4,
                                                 write_file=lambda path, text: None)
    assert n == 4 and argv[0] == "netperf" and "198.18.0.2" in argv


def test_iperf3_opens_streams_in_one_client() -> None:
    p = Profile("s", tool=Tool("iperf3"), pattern=Pattern.STREAM, message_size=16384, duration_s=5)
    argv, n = get_tool(Tool("iperf3")).client_plan(p, "198.18.0.2", port=5201, connections=4,
                                                write_file=lambda path, text: None)
    assert n == 1 and argv[argv.index("-P") + 1] == "4"


def test_uperf_writes_its_profile_where_the_client_runs() -> None:
    p = Profile("rr", tool=Tool("uperf"), pattern=Pattern.RR, message_size=1, response_size=1, duration_s=5)
    written = {}
    argv, n = get_tool(Tool("uperf")).client_plan(p, "198.18.0.2", port=20000, connections=3,
                                               write_file=lambda path, text: written.update({path: text}))
    [(path, xml)] = written.items()
    assert n == 1 and argv[argv.index("-m") + 1] == path
    assert 'nthreads="3"' in xml and "198.18.0.2" in xml


def test_measure_names_no_tool_and_no_host_networking() -> None:
    src = inspect.getsource(measure)
    for word in ("iperf3", "uperf", "netperf", "Tool(", "host.net", "host import net"):
        assert word not in src, word
