"""The environment fingerprint every run records: enough to tell whether two runs may be compared."""
from __future__ import annotations

import os
import platform
import socket
from pathlib import Path
from typing import Any

import psutil

from testbed import __version__, capabilities, proc
from testbed.errors import CommandError
from testbed.model import Accelerator


def cpu_model() -> tuple[str, float | None]:
    model = "unknown"
    mhz: float | None = None
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name") and model == "unknown":
                model = line.split(":", 1)[1].strip()
            elif line.startswith("cpu MHz") and mhz is None:
                mhz = float(line.split(":", 1)[1])
    except OSError:
        pass
    freq = psutil.cpu_freq()
    if freq and freq.max:
        mhz = freq.max
    return model, mhz


def git_commit() -> str | None:
    try:
        return proc.run(["git", "-C", str(Path(__file__).parent), "rev-parse", "HEAD"],
                        timeout=5).stdout.strip() or None
    except CommandError:
        return None


def fingerprint(accel: Accelerator | None, *, image: Any = None, extra: dict | None = None) -> dict:
    """None for accel: a run of namespace endpoints only, where no guest runs."""
    model, mhz = cpu_model()
    return {
        "host": socket.gethostname(),
        "kernel": platform.release(),
        "accelerator": accel.value if accel else "none",
        # TCG figures are functional checks: they must never be compared with KVM ones.
        "comparable_class": {Accelerator.KVM: "kvm", Accelerator.TCG: "tcg-functional-only",
                             None: "host-namespaces"}[accel],
        "cpu_model": model,
        "cpu_mhz": mhz,
        "cpus": os.cpu_count(),
        "memory_bytes": psutil.virtual_memory().total,
        "versions": capabilities.tool_versions(),
        "vhost_net": capabilities.vhost_net()[0],
        "image": None if image is None else {"name": image.name, "digest": image.digest,
                                             "kernel": image.kernel_version},
        "testbed": __version__,
        "testbed_commit": git_commit(),
        **(extra or {}),
    }
