"""libvirt-python, imported on first use.

Modules that drive libvirt (virt, guest, guestcache, cleanup) are imported by the CLI and the
runner, which the unit tier imports to validate topologies and render XML. Importing
libvirt-python only when a libvirt call is made lets `pytest suites/unit`, `testbed validate`
and the result commands run where libvirt-python is not installed; a call that needs it then
fails with the ImportError that names it.
"""
from __future__ import annotations

import importlib
from types import ModuleType
from typing import Any

from testbed.lazy import Lazy


def _quiet(module: ModuleType) -> None:
    # libvirt prints every error to stderr by default; the testbed raises them as exceptions.
    module.registerErrorHandler(lambda _ctx, _err: None, None)


libvirt: Any = Lazy("libvirt", _quiet)
libvirt_qemu: Any = Lazy("libvirt_qemu", lambda _m: _quiet(importlib.import_module("libvirt")))
