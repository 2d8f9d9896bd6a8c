"""NIC offloads through ethtool, on any executor (testbed.host.executor): a host's or a
namespace's link, or a guest's NIC through its agent. One implementation of switching them
and of reading back what holds."""
from __future__ import annotations

import logging
import re

from testbed.host.executor import Executor, Local
from testbed.topology.model import Offloads

log = logging.getLogger(__name__)

# ethtool -K short name -> the line ethtool -k prints for it
_ETHTOOL_K = {"tx": "tx-checksumming", "tso": "tcp-segmentation-offload",
              "gso": "generic-segmentation-offload", "gro": "generic-receive-offload",
              "lro": "large-receive-offload"}


def parse_ethtool_k(text: str) -> tuple[tuple[str, str], ...]:
    """Pure: `ethtool -k` output -> (short name, state) for the offloads the testbed switches."""
    states = {}
    for line in text.splitlines():
        m = re.match(r"^([a-z-]+):\s+(.+)$", line.strip())
        if m:
            states[m.group(1)] = m.group(2).strip()
    return tuple((short, states.get(long, "unknown")) for short, long in _ETHTOOL_K.items())


def read_offloads(ex: Executor | None, ifname: str, ethtool: str = "ethtool",
                  timeout: float = 10) -> tuple[tuple[str, str], ...]:
    return parse_ethtool_k((ex or Local()).run([ethtool, "-k", ifname], timeout=timeout).stdout)


def apply_offloads(ex: Executor | None, ifname: str, want: Offloads | None,
                   ethtool: str = "ethtool", timeout: float = 10) -> tuple[tuple[str, str], ...]:
    """Ask ethtool for each feature separately (one fixed feature must not stop the others;
    the kernel also drags dependent features along), then return what the device reports."""
    ex = ex or Local()
    for name, on_ in (want.requested() if want else []):
        res = ex.run([ethtool, "-K", ifname, name, "on" if on_ else "off"], timeout=timeout, check=False)
        if res.rc != 0:
            log.debug("ethtool -K %s %s: rc %s: %s", ifname, name, res.rc, res.stderr.strip())
    return read_offloads(ex, ifname, ethtool, timeout)
