"""Modules imported on first use.

Heavy libraries (libvirt-python, scipy) are imported by modules the CLI and the unit tier
import for light work too: reading a topology, refusing a bad argument, rendering XML. A
``Lazy`` stands in for the module until an attribute is asked for, so such work neither
waits for the import (scipy takes ~0.5 s) nor needs the library installed; a call that
needs it then fails with the ImportError that names it.
"""
from __future__ import annotations

import importlib
from collections.abc import Callable
from types import ModuleType
from typing import Any


class Lazy:
    def __init__(self, name: str, on_import: Callable[[ModuleType], None] | None = None) -> None:
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


#: libvirt-python, imported on first use (so a unit test, `testbed validate` and the result
#: commands run where it is not installed); testbed.guests.lazy re-exports it
libvirt: Any = Lazy("libvirt", _quiet)
libvirt_qemu: Any = Lazy("libvirt_qemu", lambda _m: _quiet(importlib.import_module("libvirt")))
