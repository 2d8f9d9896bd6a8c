"""Ansible's own readers, run in a process of their own by testbed.fleet.inventory:
the inventory (InventoryManager, with its group_vars and host_vars, as `ansible-inventory
--list` reads them) and every Ansible setting the user's environment changed (ansible.cfg,
ANSIBLE_* variables), with where each came from.

Run as ``python -I ansread.py REQUEST`` (REQUEST: JSON with ``inventory`` and ``limit``);
prints one JSON document. It imports Ansible only, never the testbed. Its own limits (memory,
CPU seconds, hosts, bytes of output) turn an inventory built to exhaust the controller into
one refusal; the caller adds a wall-clock timeout.
"""
from __future__ import annotations

import json
import resource
import sys

#: memory and CPU this reader may take: an inventory is a few MB at most
MEMORY_BYTES = 2 << 30
CPU_SECONDS = 60
MAX_HOSTS = 5000
#: JSON bytes of one host's merged variables, and of all of them
MAX_HOST_BYTES = 1 << 20
MAX_TOTAL_BYTES = 64 << 20
#: settings the caller sets for this reader and for the run: not the user's
OURS = {"INVENTORY_ENABLED", "INVENTORY_UNPARSED_FAILED", "INVENTORY_ANY_UNPARSED_IS_FAILED",
        "ANSIBLE_NOCOLOR", "ANSIBLE_FORCE_COLOR", "LOCALHOST_WARNING", "INVENTORY_UNPARSED_WARNING",
        "CONFIG_FILE", "DEPRECATION_WARNINGS", "SYSTEM_WARNINGS"}


def plain(v, depth=0):
    """A value as JSON can carry it: Ansible's tagged strings become str; a value that
    cannot be shown (a vault-encrypted one without its password) is marked, never guessed."""
    if depth > 64:
        return {"__unreadable__": "nested too deeply"}
    if v is None or isinstance(v, (bool, int, float)):
        return v
    if isinstance(v, str):
        try:
            return str.__str__(v) if type(v) is not str else v
        except Exception as e:          # an encrypted value whose password is not here
            return {"__unreadable__": type(e).__name__}
    if isinstance(v, dict):
        return {str(plain(k, depth + 1)): plain(x, depth + 1) for k, x in v.items()}
    if isinstance(v, (list, tuple, set, frozenset)):
        return [plain(x, depth + 1) for x in v]
    try:
        return {"__unreadable__": type(v).__name__, "text": str(v)[:200]}
    except Exception as e:
        return {"__unreadable__": type(e).__name__}


def _settings(out: list) -> None:
    from ansible import constants as C
    from ansible.plugins.loader import become_loader, connection_loader, init_plugin_loader
    init_plugin_loader()
    for name in C.config.get_configuration_definitions():
        value, origin = C.config.get_config_value_and_origin(name)
        if origin not in ("default", "") and name not in OURS:
            out.append(["", name, str(origin), plain(value)])
    # the plugins a fleet runs with: ssh, and the become methods it allows (sudo, su)
    connection_loader.get("ssh", class_only=True)
    for kind, plugin in (("connection", "ssh"), ("become", "sudo"), ("become", "su")):
        if kind == "become":
            become_loader.get(plugin, class_only=True)
        for name in C.config.get_configuration_definitions(kind, plugin):
            value, origin = C.config.get_config_value_and_origin(name, plugin_type=kind, plugin_name=plugin)
            if origin not in ("default", ""):
                out.append([plugin, name, str(origin), plain(value)])


def fail(out: dict, why: str) -> None:
    """The reader's one refusal, with the settings read so far: a setting that broke the
    reader is named before the failure it caused."""
    print(json.dumps({"error": why, "settings": out["settings"]}))


def main() -> int:
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_BYTES, MEMORY_BYTES))
    resource.setrlimit(resource.RLIMIT_CPU, (CPU_SECONDS, CPU_SECONDS))
    req = json.loads(sys.argv[1])
    out: dict = {"settings": [], "hosts": []}
    try:
        _settings(out["settings"])
    except Exception as e:
        fail(out, f"Ansible's settings cannot be read: {type(e).__name__}: {e}")
        return 0
    try:
        from ansible import constants as C
        from ansible.inventory.manager import InventoryManager
        from ansible.parsing.dataloader import DataLoader
        from ansible.vars.manager import VariableManager
        loader = DataLoader()
        inv = InventoryManager(loader=loader, sources=[req["inventory"]])
        if req.get("limit"):
            inv.subset(req["limit"])
        hosts = inv.get_hosts()
        if len(hosts) > MAX_HOSTS:
            fail(out, f"holds {len(hosts)} hosts; a fleet takes at most {MAX_HOSTS}")
            return 0
        vm = VariableManager(loader=loader, inventory=inv)
        total = 0
        for h in hosts:
            # what `ansible-inventory --list` shows: every stage's vars, internals left out
            hv = vm.get_vars(host=h, include_hostvars=False, stage="all")
            for internal in C.INTERNAL_STATIC_VARS:
                hv.pop(internal, None)
            for magic in ("inventory_file", "inventory_dir", "ansible_facts", "ansible_config_file"):
                hv.pop(magic, None)
            text = json.dumps(plain(hv))
            if len(text) > MAX_HOST_BYTES:
                fail(out, f"host {h.name}'s variables take {len(text)} bytes; at most {MAX_HOST_BYTES} are read")
                return 0
            total += len(text)
            if total > MAX_TOTAL_BYTES:
                fail(out, f"its hosts' variables take more than {MAX_TOTAL_BYTES} bytes")
                return 0
            out["hosts"].append([plain(h.name), json.loads(text)])
    except MemoryError:
        fail(out, f"reading it took more than {MEMORY_BYTES >> 20} MiB")
        return 0
    except RecursionError:
        fail(out, "nested too deeply")
        return 0
    except Exception as e:
        msg = " ".join(str(e).split())
        fail(out, f"Ansible cannot read it: {type(e).__name__}: {msg[:400]}")
        return 0
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
