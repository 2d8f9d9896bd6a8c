"""tracefs, which bpftrace reads tracepoints' formats from: mounted for as long as a tracer
needs it, and unmounted again by the last testbed process that used it, only if one of them
mounted it (a host that had it mounted keeps it so; testbed.host.shareduse)."""
from __future__ import annotations

import contextlib
from collections.abc import Iterator

from testbed.errors import CommandError
from testbed.host import proc, shareduse

TRACEFS = "/sys/kernel/tracing"


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


#: tracefs mounted in one of the testbed's own guests (its image's systemd does not mount it
#: at boot), left mounted: the guest is thrown away or restored from its snapshot after the run
GUEST_MOUNT = ["/bin/sh", "-c", f"grep -qs ' {TRACEFS} tracefs ' /proc/mounts || "
               f"mount -t tracefs nodev {TRACEFS}"]


def _mount() -> None:
    proc.run(["mount", "-t", "tracefs", "nodev", TRACEFS], timeout=10)


def _unmount() -> None:
    with contextlib.suppress(CommandError):
        proc.run(["umount", TRACEFS], timeout=10)


@contextlib.contextmanager
def available() -> Iterator[str | None]:
    """tracefs mounted for the block; yields None, or why it could not be."""
    with contextlib.ExitStack() as stack:
        try:
            stack.enter_context(shareduse.held("tracefs", mounted, _mount, _unmount))
        except CommandError as e:
            yield f"tracefs is not mounted and could not be: {e.stderr_tail or e}"
            return
        yield None


__all__ = ["TRACEFS", "available", "mounted"]
