"""libvirt-python, imported on first use.

Modules that drive libvirt (virt, guest, guestcache, cleanup) are imported by the CLI and the
runner, which the unit tier imports to validate topologies and render XML. Importing
libvirt-python only when a libvirt call is made lets `pytest suites/unit`, `testbed validate`
and the result commands run where libvirt-python is not installed; a call that needs it then
fails with the ImportError that names it.
"""
from __future__ import annotations

from testbed.lazy import libvirt, libvirt_qemu

__all__ = ["libvirt", "libvirt_qemu"]
