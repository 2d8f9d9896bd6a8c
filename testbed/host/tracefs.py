"""tracefs, which bpftrace reads tracepoints' formats from: mounted for as long as a tracer
needs it, and unmounted again only if this process mounted it (a host that had it mounted
keeps it so)."""
from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

from testbed.errors import CommandError
from testbed.host import proc

TRACEFS = "/sys/kernel/tracing"
_lock = threading.Lock()
_users = 0
_mounted_here = False


def mounted(mounts: str | None = None) -> bool:
    """Whether a tracefs is mounted where bpftrace looks (``mounts``: /proc/mounts' text)."""
    if mounts is None:
        with open("/proc/mounts") as f:
            mounts = f.read()
    for line in mounts.splitlines():
        parts = line.split()
        if len(parts) > 2 and parts[2] == "tracefs" and parts[1] in (TRACEFS, "/sys/kernel/debug/tracing"):
            return True
    return False


@contextlib.contextmanager
def available() -> Iterator[str | None]:
    """tracefs mounted for the block; yields None, or why it could not be."""
    global _users, _mounted_here
    with _lock:
        why = None
        if _users == 0 and not mounted():
            try:
                proc.run(["mount", "-t", "tracefs", "nodev", TRACEFS], timeout=10)
                _mounted_here = True
            except CommandError as e:
                why = f"tracefs is not mounted and could not be: {e.stderr_tail or e}"
        if why is None:
            _users += 1
    try:
        yield why
    finally:
        if why is None:
            with _lock:
                _users -= 1
                if _users == 0 and _mounted_here:
                    with contextlib.suppress(CommandError):
                        proc.run(["umount", TRACEFS], timeout=10)
                    _mounted_here = False


__all__ = ["TRACEFS", "available", "mounted"]
