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


class _Lazy:
    def __init__(self, name: str, on_import=None) -> None:
        self._name = name
        self._module: ModuleType | None = None
        self._on_import = on_import

    def __getattr__(self, attr: str) -> Any:
        if self._module is None:
            module = importlib.import_module(self._name)
            if self._on_import:
                self._on_import(module)
            self._module = module
        return getattr(self._module, attr)


def _quiet(module: ModuleType) -> None:
    # libvirt prints every error to stderr by default; the testbed raises them as exceptions.
    module.registerErrorHandler(lambda _ctx, _err: None, None)


libvirt: Any = _Lazy("libvirt", _quiet)
libvirt_qemu: Any = _Lazy("libvirt_qemu", lambda _m: _quiet(importlib.import_module("libvirt")))
