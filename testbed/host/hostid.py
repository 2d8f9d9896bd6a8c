"""Which host measured a run: a stable identity recorded in every run.json's environment.

A hostname is not an identity (hosts are renamed, cloned images share one); /etc/machine-id
is, for the life of an installation. The host class (a hardware generation, a rack type) is
the operator's word for hosts that ought to measure alike: it comes from the fleet inventory
(``testbed_host_class``, passed down as TESTBED_HOST_CLASS) and is None when nobody said.

TESTBED_MACHINE_ID overrides the machine id. It exists for fleets tested on one machine
(several sshd targets on one host must look like several hosts); the environment records
``machine_id_source`` so such a run never passes for a real host's.
"""
from __future__ import annotations

import os
import re
from pathlib import Path

#: where the identity came from when not /etc/machine-id
OVERRIDE = "TESTBED_MACHINE_ID"
CLASS = "TESTBED_HOST_CLASS"
#: the inventory name of the host a fleet run went to (testbed fleet run sets it)
INVENTORY_HOST = "TESTBED_INVENTORY_HOST"

_ID = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")


def machine_id(root: Path = Path("/")) -> tuple[str | None, str]:
    """(machine id, where it came from). None when unreadable: never made up."""
    forced = os.environ.get(OVERRIDE)
    if forced:
        return (forced if _ID.match(forced) else None), OVERRIDE
    for p in (root / "etc/machine-id", root / "var/lib/dbus/machine-id"):
        try:
            text = p.read_text().strip()
        except OSError:
            continue
        if _ID.match(text):
            return text, "/" + p.relative_to(root).as_posix()
    return None, "unreadable"


def _clean(name: str) -> str | None:
    """Free text (a class may be "EPYC gen 3"), one printable line of at most 128 characters;
    anything else is not recorded rather than recorded garbled."""
    v = (os.environ.get(name) or "").strip()
    return v if v and len(v) <= 128 and v.isprintable() else None


def identity() -> dict[str, str | None]:
    """The identity keys a run's environment carries (hostname and CPU model are already
    there under ``host`` and ``cpu_model``)."""
    mid, source = machine_id()
    return {"machine_id": mid, "machine_id_source": source, "host_class": _clean(CLASS),
            "inventory_host": _clean(INVENTORY_HOST)}


def host_key(env: dict) -> str:
    """The key a history series is kept apart by: the machine id, else (runs recorded before
    it was) the hostname, else 'unknown-host'."""
    return str(env.get("machine_id") or env.get("host") or "unknown-host")


#: a fleet pair's run: which of the topology's hosts is the pair's second host, and that
#: host's inventory name, class and (testing only) machine id override
PEER, PEER_INVENTORY_HOST, PEER_CLASS, PEER_MACHINE_ID = (
    "TESTBED_PEER", "TESTBED_PEER_INVENTORY_HOST", "TESTBED_PEER_HOST_CLASS", "TESTBED_PEER_MACHINE_ID")


def peer_identity(host_name: str, machine_id: str | None) -> dict[str, str | None]:
    """The identity keys of a remote host's fingerprint: for a fleet pair's second host, its
    inventory name and class (and the machine id override a test fleet gives it)."""
    out: dict[str, str | None] = {"machine_id": machine_id,
                                  "machine_id_source": "/etc/machine-id" if machine_id else "unreadable"}
    if os.environ.get(PEER) != host_name:
        return out
    forced = os.environ.get(PEER_MACHINE_ID)
    if forced:
        out = {"machine_id": forced if _ID.match(forced) else None, "machine_id_source": PEER_MACHINE_ID}
    return {**out, "host_class": _clean(PEER_CLASS), "inventory_host": _clean(PEER_INVENTORY_HOST)}


#: the remote probe's line that reads the machine id (environment._REMOTE_PROBE)
REMOTE_PROBE = 'echo "machine_id=$(cat /etc/machine-id 2>/dev/null)"\n'
