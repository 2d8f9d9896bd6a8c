"""A host-wide thing that several processes may use at once (tracefs mounted where bpftrace
looks, sshd's privilege separation folder): made by the first that needs it, when the host
has none, and removed by the last one out, only if one of them made it.

Each user holds a shared flock on ``<state>/<name>.users`` for as long as it uses the
thing; a mutex (``<name>.lock``) makes the "make it" and "last one out" decisions one at a
time; ``<name>.made`` says that a user made it, so a thing the host had stays. Locks are
per open file: two users in one process count as two, and a user that dies releases its
lock with its files, so the next last one out still removes what was made (a counter in
one process could not see another's use: one process unmounted tracefs under another's
tracer starting).
"""
from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Callable, Iterator
from pathlib import Path

from testbed.host import paths


def holders(p: Path) -> set[int] | None:
    """The processes holding a flock on ``p``, from /proc/locks (read without taking the
    lock, which would make a user out of the reader); None when that cannot be read."""
    try:
        ino = os.stat(p).st_ino
        text = Path("/proc/locks").read_text()
    except FileNotFoundError:
        return set()
    except OSError:
        return None
    pids = set()
    for line in text.splitlines():
        f = line.split()
        # "1: FLOCK ADVISORY WRITE 1234 08:01:5678 0 EOF"; a blocked waiter's line has "->" first
        if len(f) >= 6 and f[1] == "FLOCK" and f[5].rsplit(":", 1)[-1] == str(ino) and f[4].isdigit():
            pids.add(int(f[4]))
    return pids


def left(name: str) -> bool:
    """Whether ``name`` was made by a user and no user holds it any more: a leftover (its
    last user died between its block and the removal)."""
    d = paths.state_dir()
    return (d / f"{name}.made").exists() and not holders(d / f"{name}.users")


@contextlib.contextmanager
def held(name: str, present: Callable[[], bool], make: Callable[[], None],
         remove: Callable[[], None]) -> Iterator[None]:
    """The thing ``name`` there for the block: ``make()`` when not ``present()`` (an error
    from it propagates, nothing held), ``remove()`` after the last user's block when a user
    made it."""
    d = paths.state_dir()
    d.mkdir(parents=True, exist_ok=True)
    made = d / f"{name}.made"
    mutex = os.open(d / f"{name}.lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        users = os.open(d / f"{name}.users", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(mutex, fcntl.LOCK_EX)
            try:
                if not present():
                    make()
                    made.touch()
                fcntl.flock(users, fcntl.LOCK_SH)
            finally:
                fcntl.flock(mutex, fcntl.LOCK_UN)
            try:
                yield
            finally:
                fcntl.flock(mutex, fcntl.LOCK_EX)
                fcntl.flock(users, fcntl.LOCK_UN)
                try:
                    fcntl.flock(users, fcntl.LOCK_EX | fcntl.LOCK_NB)     # no other user left
                except BlockingIOError:
                    pass
                else:
                    if made.exists():
                        remove()
                        made.unlink()
                fcntl.flock(mutex, fcntl.LOCK_UN)
        finally:
            os.close(users)
    finally:
        os.close(mutex)


__all__ = ["held", "holders", "left"]
