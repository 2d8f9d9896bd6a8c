"""The attachment modes, one module each, registered by name (like mkosi's distributions).

Adding a mode is one module here (it defines ``MODES``, see base.py) plus one line in
``MODULES``. Everything else (config's validation of ``Attachment`` names, the runner's preflight
and plugging, doctor, cleanup) asks this registry.
"""
from __future__ import annotations

import contextlib
import dataclasses
import importlib
from collections.abc import Callable, Iterator
from typing import Any

from testbed.attachments.base import Check, Fabric, Mode, Request
from testbed.errors import TestbedError

__all__ = ["Check", "Fabric", "Mode", "Request", "MODULES", "accepts", "connect", "connections", "get", "names",
           "modes", "unavailable", "still_here", "single_host", "supported_single_host"]

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
    "netns_across",
)

_modes: dict[str, Mode] = {}


_connections: dict[str, Callable[..., contextlib.AbstractContextManager]] = {}


def _modules() -> list:
    return [importlib.import_module(mod if "." in mod else f"{__name__}.{mod}") for mod in MODULES]


def _load() -> dict[str, Mode]:
    if not _modes:
        from testbed.attachments import netns
        _connections.clear()        # the registry was reset (a test's own MODULES)
        found: dict[str, Mode] = {}
        conns = connections()
        for mod, m in ((mod, m) for mod, module in zip(MODULES, _modules()) for m in module.MODES):
            if m.name in found:
                raise RuntimeError(f"attachment {m.name} registered twice ({mod})")
            if m.netns_kind is not None and m.fabric is netns._unresolved:
                m = dataclasses.replace(m, fabric=netns.fabric_for(conns[m.netns_kind]))
            found[m.name] = m
        _modes.update(found)
    return _modes


def connections() -> dict[str, Callable[..., contextlib.AbstractContextManager]]:
    """Every namespace connection by name: what each registered mode module lists in its
    ``CONNECTIONS`` (the plain veth pair is testbed.attachments.netns's)."""
    if not _connections:
        for module in _modules():
            _connections.update(getattr(module, "CONNECTIONS", {}))
    return dict(_connections)


def accepts(kind: str, option: str) -> bool:
    """Whether the connection ``kind`` takes ``option`` (``path_offloads`` only where the
    path has links of its own between the endpoints)."""
    import inspect
    return option in inspect.signature(connections()[kind]).parameters


@contextlib.contextmanager
def connect(kind: str, tag: str, **kw) -> Iterator[Any]:
    """Any namespace connection by name (see connections()); ``kw`` goes to its builder
    (subnet, mtu, offloads, and what the kind takes: path_offloads, switch, tso, chain, link)."""
    known = connections()
    if kind not in known:
        raise TestbedError(f"unknown namespace connection {kind!r}; one of {', '.join(known)}")
    with known[kind](tag, **kw) as conn:
        yield conn


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
