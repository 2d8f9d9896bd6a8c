"""Traffic tools: one driver per tool, all returning ``ToolResult`` with canonical metrics."""
from __future__ import annotations

from testbed.tools.base import INTERVAL_KEYS, METRICS, ToolDriver, ToolResult, UnsupportedProfile, aggregate
from testbed.tools.iperf3 import Iperf3Driver
from testbed.tools.netperf import NetperfDriver
from testbed.tools.uperf import UperfDriver
from testbed.topology.model import Tool

# Drivers hold no state, so one instance of each serves every caller.
_DRIVERS: dict[Tool, ToolDriver] = {Tool.NETPERF: NetperfDriver(), Tool.UPERF: UperfDriver(),
                                    Tool.IPERF3: Iperf3Driver()}


def get_tool(tool: Tool) -> ToolDriver:
    """The driver for ``tool`` (a Tool or its string value)."""
    return _DRIVERS[Tool(tool)]


__all__ = ["INTERVAL_KEYS", "METRICS", "Iperf3Driver", "NetperfDriver", "ToolDriver",
           "ToolResult", "UnsupportedProfile", "UperfDriver", "aggregate", "get_tool"]
