"""The controller's Ansible environment, checked like an inventory: the ansible.cfg files and
ANSIBLE_* variables a user has can switch host key checking off or swap ssh for something
else just as an inventory can.

Ansible itself says what the user changed and where (testbed.fleet.ansread: every setting
whose origin is not its default, with the file or variable it came from); this module refuses
what weakens a fleet's checks, naming that origin and the setting. The run then gets its own
settings on top (:func:`run_env`): host key checking on, the fleet's ssh options first, only
the YAML inventory plugin (the checked inventory the fleet writes), no retry files.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from testbed.fleet import hostvars, sshopts
from testbed.host import safeio

#: an ansible.cfg larger than this is refused unread
MAX_CFG_BYTES = 1 << 20

#: the ssh connection's own settings that name a program or library to run on the controller,
#: or another connection's sockets (as the host variables ansible_control_path* are refused)
_PROGRAMS = {"ssh_executable", "scp_executable", "sftp_executable", "pkcs11_provider", "control_path",
             "control_path_dir"}
#: settings (core, or of the become plugins) that run a program on the controller or on the
#: target in place of the usual one, or read a secret through a script: a vault or password
#: "file" that is executable is run
_RUNS = {"DEFAULT_BECOME_EXE", "DEFAULT_BECOME_FLAGS", "DEFAULT_EXECUTABLE", "SSH_AGENT_EXECUTABLE",
         "DEFAULT_VAULT_PASSWORD_FILE", "DEFAULT_VAULT_IDENTITY_LIST", "CONNECTION_PASSWORD_FILE",
         "BECOME_PASSWORD_FILE", "PERSISTENT_CONTROL_PATH_DIR", "NETCONF_SSH_CONFIG",
         "become_exe", "become_flags"}
_ARGS = {"ssh_args", "ssh_common_args", "ssh_extra_args", "scp_extra_args", "sftp_extra_args"}
#: settings that load code from the user's folders into the run (besides every *_PLUGIN_PATH)
_PLUGIN_CODE = {"DEFAULT_MODULE_PATH", "DEFAULT_MODULE_UTILS_PATH", "CALLBACKS_ENABLED",
                "ANSIBLE_CONNECTION_PATH", "_ANSIBLE_CONNECTION_PATH", "PLUGIN_FILTERS_CFG",
                "COLLECTIONS_PATHS", "DEFAULT_JINJA2_EXTENSIONS", "_ANSIBALLZ_COVERAGE_CONFIG",
                "_ANSIBALLZ_DEBUGPY_CONFIG", "_ANSIBALLZ_PYDEVD_CONFIG"}
#: settings that name a plugin: Ansible's own ones only (a collection's is code from a folder
#: the fleet does not check; the debug strategy stops for a person at the keyboard)
_BUILTIN_PLUGINS = {"DEFAULT_STRATEGY": ("linear", "free", "host_pinned"),
                    "DEFAULT_STDOUT_CALLBACK": ("default", "minimal", "oneline", "tree", "junit"),
                    "CACHE_PLUGIN": ("memory", "jsonfile")}


def reader_env() -> dict[str, str]:
    """What Ansible's readers run with: only the INI and YAML inventory plugins (never a
    script: an executable inventory is not run on the controller), and an inventory part
    Ansible cannot parse is an error, not a warning."""
    return {"ANSIBLE_INVENTORY_ENABLED": "ini,yaml", "ANSIBLE_INVENTORY_UNPARSED_FAILED": "True",
            "ANSIBLE_INVENTORY_ANY_UNPARSED_IS_FAILED": "True", "ANSIBLE_NOCOLOR": "1",
            "ANSIBLE_LOCALHOST_WARNING": "False", "ANSIBLE_INVENTORY_UNPARSED_WARNING": "False",
            "ANSIBLE_DEPRECATION_WARNINGS": "False", "ANSIBLE_SYSTEM_WARNINGS": "False"}


def check_config_files() -> None:
    """The ansible.cfg files Ansible would read (ANSIBLE_CONFIG, ~/.ansible.cfg,
    /etc/ansible/ansible.cfg) are regular files of bounded size: a FIFO there would hang it."""
    named = os.environ.get("ANSIBLE_CONFIG")
    if named is not None:
        if not named.strip() or "\0" in named:
            raise safeio.UserFileError("ANSIBLE_CONFIG", "set but empty or not a file name")
        p = Path(os.path.expanduser(named))
        if p.is_dir():
            p = p / "ansible.cfg"
        safeio.check_regular(p, MAX_CFG_BYTES, f"ANSIBLE_CONFIG {named}")
    for cand in (Path(os.path.expanduser("~/.ansible.cfg")), Path("/etc/ansible/ansible.cfg")):
        if os.path.lexists(cand):
            safeio.check_regular(cand, MAX_CFG_BYTES, str(cand))


def _where(origin: str) -> str:
    return origin.removeprefix("env: ").strip() or "(Ansible settings)"


def check_settings(settings: list[list[Any]]) -> dict[str, str]:
    """Refuse settings that weaken the fleet's checks. Returns the ssh connection's argument
    settings the user gave (``ssh_common_args``...), checked, for the run to keep."""
    kept: dict[str, str] = {}
    for plugin, name, origin, value in settings:
        where = _where(origin)

        def refuse(why: str) -> None:
            raise safeio.UserFileError(where, f"{name}: {why}")
        if name in _RUNS and value:
            refuse("runs a program (or a script for a secret) the fleet does not check; a fleet "
                   "uses key logins, Ansible's own become and no vault")
        if plugin in ("sudo", "su"):
            if name == "become_user" and value:
                _checked(refuse, lambda: hostvars.user(value))
            continue
        if plugin == "":
            if name == "HOST_KEY_CHECKING" and not _on(value):
                refuse("turns host key checking off; a fleet verifies host keys")
            elif name == "DEFAULT_TRANSPORT" and str(value) not in ("ssh", "smart", "ansible.builtin.ssh"):
                refuse(f"{str(value)[:40]!r}: a fleet connects over ssh only")
            elif name in ("VARIABLE_PLUGINS_ENABLED", "DEFAULT_VARS_PLUGIN_PATH"):
                refuse("adds variables from plugins the fleet does not check")
            elif name in _BUILTIN_PLUGINS and str(value).removeprefix("ansible.builtin.") not in _BUILTIN_PLUGINS[name]:
                refuse(f"{str(value)[:40]!r}: a fleet runs Ansible's own "
                       f"({', '.join(_BUILTIN_PLUGINS[name])})")
            elif name == "INTERPRETER_PYTHON" and value:
                _checked(refuse, lambda: hostvars.ANSIBLE_VARS["ansible_python_interpreter"](value))
            elif name == "INTERPRETER_PYTHON_FALLBACK" and value:
                _checked(refuse, lambda: [hostvars.ANSIBLE_VARS["ansible_python_interpreter"](v)
                                          for v in (value if isinstance(value, list) else [value])])
            elif name == "DEFAULT_BECOME_METHOD" and value:
                _checked(refuse, lambda: hostvars.ANSIBLE_VARS["ansible_become_method"](value))
            elif name == "DEFAULT_BECOME_USER" and value:
                _checked(refuse, lambda: hostvars.user(value))
            elif name in _PLUGIN_CODE or name.endswith("_PLUGIN_PATH"):
                refuse("loads plugins from a folder the fleet does not check (code that runs on the "
                       "controller, or a connection in place of ssh); a fleet runs Ansible's own")
            elif name == "DEFAULT_PRIVATE_KEY_FILE" and value:
                _checked(refuse, lambda: hostvars.controller_file(str(value), what="a private key file"))
            elif name == "DEFAULT_REMOTE_USER" and value:
                _checked(refuse, lambda: hostvars.user(value))
            elif name == "DEFAULT_REMOTE_PORT" and value:
                _checked(refuse, lambda: hostvars.integer(1, 65535)(value))
            continue
        if name == "host_key_checking" and not _on(value):
            refuse("turns host key checking off; a fleet verifies host keys")
        elif name in _PROGRAMS and value:
            refuse("runs another program or library on the controller; a fleet runs ssh as it is")
        elif name in _ARGS and value:
            if not isinstance(value, str):
                refuse("expected text")
            files: list[str] = []
            try:
                for cfg in sshopts.check_args(value, files):
                    hostvars.controller_file(cfg, what="an ssh_config file")
                    sshopts.check_config(safeio.read_regular(Path(os.path.expanduser(cfg)),
                                                             hostvars.MAX_SIDE_FILE).decode("utf-8", "replace"), files)
                hostvars.key_files(files)
            except (sshopts.SshOptionError, ValueError, safeio.UserFileError) as e:
                refuse(str(e))
            kept[name] = value
        elif name == "private_key_file" and value:
            _checked(refuse, lambda: hostvars.controller_file(str(value), what="a private key file"))
        elif name == "remote_user" and value:
            _checked(refuse, lambda: hostvars.user(value))
    return kept


def _checked(refuse, check) -> None:
    try:
        check()
    except ValueError as e:
        refuse(str(e))


def _on(value: Any) -> bool:
    try:
        return hostvars.boolean(value)
    except ValueError:
        return False


def run_env(ssh_args: str, roles: Path, local_temp: Path) -> dict[str, str]:
    """The run's Ansible settings, on top of the user's (which were checked): they win over
    any ansible.cfg or ANSIBLE_* the user has."""
    return {**reader_env(), "ANSIBLE_INVENTORY_ENABLED": "yaml",
            "ANSIBLE_HOST_KEY_CHECKING": "True", "ANSIBLE_SSH_ARGS": ssh_args,
            "ANSIBLE_RETRY_FILES_ENABLED": "False",
            # a module runs through the ssh session's stdin instead of being copied over
            # first: a fleet of three took 65 s and 81 CPU-s, now 51 s and 64 CPU-s. A
            # sudoers with `requiretty` needs ANSIBLE_PIPELINING=False.
            "ANSIBLE_PIPELINING": os.environ.get("ANSIBLE_PIPELINING", "True"),
            "ANSIBLE_ROLES_PATH": str(roles), "ANSIBLE_LOCAL_TEMP": str(local_temp)}
