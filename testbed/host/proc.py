"""The only subprocess wrapper in the project.

Every command is a list argv with a timeout; never ``shell=True``. A failure raises
CommandError carrying argv, exit status, stderr tail and whether it timed out, so an
error message always says what was run and what it printed.
"""
from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from testbed.errors import CommandError

log = logging.getLogger(__name__)

DEFAULT_TIMEOUT = 60.0


@dataclass(frozen=True)
class Completed:
    argv: tuple[str, ...]
    rc: int
    stdout: str
    stderr: str
    seconds: float
    #: for a waiter that polls (a guest's agent): the monotonic time its last look that found
    #: the process still running was sent, so the process ended between then and the wait's
    #: return; None: the waiter saw the end itself (a child of this process)
    running_at: float | None = None


class Stop(threading.Event):
    """Set, with ``why``, to stop waiting for a command whose result no longer matters (the
    host guard saw its path break); the executors' ``wait`` kill it and raise StoppedError."""

    def __init__(self) -> None:
        super().__init__()
        self.why = ""

    def stop(self, why: str) -> None:
        if not self.is_set():
            self.why = why
            self.set()


def running(pid: int) -> bool:
    """Whether process ``pid`` runs: it exists and is not a zombie (a zombie has exited;
    only its parent can reap it)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def in_netns(netns: str | None, argv: Sequence[str], cpus: Sequence[int] = ()) -> list[str]:
    """Prefix argv so it runs inside a named network namespace (None: the current one) and,
    with ``cpus``, on those CPUs only. taskset comes first: the process has its CPUs before
    `ip netns exec` enters the namespace, so nothing in the namespace ever runs a moment
    with the launcher's CPUs, and every child it forks (netserver's per-test children)
    inherits them."""
    out = ["ip", "netns", "exec", netns, *argv] if netns else list(argv)
    if cpus:
        return ["taskset", "--cpu-list", ",".join(str(c) for c in sorted(cpus)), *out]
    return out


def run(argv: Sequence[str], *, timeout: float = DEFAULT_TIMEOUT, check: bool = True,
        netns: str | None = None, input: str | None = None,
        env: Mapping[str, str] | None = None, cwd: str | None = None, cpus: Sequence[int] = ()) -> Completed:
    full = in_netns(netns, [str(a) for a in argv], cpus)
    log.debug("run %s", full)
    start = time.monotonic()
    merged_env = {**os.environ, **env} if env else None
    try:
        p = subprocess.run(full, capture_output=True, text=True, errors="replace", timeout=timeout,
                           input=input, env=merged_env, cwd=cwd, stdin=None if input is not None
                           else subprocess.DEVNULL)
    except subprocess.TimeoutExpired as e:
        out = e.stdout.decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or "")
        err = e.stderr.decode(errors="replace") if isinstance(e.stderr, bytes) else (e.stderr or "")
        raise CommandError(full, None, err, timed_out=True, stdout=out) from None
    except FileNotFoundError as e:
        raise CommandError(full, 127, f"{e.filename}: not found") from None
    except PermissionError as e:     # like a shell: 126, found but not executable by this user
        raise CommandError(full, 126, f"{e.filename}: permission denied") from None
    done = Completed(tuple(full), p.returncode, p.stdout, p.stderr, time.monotonic() - start)
    if check and p.returncode != 0:
        raise CommandError(full, p.returncode, p.stderr or p.stdout, stdout=p.stdout)
    return done


def ok(argv: Sequence[str], *, timeout: float = 10.0, netns: str | None = None) -> bool:
    """True when the command exits 0: for probing capabilities by trying them."""
    try:
        return run(argv, timeout=timeout, check=False, netns=netns).rc == 0
    except CommandError:
        return False


@dataclass
class Background:
    """A long-running process started by ``background``; output goes to files so pipes never fill."""

    argv: tuple[str, ...]
    popen: subprocess.Popen
    stdout_path: str
    stderr_path: str

    def wait(self, timeout: float) -> int:
        try:
            return self.popen.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            raise CommandError(self.argv, None, self.stderr(), timed_out=True) from None

    def stdout(self) -> str:
        with open(self.stdout_path, errors="replace") as f:
            return f.read()

    def stderr(self) -> str:
        with open(self.stderr_path, errors="replace") as f:
            return f.read()

    def stop(self, grace: float = 3.0) -> None:
        if self.popen.poll() is not None:
            return
        # The process leads its own group, so children (e.g. `ip netns exec` -> tool) go too.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.popen.pid, signal.SIGTERM)
        try:
            self.popen.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.popen.pid, signal.SIGKILL)
            self.popen.wait(timeout=grace)


def start(argv: Sequence[str], *, out_dir: str, name: str, netns: str | None = None,
          env: Mapping[str, str] | None = None, cpus: Sequence[int] = ()) -> Background:
    """Start a long-running process; the caller must `stop()` it (see `background`)."""
    full = in_netns(netns, [str(a) for a in argv], cpus)
    os.makedirs(out_dir, exist_ok=True)
    out_path, err_path = os.path.join(out_dir, f"{name}.out"), os.path.join(out_dir, f"{name}.err")
    log.debug("background %s", full)
    with open(out_path, "w") as out, open(err_path, "w") as err:
        try:
            popen = subprocess.Popen(full, stdout=out, stderr=err, stdin=subprocess.DEVNULL,
                                     start_new_session=True,
                                     env={**os.environ, **env} if env else None)
        except FileNotFoundError as e:
            raise CommandError(full, 127, f"{e.filename}: not found") from None
        except PermissionError as e:
            raise CommandError(full, 126, f"{e.filename}: permission denied") from None
    return Background(tuple(full), popen, out_path, err_path)


@contextlib.contextmanager
def background(argv: Sequence[str], *, out_dir: str, name: str, netns: str | None = None,
               env: Mapping[str, str] | None = None) -> Iterator[Background]:
    """Start a process for the duration of a ``with`` block; it is always stopped on exit."""
    bg = start(argv, out_dir=out_dir, name=name, netns=netns, env=env)
    try:
        yield bg
    finally:
        bg.stop()
