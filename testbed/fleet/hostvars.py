"""Every variable a fleet host may carry, by allow-list, checked after Ansible merged them
(inventory, group_vars, host_vars) and before anything connects.

- ``ansible_*``: only the connection settings listed in :data:`ANSIBLE_VARS`, each with its
  check. The rest (``ansible_ssh_args``, which would replace the fleet's own ssh options;
  ``ansible_ssh_executable``, ``ansible_connection: local``, ``ansible_ssh_pkcs11_provider``,
  ``ansible_private_key`` with the key itself, ``ansible_become_exe``...) is refused, named.
- ``testbed_*``: the role's variables (its defaults/main.yml) and the fleet's own, each typed.
  Those the fleet sets itself per run (``testbed_wheel``, ``testbed_fleet_dir``...) are
  refused: an inventory does not steer where the controller writes or what it installs.
- Any other variable is left out of the run (the role never reads it), so a group_vars
  written for other playbooks does not stop a fleet.

A value passed on is a plain value: a Jinja2 template (``{{ lookup('pipe', ...) }}``) would be
rendered by Ansible on the controller, so one is refused wherever it is.

Pure but for stat() of the controller's files a host names (its key, known_hosts, ssh_config).
"""
from __future__ import annotations

import hashlib
import ipaddress
import os
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from testbed.fleet import sshopts
from testbed.host import safeio

#: host names: what a host's folder under the fleet run may be called as it is
SAFE_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.:@+-]{0,127}$")
#: variable names whose values are credentials: kept out of records, reasons and logs
SECRET = re.compile(r"pass|secret|token|private_key_passphrase|vault", re.I)
_TEMPLATE = re.compile(r"\{\{|\{%|\{#")
_ABS_PATH = re.compile(r"^/[A-Za-z0-9._/+@:-]{0,1023}$")
_IFNAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.:-]{0,14}$")
_DEB = re.compile(r"[a-z0-9][a-z0-9+.-]{1,100}")       # fullmatch: `$` would pass a newline
_MACHINE_ID = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")
_TRUE, _FALSE = ("true", "yes", "on", "1", "y", "t"), ("false", "no", "off", "0", "n", "f")
#: bytes of a controller file a host names (a key, known_hosts, ssh_config)
MAX_SIDE_FILE = 1 << 20


class VarError(ValueError):
    """One variable of one host refused: ``var`` and why."""

    def __init__(self, var: str, why: str) -> None:
        self.var, self.why = var, why
        super().__init__(f"{var}: {why}")


def host_folder(name: str) -> str:
    """The folder a host's fetched run goes to: the name itself when it is plain, else a
    sanitised form with a digest of the name, so two names never share a folder and none is
    a path (``..``, ``/``)."""
    if SAFE_NAME.match(name) and name not in (".", "..") and ".." not in name:
        return name
    slug = re.sub(r"[^A-Za-z0-9_.-]+", "_", name).strip("._-")[:40] or "host"
    return f"{slug}-{hashlib.sha256(name.encode('utf-8', 'surrogatepass')).hexdigest()[:10]}"


def check_name(name: str) -> None:
    """A host's inventory name: it reaches ssh as the address when ansible_host is not set,
    and names the host in every message."""
    if not isinstance(name, str) or not name:
        raise VarError("(host name)", "empty")
    if not name.isprintable() or any(c.isspace() for c in name):
        raise VarError("(host name)", "holds control characters or blanks")
    if name.startswith("-"):
        raise VarError("(host name)", "begins with '-' (ssh would read it as an option)")
    if "/" in name or "\\" in name or name in (".", "..") or ".." in name.split("."):
        raise VarError("(host name)", "is a path ('/', '..'); a host name names a host")
    if not SAFE_NAME.match(name):
        raise VarError("(host name)", "may hold letters, digits and . _ : @ + - only, at most 128")


def boolean(v: Any) -> bool:
    if isinstance(v, bool):
        return v
    if isinstance(v, (str, int)) and str(v).strip().lower() in _TRUE:
        return True
    if isinstance(v, (str, int)) and str(v).strip().lower() in _FALSE:
        return False
    raise ValueError(f"expected true or false, not {_show(v)}")


def _show(v: Any) -> str:
    return repr(v)[:60]


def _text(v: Any, *, limit: int = 256) -> str:
    if isinstance(v, bool) or not isinstance(v, (str, int)):
        raise ValueError(f"expected text, not {type(v).__name__}")
    t = str(v)
    if not t.isprintable():
        raise ValueError("holds control characters")
    if len(t) > limit:
        raise ValueError(f"longer than {limit} characters")
    return t


def integer(low: int, high: int) -> Callable[[Any], int]:
    def check(v: Any) -> int:
        if isinstance(v, bool) or not isinstance(v, (int, str)) or not re.match(r"^\s*[0-9]{1,9}\s*$", str(v)):
            raise ValueError(f"expected a whole number from {low} to {high}, not {_show(v)}")
        n = int(str(v))
        if not low <= n <= high:
            raise ValueError(f"expected a whole number from {low} to {high}, not {n}")
        return n
    return check


def address(v: Any) -> str:
    t = _text(v)
    if not sshopts.is_host(t):
        raise ValueError(f"{t[:60]!r} is not a host name or an IP address"
                         + (" (it begins with '-': ssh would read it as an option)" if t.startswith("-") else ""))
    return t


def user(v: Any) -> str:
    t = _text(v)
    if not sshopts.is_user(t):
        raise ValueError(f"{t[:60]!r} is not a user name" + (" (it begins with '-')" if t.startswith("-") else ""))
    return t


def target_path(v: Any) -> str:
    """A path on the target: absolute, plain characters, no '..'."""
    t = _text(v, limit=1024)
    if not _ABS_PATH.match(t) or "/../" in t + "/" or t.endswith("/.."):
        raise ValueError(f"{t[:60]!r} is not an absolute path of plain characters without '..'")
    return t


def _python(v: Any) -> str:
    t = _text(v)
    if t in ("auto", "auto_silent", "auto_legacy", "auto_legacy_silent") or re.match(r"^python3(\.[0-9]{1,2})?$", t):
        return t
    return target_path(t)


def _secret(v: Any) -> Any:
    if isinstance(v, dict) and "__unreadable__" in v:
        raise ValueError("cannot be read (a vault-encrypted value? the fleet takes none: use "
                         "key logins and a become method without a password)")
    if isinstance(v, bool) or not isinstance(v, (str, int)):
        raise ValueError(f"expected text, not {type(v).__name__}")
    return v


def _key_material(t: str) -> bool:
    s = t.strip()
    return ("-----BEGIN" in s or "PRIVATE KEY" in s or "\n" in t or len(s) > 1024
            or (len(s) >= 64 and re.fullmatch(r"[A-Za-z0-9+/=]+", s) is not None)
            or s.startswith(("ssh-ed25519 ", "ssh-rsa ", "ecdsa-")))


def controller_file(v: Any, *, what: str, base: Path | None = None, read: bool = False) -> Path:
    """A file on the controller that a host names: a regular file (never a FIFO, device or
    folder), at most :data:`MAX_SIDE_FILE` bytes, by absolute path. Read only when ``read``."""
    if isinstance(v, bool) or not isinstance(v, str):
        raise ValueError(f"expected the path of {what}, not {type(v).__name__}")
    if _key_material(v):
        raise ValueError(f"holds key material itself, not the path of {what}: a key given inline "
                         f"ends up on ssh's command line, readable by every user of the controller")
    if not v or not v.isprintable() or v.startswith("-") or len(v) > 4096:
        raise ValueError(f"{v[:60]!r} is not a plain file name")
    if not sshopts.plain_path(v):
        raise ValueError(f"{v[:60]!r}: a path with blanks, quotes or backslashes, which ssh splits or "
                         f"unquotes into other files than the one checked; give {what} a plain path")
    p = Path(os.path.expanduser(v))
    if not p.is_absolute():
        p = (base or Path.cwd()) / p
    p = Path(os.path.abspath(p))
    try:
        size = (len(safeio.read_regular(p, MAX_SIDE_FILE, str(p))) if read
                else safeio.check_regular(p, MAX_SIDE_FILE, str(p)))
    except safeio.UserFileError as e:
        raise ValueError(f"{what}: {e}") from None
    if any(Path(os.path.realpath(p)).is_relative_to(k) for k in _KERNEL_FILES):
        raise ValueError(f"{what}: {p} is a kernel interface file (/proc, /sys, /dev), not {what}")
    if size == 0:
        raise ValueError(f"{what}: {p} is empty")
    return p


#: pseudo file systems whose files stat() calls regular (and empty) but that block or change
#: when read: never a key, known_hosts or ssh_config
_KERNEL_FILES = (Path("/proc"), Path("/sys"), Path("/dev"))
#: a known_hosts line: an optional marker, host patterns (names, addresses, [host]:port,
#: wildcards, negations, or a hashed |1|salt|hash), a key type, the key in base64, a comment
_KH_MARKER = ("@cert-authority", "@revoked")
_KH_HOSTS = re.compile(r"[A-Za-z0-9_.:*?!,\[\]|=+/%-]{1,4096}")
_KH_TYPE = re.compile(r"(ssh|ecdsa|sk|rsa)-[A-Za-z0-9@.-]{1,60}")
_KH_KEY = re.compile(r"[A-Za-z0-9+/]{16,16384}={0,3}")


def host_key_line(line: str) -> str | None:
    """Why ``line`` (not blank, not a comment) is no known_hosts line, or None. The fields
    reach the run (a pair's first host checks its peer with them), so nothing in one may be
    read as anything but a host key: no template, no blank inside a field."""
    if not line.isprintable() or _TEMPLATE.search(line):
        return "holds control characters or a Jinja2 template"
    parts = line.split()
    if parts and parts[0].startswith("@"):
        if parts[0] not in _KH_MARKER:
            return f"{parts[0][:30]!r} is not a known_hosts marker (@cert-authority, @revoked)"
        parts = parts[1:]
    if len(parts) < 3:
        return "is not a known_hosts line (hosts key-type key)"
    if not _KH_HOSTS.fullmatch(parts[0]):
        return f"{parts[0][:40]!r} is not a list of host patterns"
    if not _KH_TYPE.fullmatch(parts[1]):
        return f"{parts[1][:40]!r} is not an ssh key type"
    if not _KH_KEY.fullmatch(parts[2]):
        return "its key is not base64"
    return None


def _known_hosts(v: Any) -> Path:
    p = controller_file(v, what="a known_hosts file")
    text = safeio.read_regular(p, MAX_SIDE_FILE).decode("utf-8", "replace")
    lines = [ln for ln in text.splitlines() if ln.strip() and not ln.lstrip().startswith("#")]
    for n, ln in enumerate(text.splitlines(), 1):
        if ln.strip() and not ln.lstrip().startswith("#") and (why := host_key_line(ln.strip())):
            raise ValueError(f"{p}: line {n}: {why}")
    if not lines:
        raise ValueError(f"{p}: holds no host key")
    return p


def _ssh_config(v: Any) -> Path:
    p = controller_file(v, what="an ssh_config file")
    files: list[str] = []
    try:
        sshopts.check_config(safeio.read_regular(p, MAX_SIDE_FILE).decode("utf-8"), files)
    except UnicodeDecodeError:
        raise ValueError(f"{p}: not UTF-8 text") from None
    except sshopts.SshOptionError as e:
        raise ValueError(f"{p}: {e}") from None
    key_files(files)
    return p


def key_files(files: list[str], base: Path | None = None) -> None:
    """The key and certificate files ssh options name: regular files of bounded size, each
    a path, not the key itself."""
    for f in files:
        controller_file(f, what="a key or certificate file", base=base)


def _ssh_args(v: Any) -> str:
    if not isinstance(v, str):
        raise ValueError(f"expected text, not {type(v).__name__}")
    files: list[str] = []
    try:
        for cfg in sshopts.check_args(v, files):
            _ssh_config(cfg)
    except sshopts.SshOptionError as e:
        raise ValueError(str(e)) from None
    key_files(files)
    return v


def _key_file(v: Any) -> Path:
    return controller_file(v, what="a private key file")


def _host_key_checking(v: Any) -> bool:
    try:
        on = boolean(v)
    except ValueError:
        on = False
    if not on:
        raise ValueError(f"{_show(v)} turns host key checking off; a fleet verifies host keys "
                         f"(give the hosts' keys as testbed_known_hosts)")
    return True


def _connection(v: Any) -> str:
    if str(v) not in ("ssh", "ansible.builtin.ssh", "smart"):
        raise ValueError(f"{_show(v)}: a fleet connects over ssh only (local, paramiko and the "
                         f"rest skip its checks or run on the controller)")
    return "ansible.builtin.ssh"


def _become_method(v: Any) -> str:
    m = str(v).removeprefix("ansible.builtin.")
    if m not in ("sudo", "su"):
        raise ValueError(f"{_show(v)}: expected sudo or su")
    return f"ansible.builtin.{m}"


def _one_of(*values: str) -> Callable[[Any], str]:
    def check(v: Any) -> str:
        if str(v) not in values:
            raise ValueError(f"expected one of {', '.join(values)}, not {_show(v)}")
        return str(v)
    return check


def _printable(limit: int = 128) -> Callable[[Any], str]:
    return lambda v: _text(v, limit=limit)


def _machine_id(v: Any) -> str:
    t = _text(v, limit=128)
    if t and not _MACHINE_ID.match(t):
        raise ValueError("may hold letters, digits and . _ : - only")
    return t


def _packages(v: Any) -> list[str]:
    if not isinstance(v, list) or len(v) > 500:
        raise ValueError("expected a list of Debian package names")
    for p in v:
        if not isinstance(p, str) or not _DEB.fullmatch(p):
            raise ValueError(f"{_show(p)} is not a Debian package name")
    return list(v)


def _pip_args(v: Any) -> list[str]:
    if not isinstance(v, list) or len(v) > 32:
        raise ValueError("expected a list of at most 32 pip arguments")
    return [_text(a, limit=1024) for a in v]


def _deps_site(v: Any) -> str:
    return "" if v in ("", None) else target_path(v)


def _overrides(v: Any) -> dict:
    if v is None:
        return {}
    if not isinstance(v, dict):
        raise ValueError(f"must be a mapping, found {type(v).__name__}")
    return v


def _ipv4(v: Any) -> str:
    t = _text(v, limit=64)
    try:
        a = ipaddress.IPv4Address(t)
    except ValueError:
        raise ValueError(f"{t[:60]!r} is not an IPv4 address") from None
    if a.is_loopback or a.is_unspecified or a.is_multicast or a.is_link_local:
        raise ValueError(f"{t} is not an address another host can reach")
    return t


def _ifname(v: Any) -> str:
    t = _text(v, limit=64)
    if not _IFNAME.match(t):
        raise ValueError(f"{t[:60]!r} is not an interface name")
    return t


#: the Ansible connection variables a fleet host may set, each checked
ANSIBLE_VARS: dict[str, Callable[[Any], Any]] = {
    "ansible_host": address, "ansible_ssh_host": address,
    "ansible_port": integer(1, 65535), "ansible_ssh_port": integer(1, 65535),
    "ansible_user": user, "ansible_ssh_user": user, "ansible_become_user": user,
    "ansible_password": _secret, "ansible_ssh_pass": _secret, "ansible_ssh_password": _secret,
    "ansible_become_password": _secret, "ansible_become_pass": _secret,
    "ansible_private_key_passphrase": _secret, "ansible_ssh_private_key_passphrase": _secret,
    "ansible_private_key_file": _key_file, "ansible_ssh_private_key_file": _key_file,
    "ansible_ssh_common_args": _ssh_args, "ansible_ssh_extra_args": _ssh_args,
    "ansible_host_key_checking": _host_key_checking, "ansible_ssh_host_key_checking": _host_key_checking,
    "ansible_connection": _connection,
    "ansible_python_interpreter": _python,
    "ansible_become": boolean, "ansible_become_method": _become_method,
    "ansible_pipelining": boolean, "ansible_ssh_pipelining": boolean,
    "ansible_timeout": integer(1, 3600), "ansible_ssh_timeout": integer(1, 3600),
    "ansible_ssh_retries": integer(0, 10),
    "ansible_ssh_transfer_method": _one_of("smart", "sftp", "scp", "piped"),
    "ansible_sftp_batch_mode": boolean, "ansible_ssh_use_tty": boolean,
}
#: why some refused ansible_* variables are refused, in words
ANSIBLE_REFUSED = {
    "ansible_ssh_args": "replaces the fleet's own ssh options (StrictHostKeyChecking=yes among them); "
                        "give options in ansible_ssh_common_args or testbed_ssh_config",
    "ansible_private_key": "holds the key itself: give the key's file as ansible_ssh_private_key_file",
    "ansible_ssh_private_key": "holds the key itself: give the key's file as ansible_ssh_private_key_file",
    "ansible_ssh_executable": "runs another program than ssh on the controller",
    "ansible_scp_executable": "runs another program than scp on the controller",
    "ansible_sftp_executable": "runs another program than sftp on the controller",
    "ansible_ssh_pkcs11_provider": "loads a library into ssh on the controller",
    "ansible_scp_extra_args": "gives scp options the fleet does not check",
    "ansible_sftp_extra_args": "gives sftp options the fleet does not check",
    "ansible_control_path": "points ssh at another connection's socket",
    "ansible_control_path_dir": "points ssh at another connection's socket",
}
#: the role's variables and the fleet's own, each checked
TESTBED_VARS: dict[str, Callable[[Any], Any]] = {
    "testbed_home": target_path, "testbed_venv": target_path, "testbed_python": _python,
    "testbed_cache": target_path, "testbed_image_packages": _packages,
    "testbed_authorized_keys": target_path,
    "testbed_host_packages": boolean, "testbed_packages": _packages, "testbed_host_setup": boolean,
    "testbed_deps_site": _deps_site, "testbed_pip_args": _pip_args,
    "testbed_host_class": _printable(128), "testbed_machine_id": _machine_id,
    "testbed_topology_overrides": _overrides, "testbed_shared_host": boolean,
    "testbed_run_timeout": integer(60, 7 * 86400), "testbed_lock_wait": integer(0, 86400),
    "testbed_known_hosts": _known_hosts, "testbed_ssh_config": _ssh_config,
    "testbed_peer": lambda v: _text(v, limit=128), "testbed_data_address": _ipv4,
    "testbed_data_interface": _ifname, "testbed_ship_image": boolean,
}
#: set by the fleet for each run: an inventory may not
FLEET_SET = ("testbed_wheel", "testbed_version", "testbed_topology", "testbed_fleet_id", "testbed_attempt",
             "testbed_controller_dir", "testbed_fleet_dir", "testbed_folder", "testbed_image",
             "testbed_pair", "testbed_run_env", "testbed_run_topology", "testbed_runs")


@dataclass(frozen=True)
class Checked:
    """A host's variables as checked: what the run is given (``run_vars``, plain values only),
    and the controller files it named."""

    run_vars: dict[str, Any]
    known_hosts: Path | None = None
    ssh_config: Path | None = None
    secrets: tuple[str, ...] = field(default_factory=tuple)


def find_template(v: Any, where: str = "") -> str | None:
    """Where in ``v`` a Jinja2 template starts (a dict key or a value), or None."""
    stack = [(v, where)]
    while stack:
        x, w = stack.pop()
        if isinstance(x, str) and _TEMPLATE.search(x):
            return w
        if isinstance(x, dict):
            for k, y in x.items():
                if isinstance(k, str) and _TEMPLATE.search(k):
                    return f"{w}.{k[:30]}"
                stack.append((y, f"{w}.{k}" if w else str(k)))
        elif isinstance(x, list):
            stack.extend((y, f"{w}[{i}]") for i, y in enumerate(x))
    return None


def check_host(name: str, hv: dict[str, Any]) -> Checked:
    """One host's merged variables. Raises VarError naming the variable."""
    run: dict[str, Any] = {}
    known = cfg = None
    secrets: list[str] = []
    for var in sorted(hv):
        value = hv[var]
        low = var.lower()
        if not low.startswith(("ansible_", "testbed_")):
            continue        # not the role's, never passed on
        if isinstance(value, dict) and "__unreadable__" in value and not SECRET.search(var):
            raise VarError(var, "cannot be read (a vault-encrypted value? the fleet takes none)")
        if (where := find_template(value, var)) is not None:
            raise VarError(where, "is a Jinja2 template: Ansible would render it on the controller "
                                  "(a lookup runs commands there); the fleet takes plain values")
        if low in ANSIBLE_REFUSED:
            raise VarError(var, ANSIBLE_REFUSED[low])
        if low in FLEET_SET:
            raise VarError(var, "is set by the fleet for each run, not by an inventory")
        check = ANSIBLE_VARS.get(var) or TESTBED_VARS.get(var)
        if check is None:
            kind = "an Ansible connection variable" if low.startswith("ansible_") else "a testbed variable"
            raise VarError(var, f"is not {kind} a fleet allows (the allowed ones are listed in docs/fleet.md)")
        try:
            checked = check(value)
        except ValueError as e:
            raise VarError(var, str(e)) from None
        if var == "testbed_known_hosts":
            known = checked
        elif var == "testbed_ssh_config":
            cfg = checked
        elif isinstance(checked, Path):
            run[var] = str(checked)
        else:
            run[var] = checked
        if SECRET.search(var) and isinstance(value, (str, int)) and str(value):
            secrets.append(str(value))
    if "ansible_connection" not in run:
        run["ansible_connection"] = "ansible.builtin.ssh"
    return Checked(run, known, cfg, tuple(secrets))
