"""The inventory, read by Ansible itself (`ansible-inventory --list`), checked before any work.

Bad input is refused here with exit status 2, one line, before a wheel is built or a host
touched: an inventory Ansible cannot read, a --limit that matches no host, a host that
switches host key checking off, a host whose topology values make the topology invalid.
"""
from __future__ import annotations

import json
import re
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from testbed.errors import CommandError, TestbedError, one_line
from testbed.host import proc
from testbed.host.safeio import UserFileError
from testbed.topology import config

#: host vars whose values are credentials: never written to fleet.json, logs or reasons
SECRET_VAR = re.compile(r"pass|secret|token|private_key_passphrase|vault", re.I)
#: ssh options that turn host key verification off
_NO_CHECK = re.compile(r"StrictHostKeyChecking\s*=?\s*(no|off|accept-new)|UserKnownHostsFile\s*=?\s*/dev/null", re.I)


class FleetError(TestbedError):
    """Ansible is missing or failed as a whole (not one host): exit status 3 when missing."""

    exit_status = 1


def require_ansible() -> None:
    """ansible-runner and ansible-core importable and ansible-playbook found, else exit 3."""
    try:
        import ansible_runner  # noqa: F401
    except ImportError:
        err = FleetError("ansible-runner is not installed: install the testbed's fleet extra "
                         "(pip install 'testbed[fleet]')")
        err.exit_status = 3
        raise err from None
    ansible_binary("ansible-playbook")


def ansible_binary(name: str) -> str:
    """An Ansible command installed beside this Python (the venv), else on PATH."""
    here = Path(sys.executable).parent / name
    found = str(here) if here.is_file() else shutil.which(name)
    if not found:
        err = FleetError(f"{name} not found: install the testbed's fleet extra "
                         f"(pip install 'testbed[fleet]')")
        err.exit_status = 3
        raise err
    return found


@dataclass(frozen=True)
class Host:
    name: str
    vars: dict[str, Any] = field(default_factory=dict)

    @property
    def host_class(self) -> str | None:
        v = self.vars.get("testbed_host_class")
        return None if v in (None, "") else str(v)

    @property
    def overrides(self) -> dict[str, Any]:
        v = self.vars.get("testbed_topology_overrides") or {}
        return dict(v) if isinstance(v, dict) else {}

    def secrets(self) -> list[str]:
        return [str(v) for k, v in self.vars.items()
                if SECRET_VAR.search(k) and isinstance(v, (str, int)) and str(v)]


def list_hosts(inventory: str | Path, limit: str | None = None) -> list[Host]:
    """The inventory's hosts (within --limit) with their merged host and group vars."""
    inv = Path(inventory)
    if not inv.exists():
        raise UserFileError(inventory, "no such inventory file or folder")
    argv = [ansible_binary("ansible-inventory"), "-i", str(inv), "--list"]
    if limit:
        argv += ["--limit", limit]
    try:
        out = proc.run(argv, timeout=120, env={"ANSIBLE_INVENTORY_UNPARSED_FAILED": "True",
                                               "ANSIBLE_NOCOLOR": "1"}).stdout
    except CommandError as e:
        raise UserFileError(inventory, f"Ansible cannot read it: {one_line(e.stderr_tail, 300)}") from None
    data = json.loads(out)
    meta = (data.get("_meta") or {}).get("hostvars") or {}
    names: list[str] = []

    def walk(group: str, seen: set[str]) -> None:
        if group in seen:
            return
        seen.add(group)
        g = data.get(group) or {}
        names.extend(h for h in g.get("hosts") or () if h not in names)
        for child in g.get("children") or ():
            walk(child, seen)
    walk("all", set())
    if not names:
        raise UserFileError(f"--limit {limit}" if limit else inventory,
                            "matches no host of the inventory" if limit else "holds no host")
    return [Host(n, dict(meta.get(n) or {})) for n in names]


def check_vars(inventory: str | Path, hosts: list[Host]) -> None:
    """The testbed's own host vars, checked before any host is touched."""
    for h in hosts:
        for key in ("testbed_host_class", "testbed_machine_id"):
            v = h.vars.get(key)
            if v in (None, ""):
                continue
            if not isinstance(v, (str, int)) or not str(v).isprintable() or len(str(v)) > 128:
                raise UserFileError(inventory, f"host {h.name}: {key} must be one printable "
                                               f"line of at most 128 characters")
        shared = h.vars.get("testbed_shared_host")
        if shared is not None and not isinstance(shared, bool):
            raise UserFileError(inventory, f"host {h.name}: testbed_shared_host must be true or false, "
                                           f"not {str(shared)[:40]!r}")
        mid = h.vars.get("testbed_machine_id")
        if mid not in (None, "") and not re.match(r"^[A-Za-z0-9._:-]{1,128}$", str(mid)):
            raise UserFileError(inventory, f"host {h.name}: testbed_machine_id may hold letters, "
                                           f"digits and . _ : - only")


def check_trust(inventory: str | Path, hosts: list[Host]) -> None:
    """Host keys are verified on a fleet: a host that turns the check off is refused."""
    for h in hosts:
        v = h.vars
        if str(v.get("ansible_host_key_checking", True)).lower() in ("false", "no", "0", "off"):
            raise UserFileError(inventory, f"host {h.name}: ansible_host_key_checking is off; "
                                           f"a fleet verifies host keys (give a known_hosts file)")
        for key in ("ansible_ssh_common_args", "ansible_ssh_extra_args", "ansible_ssh_args"):
            if _NO_CHECK.search(str(v.get(key) or "")):
                raise UserFileError(inventory, f"host {h.name}: {key} turns host key checking "
                                               f"off; a fleet verifies host keys")


def topology_data(path: str | Path) -> dict[str, Any]:
    """The topology file as data, after it was validated whole (config.load)."""
    config.load(path)
    return yaml.safe_load(Path(path).read_text())


def merge(base: Any, over: Any) -> Any:
    """Recursive merge, as Ansible's combine(recursive=True) does it on the target."""
    if isinstance(base, dict) and isinstance(over, dict):
        return {**base, **{k: merge(base.get(k), v) for k, v in over.items()}}
    return over


def check_topologies(topology: str | Path, data: dict[str, Any], hosts: list[Host]) -> None:
    """Every host's topology (the file plus its testbed_topology_overrides) must be valid."""
    for h in hosts:
        raw = h.vars.get("testbed_topology_overrides")
        if raw is not None and not isinstance(raw, dict):
            raise UserFileError(topology, f"host {h.name}: testbed_topology_overrides must be a "
                                          f"mapping, found {type(raw).__name__}")
        if h.overrides:
            config.parse(yaml.safe_dump(merge(data, h.overrides)),
                         f"{topology} (with host {h.name}'s testbed_topology_overrides)",
                         base=Path(topology).absolute().parent)


def scrub(text: str | None, hosts: list[Host]) -> str | None:
    """A reason with every credential the inventory holds blanked out."""
    if text is None:
        return None
    for h in hosts:
        for s in h.secrets():
            if len(s) >= 4:
                text = text.replace(s, "********")
    return text
