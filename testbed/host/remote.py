"""Commands and files on a hypervisor: this machine, or a real host reached over ssh.

A host is a libvirt URI plus a command transport (model.HostSpec). libvirt drives the
remote host's domains through its own ``qemu+ssh://`` (or ``qemu+libssh2://``) connection;
everything libvirt does not do (the guest's overlay and seed, the datapath: bridge, vxlan
device, OVS ports, the underlay checks) goes through a Shell.

ssh always checks the remote host key against known_hosts (the host's pinned file when the
topology names one, else ssh's own files) and never accepts a new key on first use:
``StrictHostKeyChecking=yes``. It never prompts either (``BatchMode=yes``), so a missing key
or a refused login is an error with ssh's own message, not a hang.
"""
from __future__ import annotations

import contextlib
import shlex
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from testbed.errors import CapabilityError, CommandError
from testbed.host import proc
from testbed.host.executor import _Processes
from testbed.topology.model import HostSpec


class _RemoteProcesses(_Processes):
    """Processes started over ssh. The local ssh client is the child this process waits
    on; the remote shell prints its pid first (then execs the command), so ``kill`` can
    signal the remote process itself: killing the ssh client alone would leave it running."""

    def __init__(self, shell: Shell) -> None:
        super().__init__(None)
        self.shell, self.name = shell, shell.host.name

    def _argv(self, argv: Sequence[str]) -> list[str]:
        if not self.shell.remote:
            return [str(a) for a in argv]
        return self.shell.argv(["sh", "-c", 'echo $$; exec "$@"', "sh", *argv])

    def _output(self, bg: proc.Background) -> tuple[str, str]:
        out = bg.stdout()
        if self.shell.remote:
            out = out.split("\n", 1)[1] if "\n" in out else ""
        return out, bg.stderr()

    def kill(self, pid: int, signal: str = "KILL") -> None:
        bg = self._procs.get(pid)
        if bg is not None and self.shell.remote and bg.popen.poll() is None:
            first = bg.stdout().split("\n", 1)[0].strip()
            if first.isdigit():
                with contextlib.suppress(CommandError):
                    self.shell.run(["kill", f"-{signal}", first], timeout=15, check=False)
        super().kill(pid, signal)


@dataclass(frozen=True)
class Shell:
    """A host's command transport; a testbed.host.executor.Executor (ssh, or this machine)."""

    host: HostSpec
    _jobs: _RemoteProcesses = field(init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_jobs", _RemoteProcesses(self))

    @property
    def name(self) -> str:
        return self.host.name

    @property
    def remote(self) -> bool:
        return self.host.remote

    def _ssh_options(self) -> list[str]:
        h = self.host
        opts = ["-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=yes", "-o", "ConnectTimeout=10",
                "-o", "ServerAliveInterval=10", "-o", "LogLevel=ERROR"]
        if h.known_hosts:
            opts += ["-o", f"UserKnownHostsFile={h.known_hosts}", "-o", "GlobalKnownHostsFile=/dev/null"]
        if h.identity:
            opts += ["-i", h.identity, "-o", "IdentitiesOnly=yes"]
        return opts

    def argv(self, argv: Sequence[str]) -> list[str]:
        """``argv`` as this machine runs it: itself locally, wrapped in ssh for a remote host
        (one quoted remote command line, so arguments keep their boundaries)."""
        argv = [str(a) for a in argv]
        if not self.remote:
            return argv
        assert self.host.ssh_target
        # '--' before the host: nothing after it is read as an option, whatever the target says.
        return ["ssh", *self._ssh_options(), "-p", str(self.host.ssh_port), "--", self.host.ssh_target,
                shlex.join(argv)]

    def run(self, argv: Sequence[str], *, timeout: float = 60, check: bool = True,
            input: str | None = None) -> proc.Completed:
        return proc.run(self.argv(argv), timeout=timeout, check=check, input=input)

    def put(self, local: Path, dest: str, *, timeout: float = 3600) -> None:
        """Copy a file to ``dest`` on the host (scp, with the same host-key rules)."""
        if not self.remote:
            proc.run(["cp", "--", str(local), dest], timeout=timeout)
            return
        assert self.host.ssh_target
        proc.run(["scp", "-q", *self._ssh_options(), "-P", str(self.host.ssh_port), "--", str(local),
                  f"{self.host.ssh_target}:{dest}"], timeout=timeout)

    def read(self, path: str, *, timeout: float = 30) -> str:
        return self.run(["cat", "--", path], timeout=timeout).stdout

    # -- the rest of the executor protocol (testbed.host.executor.Executor) --

    def read_file(self, path: str, limit: int = 1 << 20) -> str:
        return self.read(path)[:limit]

    def write_file(self, path: str, text: str) -> None:
        self.run(["tee", "--", path], timeout=30, input=text)

    def spawn(self, argv: Sequence[str]) -> int:
        """Start a command on the host; returns the pid of its local ssh client."""
        return self._jobs.spawn(argv)

    def wait(self, pid: int, argv: Sequence[str], timeout: float,
             expected_s: float = 0.0, stop: proc.Stop | None = None) -> proc.Completed:
        return self._jobs.wait(pid, argv, timeout, expected_s, stop)

    def kill(self, pid: int, signal: str = "KILL") -> None:
        self._jobs.kill(pid, signal)

    def stop_all(self) -> None:
        self._jobs.stop_all()

    def exists(self, path: str) -> bool:
        return self.run(["test", "-e", path], timeout=30, check=False).rc == 0

    def reachable(self) -> None:
        """Log in once (host key checked); raises CapabilityError with ssh's reason."""
        if not self.remote:
            return
        try:
            self.run(["true"], timeout=30)
        except CommandError as e:
            raise CapabilityError(f"host {self.host.name}: ssh {self.host.ssh_target} (port "
                                  f"{self.host.ssh_port}) failed: {e.stderr_tail or e}") from None


def shell(host: HostSpec) -> Shell:
    return Shell(host)
