"""The inventory, read by Ansible itself and checked before anything connects.

Bad input is refused here with exit status 2, one line naming the file (or the Ansible
setting, or the argument), the host and the variable, before a fleet folder, a wheel or a
connection exists:

1. the files Ansible will read (the inventory, a folder of them, the group_vars and host_vars
   beside it, the ansible.cfg files) are regular files of bounded size: a FIFO, a device or a
   20 MB one-liner is refused at once, unread;
2. Ansible reads them (testbed.fleet.ansread, in a process of its own, with limits), and says
   which of its settings the user's environment changed: testbed.fleet.ansenv checks those;
3. every host's name (testbed.fleet.hostvars.check_name) and merged variables
   (hostvars.check_host: an allow-list, each value checked) are checked;
4. pairs (testbed_peer) and each host's topology overrides are checked.

What the run is then given is the inventory as checked (:func:`write_checked`): a YAML file
of plain values that Ansible reads instead of the user's files, so nothing is read twice and
nothing unchecked reaches ssh.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import stat
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from testbed.errors import CommandError, TestbedError, one_line
from testbed.fleet import ansenv, hostvars
from testbed.host import proc, safeio
from testbed.host.safeio import UserFileError
from testbed.topology import config

#: one file of an inventory (or of its group_vars/host_vars), and all of them together
MAX_FILE_BYTES = 1 << 20
MAX_TOTAL_BYTES = 16 << 20
MAX_FILES = 5000
MAX_DEPTH = 16
#: YAML values an inventory file may expand to through its aliases (a "billion laughs"
#: is a few hundred bytes that expand to gigabytes)
MAX_YAML_VALUES = 200_000
#: seconds Ansible may take to read an inventory; hosts it may hold
READ_TIMEOUT_S = 60
MAX_HOSTS = 5000


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
    #: the variables the run is given (checked; plain values)
    vars: dict[str, Any] = field(default_factory=dict)
    #: the folder its fetched run goes to (hostvars.host_folder)
    folder: str = ""
    known_hosts: Path | None = None
    ssh_config: Path | None = None
    secret_values: tuple[str, ...] = ()

    @property
    def host_class(self) -> str | None:
        v = self.vars.get("testbed_host_class")
        return None if v in (None, "") else str(v)

    @property
    def overrides(self) -> dict[str, Any]:
        v = self.vars.get("testbed_topology_overrides") or {}
        return dict(v) if isinstance(v, dict) else {}

    @property
    def peer(self) -> str | None:
        v = self.vars.get("testbed_peer")
        return None if v in (None, "") else str(v)

    @property
    def address(self) -> str:
        """Where Ansible connects (its control address)."""
        return str(self.vars.get("ansible_host") or self.vars.get("ansible_ssh_host") or self.name)

    @property
    def port(self) -> int:
        return int(self.vars.get("ansible_port") or self.vars.get("ansible_ssh_port") or 22)

    def secrets(self) -> list[str]:
        return list(self.secret_values)


# --------------------------------------------------------------------------- the files

def check_sources(inventory: str | os.PathLike) -> None:
    """Every file Ansible reads for this inventory: regular (never opened otherwise), each at
    most MAX_FILE_BYTES, together at most MAX_TOTAL_BYTES, with YAML aliases that expand to
    at most MAX_YAML_VALUES values."""
    inv = Path(inventory)
    try:
        st = os.stat(inv)
    except FileNotFoundError:
        raise UserFileError(inventory, "no such inventory file or folder") from None
    except OSError as e:
        raise UserFileError(inventory, f"cannot be read: {e.strerror}") from None
    roots = [inv] if stat.S_ISDIR(st.st_mode) else []
    if not stat.S_ISDIR(st.st_mode):
        _not_a_plugin(_check_file(inv, str(inventory))[1], str(inventory))
        roots += [inv.parent / d for d in ("group_vars", "host_vars") if os.path.lexists(inv.parent / d)]
    total, count = 0, 0
    for root in roots:
        for path, depth in _walk(root):
            count += 1
            if count > MAX_FILES:
                raise UserFileError(root, f"holds more than {MAX_FILES} files")
            if depth > MAX_DEPTH:
                raise UserFileError(path, f"more than {MAX_DEPTH} folders deep")
            if path.is_dir():
                continue
            total += _check_file(path, str(path))[0]
            if total > MAX_TOTAL_BYTES:
                raise UserFileError(inventory, f"its files take more than {MAX_TOTAL_BYTES} bytes")


def _walk(root: Path):
    stack = [(root, 0)]
    seen: set[tuple[int, int]] = set()
    while stack:
        d, depth = stack.pop()
        try:
            st = os.stat(d)
        except OSError as e:
            raise UserFileError(d, f"cannot be read: {e.strerror or e}") from None
        if not stat.S_ISDIR(st.st_mode):
            yield d, depth
            continue
        if (st.st_dev, st.st_ino) in seen:
            raise UserFileError(d, "a folder that contains itself (a symbolic link loop)")
        seen.add((st.st_dev, st.st_ino))
        yield d, depth
        try:
            names = sorted(os.listdir(d))
        except OSError as e:
            raise UserFileError(d, f"cannot be read: {e.strerror}") from None
        stack.extend((d / n, depth + 1) for n in reversed(names))


def _check_file(path: Path, where: str) -> tuple[int, str]:
    """One file Ansible reads, read once: its size in bytes and its text."""
    data = safeio.read_regular(path, MAX_FILE_BYTES, where)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise UserFileError(where, f"not UTF-8 text (byte {e.start})") from None
    if b"\0" in data:
        raise UserFileError(where, f"holds a NUL byte (byte {data.index(bytes(1))})")
    if (n := _range_hosts(text)) > MAX_HOSTS:
        raise UserFileError(where, f"its host ranges ([0:99]) expand to {n} hosts; a fleet takes at most {MAX_HOSTS}")
    if (m := _PYTHON_TAG.search(text)) is not None:
        raise UserFileError(where, f"line {text.count(chr(10), 0, m.start()) + 1}: a YAML tag that builds a "
                                   f"Python object ({m.group(0)}); a fleet takes plain values")
    if b"&" in data and b"*" in data:
        n = _yaml_values(data)
        if n > MAX_YAML_VALUES:
            raise UserFileError(where, f"its YAML aliases expand to more than {MAX_YAML_VALUES} values")
    return len(data), text


#: YAML tags that build Python objects (Ansible's loader refuses them too, without saying where)
_PYTHON_TAG = re.compile(r"!!?python/[A-Za-z_/:.]*|tag:yaml\.org,2002:python/[A-Za-z_/:.]*")


def _not_a_plugin(text: str, where: str) -> None:
    """An inventory source (``text``, as read and checked) that configures an inventory
    plugin (``plugin: aws_ec2``) is no list of hosts: Ansible's reader here takes INI and
    YAML host lists only, and would say no more than that it failed to parse the file."""
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError:
        return                      # INI, or not YAML: Ansible's reader says what is wrong
    if isinstance(data, dict) and "plugin" in data:
        raise UserFileError(where, f"plugin: names an inventory plugin ({str(data['plugin'])[:40]}); a fleet "
                                   f"reads a list of hosts and groups (INI or YAML), never a plugin's source")


_RANGE = re.compile(r"\[([0-9]+|[a-z]):([0-9]+|[a-z])(?::([0-9]+))?\]")


def _range_hosts(text: str) -> int:
    """How many hosts the host ranges of a text expand to (Ansible's ``h[0:99]``,
    ``[a:f]``, with a stride), counted, not expanded: ``h[0:999999999]`` is a few bytes."""
    total = 0
    for line in text.splitlines():
        n = 1
        for lo, hi, step in _RANGE.findall(line):
            a, b = (int(lo), int(hi)) if lo.isdigit() and hi.isdigit() else (ord(lo[0]), ord(hi[0]))
            n *= max(1, (b - a) // max(1, int(step or 1)) + 1)
            if n > 10 * MAX_HOSTS:
                return n
        total += n if _RANGE.search(line) else 0
    return total


def _yaml_values(data: bytes) -> int:
    """How many values a YAML text expands to through its aliases, counted on the composed
    graph without expanding it (0 when it is not YAML: an INI file)."""
    try:
        loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
        root = yaml.compose(data, Loader=loader)
    except (yaml.YAMLError, RecursionError, ValueError):
        return 0
    memo: dict[int, int] = {}

    def size(node: Any) -> int:
        # iterative post-order with a memo per node: an alias is the same node object
        stack = [(node, False)]
        while stack:
            n, done = stack.pop()
            if id(n) in memo:
                continue
            kids = ([x for kv in n.value for x in kv] if isinstance(n, yaml.MappingNode)
                    else n.value if isinstance(n, yaml.SequenceNode) else [])
            if done:
                memo[id(n)] = min(1 + sum(memo[id(k)] for k in kids), 10 * MAX_YAML_VALUES)
            else:
                stack.append((n, True))
                stack.extend((k, False) for k in kids if id(k) not in memo)
        return memo[id(node)]
    return size(root) if root is not None else 0


# --------------------------------------------------------------------------- reading

def read(inventory: str | os.PathLike, limit: str | None = None) -> tuple[list[list[Any]], list[tuple[str, dict]]]:
    """Ansible's settings the user changed, and the inventory's hosts (within ``limit``)
    with their merged variables, as Ansible reads them."""
    ansenv.check_config_files()
    check_sources(inventory)
    if limit is not None:
        check_limit(limit)
    req = json.dumps({"inventory": str(Path(inventory).absolute()), "limit": limit})
    helper = Path(__file__).with_name("ansread.py")
    try:
        # run from an empty folder, as the playbook runs from its own: an ansible.cfg in the
        # current folder is read by neither
        with tempfile.TemporaryDirectory(prefix="testbed-read-") as cwd:
            out = proc.run([sys.executable, "-I", str(helper), req], timeout=READ_TIMEOUT_S,
                           env=ansenv.reader_env(), cwd=cwd).stdout
    except CommandError as e:
        why = (f"Ansible took more than {READ_TIMEOUT_S} s to read it" if e.timed_out
               else f"Ansible cannot read it: {one_line(e.stderr_tail, 300)}")
        raise UserFileError(inventory, why) from None
    try:
        data = json.loads(out)
    except ValueError:
        raise UserFileError(inventory, f"Ansible's reader said: {one_line(out, 300)}") from None
    if data.get("error"):
        # a setting of the user's that broke the reader (a Jinja2 extension that is no
        # module) is what to name, not the reader's failure it caused
        ansenv.check_settings(data.get("settings") or [])
        raise UserFileError(inventory, data["error"])
    return data["settings"], [(str(n), v if isinstance(v, dict) else {}) for n, v in data["hosts"]]


def check_limit(limit: str) -> None:
    if not limit.strip() or not limit.isprintable() or len(limit) > 4096:
        raise UserFileError("--limit", "an empty or unprintable host pattern")
    if limit.startswith("-"):
        raise UserFileError("--limit", f"{limit[:60]!r} begins with '-'")
    if any(p.strip().lstrip("!&").startswith("@") for p in limit.replace(":", ",").split(",")):
        raise UserFileError("--limit", "@FILE patterns are not taken: name the hosts or groups")


def list_hosts(inventory: str | os.PathLike, limit: str | None = None) -> list[Host]:
    """The inventory's hosts (within --limit), every one checked (names, variables, the
    controller files they name, pairs); the user's Ansible settings checked too."""
    settings, raw = read(inventory, limit)
    kept = ansenv.check_settings(settings)
    if not raw:
        raise UserFileError(f"--limit {limit}" if limit else inventory,
                            "matches no host of the inventory" if limit else "holds no host")
    hosts: list[Host] = []
    folders: dict[str, str] = {}
    for name, hv in raw:
        try:
            hostvars.check_name(name)
            c = hostvars.check_host(name, hv)
        except hostvars.VarError as e:
            raise UserFileError(inventory, f"host {one_line(name, 80)}: {e}") from None
        run = dict(c.run_vars)
        # the user's ssh arguments from ansible.cfg/ANSIBLE_*, where the host gives none
        # (as Ansible would), so the fleet's own additions (known_hosts) do not drop them
        if "ssh_common_args" in kept and "ansible_ssh_common_args" not in run:
            run["ansible_ssh_common_args"] = kept["ssh_common_args"]
        folder = hostvars.host_folder(name)
        if folder in folders:
            raise UserFileError(inventory, f"hosts {folders[folder]} and {name}: one folder for both")
        folders[folder] = name
        hosts.append(Host(name, run, folder, c.known_hosts, c.ssh_config, c.secrets))
    return hosts


# --------------------------------------------------------------------------- topology

def topology_data(path: str | Path) -> dict[str, Any]:
    """The topology file as data: read as every topology is (regular file, size cap, UTF-8,
    composed with bounded depth, plain tags), a mapping. Validated by config.load (or, for a
    pair's, config.parse with the pair's hosts in: fleet.pairs.check)."""
    from testbed.errors import ConfigError
    from testbed.topology import yamlnode
    text = yamlnode.read_text(path, what="topology")
    root = yamlnode.compose(text, str(path))
    if not isinstance(root, yaml.MappingNode):
        raise ConfigError(str(path), "(top level)", "expected a mapping")
    try:
        data = yaml.safe_load(text)
        json.dumps(data, allow_nan=False)        # what the run is given: plain data only
    except yaml.YAMLError as e:
        raise ConfigError(str(path), "(yaml)", f"not plain YAML data: {str(e).splitlines()[0]}") from None
    except (TypeError, ValueError) as e:
        raise ConfigError(str(path), "(yaml)", f"holds a value that is not plain data ({e})") from None
    return data


def merge(base: Any, over: Any) -> Any:
    """Recursive merge, as Ansible's combine(recursive=True) does it on the target."""
    if isinstance(base, dict) and isinstance(over, dict):
        return {**base, **{k: merge(base.get(k), v) for k, v in over.items()}}
    return over


def check_topologies(topology: str | Path, data: dict[str, Any], hosts: list[Host]) -> None:
    """Every host's topology (the file plus its testbed_topology_overrides) must be valid."""
    for h in hosts:
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


# --------------------------------------------------------------------------- the run's copy

def checked_inventory(hosts: list[Host], extra: dict[str, dict[str, Any]] | None = None) -> dict[str, Any]:
    """The inventory the run reads: every host with its checked variables (and ``extra``
    ones the fleet adds per host), in one group."""
    out = {}
    for h in hosts:
        v = {**h.vars, **((extra or {}).get(h.name) or {})}
        out[h.name] = v
    return {"all": {"hosts": out}}


def write_checked(path: Path, inv: dict[str, Any]) -> None:
    """Written private (0600): a host's become password may be in it. Ansible renders every
    value of it on the controller, so none may be a template, whatever the check that let it
    through (the fleet's own values too: a host key, a topology)."""
    from testbed.fleet.hostvars import find_template
    if (where := find_template(inv)) is not None:
        raise UserFileError(str(path), f"{where}: a Jinja2 template; Ansible would render it on the controller")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(json.dumps(inv, indent=1))       # JSON is YAML; plain values only
