"""Traffic tools: one driver per tool, all returning ``ToolResult`` with canonical metrics.

A tool's home is its driver module: argv, parsing, pacing and its probe, version detection,
the options only it has, whether the rate search can drive it. The registry below lists
the modules; a module defines ``DRIVER``. Adding a tool is one module plus one line here
(a line with a dot names a module outside the package), and its build in the image recipe.
Configuration validates a profile's ``tool`` against these names: the model knows none.
"""
from __future__ import annotations

import importlib

from testbed.tools.base import INTERVAL_KEYS, METRICS, ToolDriver, ToolResult, UnsupportedProfile, aggregate

#: The registry: testbed.tools.<module> for each driver module, in listing order.
MODULES = (
    "netperf",
    "uperf",
    "iperf3",
    "sockperf",
)

# Drivers hold no state, so one instance of each serves every caller.
_drivers: dict[str, ToolDriver] = {}


def _load() -> dict[str, ToolDriver]:
    if not _drivers:
        found: dict[str, ToolDriver] = {}
        for mod in MODULES:
            d = importlib.import_module(mod if "." in mod else f"{__name__}.{mod}").DRIVER
            if d.name.value in found:
                raise RuntimeError(f"tool {d.name.value} registered twice ({mod})")
            found[d.name.value] = d
        _drivers.update(found)
    return _drivers


def names() -> tuple[str, ...]:
    return tuple(_load())


def drivers() -> tuple[ToolDriver, ...]:
    return tuple(_load().values())


def get_tool(tool: str) -> ToolDriver:
    """The driver for ``tool`` (a Tool or its name)."""
    try:
        return _load()[str(tool)]
    except KeyError:
        raise ValueError(f"unknown tool {str(tool)!r} (one of: {', '.join(names())})") from None


def search_default() -> str:
    """The tool a rate search uses when the profile names none: the first that it can drive."""
    return next(d.name.value for d in drivers() if d.search_unsupported is None)


__all__ = ["INTERVAL_KEYS", "METRICS", "MODULES", "ToolDriver", "ToolResult", "UnsupportedProfile", "aggregate",
           "drivers", "get_tool", "names", "search_default"]
