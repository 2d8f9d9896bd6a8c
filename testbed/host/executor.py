"""Where a command runs: one protocol for this machine, a network namespace on it, a real
host over ssh and a guest through its agent.

Everything that runs a command or touches a file somewhere takes an ``Executor``; host
networking (testbed.host.net.ops) then needs one implementation per operation, not one per
place. The four implementations:

* ``Local``: this machine, through proc (the one subprocess wrapper);
* ``Netns``: a named network namespace on this machine (``ip netns exec``). Files under
  /proc/sys/net and /sys/class/net are read and written through the namespace's own view
  (they differ per namespace); everything else is the host's, read directly;
* ``remote.Shell``: a real host over ssh (or this machine when the host is local);
* ``guest.Agent``: a guest through qemu-guest-agent. ``nsagent.NsAgent`` is a ``Netns``
  that measurement code uses in place of a guest's agent.

Results are ``proc.Completed`` everywhere (``guest.GuestResult`` is the same type).
"""
from __future__ import annotations

import ctypes
import itertools
import os
import shutil
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from typing import Protocol, TypeVar, runtime_checkable

from testbed.errors import CommandError, StoppedError
from testbed.host import proc

#: Paths whose content depends on the network namespace that reads them.
_PER_NETNS = ("/proc/sys/net/", "/sys/class/net/", "/proc/net/")
#: Of those, the ones a thread that joined the namespace sees as the namespace's own
#: (sysctl files follow the opening task's namespace; sysfs follows its mount's).
_THREAD_VIEW = ("/proc/sys/net/",)

CLONE_NEWNET = 0x40000000
_libc = ctypes.CDLL(None, use_errno=True)
T = TypeVar("T")


def _check(rc: int, what: str) -> None:
    if rc != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def in_thread_netns(netns: str | None, fn: Callable[[], T], *, new: bool = False) -> T:
    """``fn()`` run by a short-lived thread that joined namespace ``netns`` (``new``: a fresh
    namespace unshared for it). A network namespace is per thread, so this process and its
    other threads stay where they are, and nothing forks: a forked copy of this process
    would inherit its signal handlers (the runner's turn SIGTERM into teardown) and could
    run on in the caller's stack."""
    out: dict[str, object] = {}

    def work() -> None:
        try:
            if new:
                _check(_libc.unshare(CLONE_NEWNET), "unshare(CLONE_NEWNET)")
            elif netns:
                fd = os.open(f"/run/netns/{netns}", os.O_RDONLY)
                try:
                    _check(_libc.setns(fd, CLONE_NEWNET), f"setns {netns}")
                finally:
                    os.close(fd)
            out["value"] = fn()
        except BaseException as e:     # handed to the caller's thread
            out["error"] = e

    t = threading.Thread(target=work, name=f"netns-{netns}")
    t.start()
    t.join()
    if "error" in out:
        raise out["error"]  # type: ignore[misc]
    return out["value"]  # type: ignore[return-value]


@runtime_checkable
class Executor(Protocol):
    """Run a command, read and write a file, and start, wait for and kill a process, in one
    place. ``run`` raises CommandError when ``check`` and the command fails, like proc.run."""

    name: str

    def run(self, argv: Sequence[str], *, timeout: float = 30,
            check: bool = True) -> proc.Completed: ...

    def read_file(self, path: str, limit: int = 1 << 20) -> str: ...

    def write_file(self, path: str, text: str) -> None: ...

    def spawn(self, argv: Sequence[str]) -> int: ...

    def wait(self, pid: int, argv: Sequence[str], timeout: float,
             expected_s: float = 0.0, stop: proc.Stop | None = None) -> proc.Completed: ...

    def kill(self, pid: int, signal: str = "KILL") -> None: ...


class _Processes:
    """spawn/wait/kill for executors whose processes are children of this one (local,
    namespace, and the local ssh client of a remote command)."""

    name: str

    def __init__(self, out_dir: str | None) -> None:
        self._out_dir = out_dir
        self._own_dir: str | None = None
        self._procs: dict[int, proc.Background] = {}
        self._seq = itertools.count()

    def _dir(self) -> str:
        if self._out_dir:
            return self._out_dir
        if self._own_dir is None:
            self._own_dir = tempfile.mkdtemp(prefix="tb-exec-")
        return self._own_dir

    def _argv(self, argv: Sequence[str]) -> list[str]:
        return [str(a) for a in argv]

    def _netns(self) -> str | None:
        return None

    def _cpus(self) -> tuple[int, ...]:
        return ()

    def spawn(self, argv: Sequence[str]) -> int:
        bg = proc.start(self._argv(argv), out_dir=self._dir(), name=f"{self.name}-{next(self._seq)}",
                        netns=self._netns(), cpus=self._cpus())
        self._procs[bg.popen.pid] = bg
        return bg.popen.pid

    def alive(self, pid: int) -> bool:
        bg = self._procs.get(pid)
        return bg is not None and bg.popen.poll() is None

    def _output(self, bg: proc.Background) -> tuple[str, str]:
        return bg.stdout(), bg.stderr()

    def wait(self, pid: int, argv: Sequence[str], timeout: float,
             expected_s: float = 0.0, stop: proc.Stop | None = None) -> proc.Completed:
        # expected_s only matters to the guest agent, which has to poll; a child is waited on
        # (in short steps when a stop may come: see guest.Agent.wait).
        bg = self._procs[pid]
        start = time.monotonic()
        deadline = start + timeout
        while True:
            if stop is not None and stop.is_set():
                self.kill(pid)
                raise StoppedError([f"{self.name}:", *argv], stop.why)
            left = deadline - time.monotonic()
            try:
                rc = bg.popen.wait(timeout=max(0.0, left if stop is None else min(left, 0.1)))
                break
            except subprocess.TimeoutExpired:
                if time.monotonic() < deadline:
                    continue
                self.kill(pid)
                raise CommandError([f"{self.name}:", *argv], None, "", timed_out=True) from None
        self._procs.pop(pid, None)
        out, err = self._output(bg)
        self._forget(bg)
        return proc.Completed(tuple(argv), rc, out, err, time.monotonic() - start)

    def _forget(self, bg: proc.Background) -> None:
        # Output kept in a folder of our own is read once; the folder goes with the last process.
        if self._own_dir is not None:
            for p in (bg.stdout_path, bg.stderr_path):
                try:
                    os.unlink(p)
                except FileNotFoundError:
                    pass
            if not self._procs:
                shutil.rmtree(self._own_dir, ignore_errors=True)
                self._own_dir = None

    def kill(self, pid: int, signal: str = "KILL") -> None:
        bg = self._procs.pop(pid, None)
        if bg is not None:
            bg.stop(grace=0.5 if signal == "KILL" else 3.0)
            self._forget(bg)

    def stop(self, pid: int) -> str:
        """Kill a process and return what it printed."""
        bg = self._procs.pop(pid, None)
        if bg is None:
            return ""
        bg.stop(grace=0.5)
        out, err = self._output(bg)
        self._forget(bg)
        return out + err

    def stop_all(self) -> None:
        for pid in list(self._procs):
            self.kill(pid)
        if self._own_dir is not None:
            shutil.rmtree(self._own_dir, ignore_errors=True)
            self._own_dir = None


class Local(_Processes):
    """This machine's root namespace."""

    netns: str | None = None

    def __init__(self, out_dir: str | None = None, name: str = "local") -> None:
        super().__init__(out_dir)
        self.name = name

    def run(self, argv: Sequence[str], *, timeout: float = 30, check: bool = True,
            input: str | None = None) -> proc.Completed:
        return proc.run(argv, timeout=timeout, check=check, input=input)

    def read_file(self, path: str, limit: int = 1 << 20) -> str:
        with open(path, errors="replace") as f:
            return f.read(limit)

    def write_file(self, path: str, text: str) -> None:
        with open(path, "w") as f:
            f.write(text)


class Netns(_Processes):
    """A named network namespace on this machine."""

    def __init__(self, netns: str, out_dir: str | None = None) -> None:
        super().__init__(out_dir)
        self.netns = self.name = netns
        #: CPUs every process started in the namespace is kept on (placement.endpoints);
        #: () leaves them to the scheduler (or to the harness's CPUs, which they inherit)
        self.cpus: tuple[int, ...] = ()

    def pin(self, cpus: Sequence[int]) -> None:
        self.cpus = tuple(cpus)

    def _netns(self) -> str | None:
        return self.netns

    def _cpus(self) -> tuple[int, ...]:
        return self.cpus

    def run(self, argv: Sequence[str], *, timeout: float = 30, check: bool = True,
            input: str | None = None) -> proc.Completed:
        # Pinned too: the window fails a sample for any process in a pinned namespace that
        # was allowed other CPUs, and a short helper (cat of a sysfs counter) is one.
        res = proc.run(argv, timeout=timeout, check=False, netns=self.netns, input=input, cpus=self.cpus)
        if check and res.rc != 0:
            # Name the namespace, not the `ip netns exec` wrapper, as where it failed.
            raise CommandError([f"{self.netns}:", *argv], res.rc, res.stderr or res.stdout, stdout=res.stdout)
        return proc.Completed(tuple(str(a) for a in argv), res.rc, res.stdout, res.stderr, res.seconds)

    def read_file(self, path: str, limit: int = 1 << 20) -> str:
        if path.startswith(_THREAD_VIEW):
            return in_thread_netns(self.netns, lambda: _read(path, limit))
        if path.startswith(_PER_NETNS):
            # `ip netns exec` mounts the namespace's own sysfs for the command.
            return self.run(["cat", "--", path], timeout=10).stdout[:limit]
        # Namespaces share the host's kernel: /proc/stat here is the host's.
        return _read(path, limit)

    def write_file(self, path: str, text: str) -> None:
        if path.startswith(_THREAD_VIEW):
            in_thread_netns(self.netns, lambda: _write(path, text))
        elif path.startswith(_PER_NETNS):
            self.run(["tee", "--", path], timeout=10, input=text)
        else:
            _write(path, text)


def _read(path: str, limit: int) -> str:
    with open(path, errors="replace") as f:
        return f.read(limit)


def _write(path: str, text: str) -> None:
    with open(path, "w") as f:
        f.write(text)


def local() -> Local:
    return Local()
