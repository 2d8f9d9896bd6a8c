"""The attachment modes, one module each, registered by name (like mkosi's distributions).

Adding a mode is one module here (it defines ``MODES``, see base.py) plus one line in
``MODULES``. Everything else (config's validation of ``Attachment`` names, the runner's preflight
and plugging, doctor, cleanup) asks this registry.
"""
from __future__ import annotations

import importlib
from collections.abc import Iterator

from testbed.attachments.base import Check, Fabric, Mode, Request

__all__ = ["Check", "Fabric", "Mode", "Request", "MODULES", "get", "names", "modes",
           "unavailable", "still_here", "single_host", "supported_single_host"]

#: The registry: testbed.attachments.<module> for each mode module, in listing order. An
#: entry with a dot is a full module name: a mode kept outside this package (a site's own,
#: or a test's) is one line here too.
MODULES = (
    "bridge",
    "ovs",
    "macvtap",
    "ovs_vxlan",
    "bridge_vxlan",
    "netns",
    "veth_cable",
)

_modes: dict[str, Mode] = {}


def _load() -> dict[str, Mode]:
    if not _modes:
        found: dict[str, Mode] = {}
        for mod in MODULES:
            for m in importlib.import_module(mod if "." in mod else f"{__name__}.{mod}").MODES:
                if m.name in found:
                    raise RuntimeError(f"attachment {m.name} registered twice ({mod})")
                found[m.name] = m
        _modes.update(found)
    return _modes


def modes() -> Iterator[Mode]:
    return iter(_load().values())


def names() -> tuple[str, ...]:
    return tuple(_load())


def get(name: str) -> Mode:
    try:
        return _load()[str(name)]
    except KeyError:
        raise ValueError(f"unknown attachment {name!r} (one of: {', '.join(names())})") from None


def unavailable(name: str) -> str | None:
    """Why this host cannot run a mode (None: it can), found by trying."""
    return get(name).unavailable()


def still_here(names: tuple[str, ...]) -> list[str]:
    """Those of a fabric's leftovers (Fabric.leftovers) that still exist on this machine as a
    link or a named namespace (objects on a remote host are not looked for)."""
    import os
    return [n for n in dict.fromkeys(names)
            if os.path.exists(f"/sys/class/net/{n}") or os.path.exists(f"/run/netns/{n}")]


def single_host() -> tuple:
    """The classic modes that join two guests on this one host (Mode.classic): what the
    built-in default topology measures and what the per-mode test tiers parametrize over."""
    from testbed.topology.model import Attachment
    return tuple(Attachment(m.name) for m in _load().values()
                 if m.guests and m.placement != "two" and m.classic)


def supported_single_host() -> tuple:
    """Those of single_host() that this host can run."""
    return tuple(a for a in single_host() if unavailable(a) is None)
