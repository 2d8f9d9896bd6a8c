"""Commands inside a guest through qemu-guest-agent over virtio-serial.

The agent channel does not use any network under test, so control traffic never
disturbs a measurement and a broken test network never cuts the testbed off.
"""
from __future__ import annotations

import base64
import json
import time
from collections.abc import Sequence

from testbed.errors import CommandError, GuestError, StoppedError
from testbed.guests.lazy import libvirt, libvirt_qemu
from testbed.host import proc
from testbed.host.proc import Stop

AGENT_TIMEOUT_S = 10

#: What a command in a guest returns: the same type as everywhere else (testbed.host.executor).
GuestResult = proc.Completed


class Agent:
    """A guest's qemu-guest-agent, reached through libvirt; a testbed.host.executor.Executor."""

    def __init__(self, dom: libvirt.virDomain, name: str) -> None:
        self.dom, self.name = dom, name

    def command(self, execute: str, arguments: dict | None = None,
                timeout: int = AGENT_TIMEOUT_S) -> object:
        msg = {"execute": execute, **({"arguments": arguments} if arguments else {})}
        try:
            reply = libvirt_qemu.qemuAgentCommand(self.dom, json.dumps(msg), timeout, 0)
        except libvirt.libvirtError as e:
            raise GuestError(f"guest {self.name}: agent {execute} failed: {e.get_error_message()}") from None
        return json.loads(reply)["return"]

    def ping(self) -> bool:
        try:
            self.command("guest-ping", timeout=2)
            return True
        except GuestError:
            return False

    def spawn(self, argv: Sequence[str], stdin: bytes | None = None) -> int:
        """Start a process in the guest; returns its pid. Output is kept by the agent;
        ``stdin`` is fed to the process by the agent."""
        args = {"path": argv[0], "arg": list(argv[1:]), "capture-output": True}
        if stdin is not None:
            args["input-data"] = base64.b64encode(stdin).decode()
        try:
            ret = self.command("guest-exec", args)
        except GuestError as e:
            # The agent reports a missing binary as a failed exec: say which.
            raise CommandError([f"{self.name}:", *argv], 127, str(e)) from None
        return int(ret["pid"])  # type: ignore[index]

    def status(self, pid: int) -> dict | None:
        st = self.command("guest-exec-status", {"pid": pid})
        return st if st.get("exited") else None  # type: ignore[union-attr]

    def alive(self, pid: int) -> bool:
        return self.status(pid) is None

    def wait(self, pid: int, argv: Sequence[str], timeout: float,
             expected_s: float = 0.0, stop: Stop | None = None) -> GuestResult:
        """Poll until the process exits. ``expected_s``: how long it is known to run (a
        tool's test duration). No polls before then, because every poll is agent work inside
        the guest during a measurement window; afterwards short polls, so the end is seen
        within a few tens of milliseconds instead of up to a whole back-off step.
        ``stop``: set when waiting on is pointless (the host guard saw the path break); the
        process is killed and StoppedError raised."""
        start = time.monotonic()
        deadline = start + timeout
        pause = stop.wait if stop is not None else time.sleep
        if expected_s > 0:
            pause(min(expected_s, timeout))
        delay = 0.01
        # when the process was last known to run: its spawn at the latest (before the wait)
        running_at = start
        while True:
            if stop is not None and stop.is_set():
                if self.ping():         # a crashed guest's agent would only make us wait
                    self.kill(pid)
                raise StoppedError([f"{self.name}:", *argv], stop.why)
            asked = time.monotonic()
            st = self.status(pid)
            if st is not None:
                # the end is known only to lie between the last look that found it running
                # and this answer: on a busy host an agent round trip takes a second or more
                return GuestResult(tuple(argv), _rc(st), _b64(st.get("out-data")),
                                   _b64(st.get("err-data")), time.monotonic() - start, running_at=running_at)
            running_at = asked
            if time.monotonic() >= deadline:
                self.kill(pid)
                raise CommandError([f"{self.name}:", *argv], None, "", timed_out=True)
            pause(delay)
            delay = min(delay * 1.5, 0.25)

    def kill(self, pid: int, signal: str = "KILL") -> None:
        try:
            kpid = self.spawn(["/bin/kill", f"-{signal}", str(pid)])
            self.wait(kpid, ["kill"], 10)
        except (GuestError, CommandError):
            pass  # already gone, or the agent is gone with the guest

    def stop(self, pid: int) -> str:
        """Kill a process and return what it printed (the agent keeps its output)."""
        self.kill(pid)
        try:
            res = self.wait(pid, ["stop"], 10)
        except (GuestError, CommandError):
            return ""
        return res.stdout + res.stderr

    def run(self, argv: Sequence[str], timeout: float = 30, check: bool = True,
            stdin: bytes | None = None) -> GuestResult:
        res = self.wait(self.spawn(argv, stdin), argv, timeout)
        if check and res.rc != 0:
            raise CommandError([f"{self.name}:", *argv], res.rc, res.stderr or res.stdout,
                               stdout=res.stdout)
        return res

    def write_file(self, path: str, text: str) -> None:
        self.write_bytes(path, text.encode())

    def write_bytes(self, path: str, data: bytes, mode: str = "w") -> None:
        """Write ``data`` through the agent's file commands: no process starts in the guest.
        ``mode`` is fopen's ("r+" writes into a FIFO or device without creating a file)."""
        handle = self.command("guest-file-open", {"path": path, "mode": mode})
        try:
            self.command("guest-file-write", {"handle": handle, "buf-b64": base64.b64encode(data).decode()})
        finally:
            self.command("guest-file-close", {"handle": handle})

    def exists(self, path: str) -> bool | None:
        """Whether ``path`` exists in the guest, asked by opening it through the agent: no
        process is started in the guest (under TCG a process start takes the guest's vCPU
        from whatever it is doing, such as the boot being waited for). None: the agent
        would not say (file commands disabled in its configuration, or any other refusal
        than a missing file); the caller asks another way."""
        try:
            handle = self.command("guest-file-open", {"path": path, "mode": "r"})
        except GuestError as e:
            return False if "No such file or directory" in str(e) else None
        self.command("guest-file-close", {"handle": handle})
        return True

    def read_file(self, path: str, limit: int = 1 << 20) -> str:
        handle = self.command("guest-file-open", {"path": path, "mode": "r"})
        try:
            data = self.command("guest-file-read", {"handle": handle, "count": limit})
            return _b64(data.get("buf-b64"))  # type: ignore[union-attr]
        finally:
            self.command("guest-file-close", {"handle": handle})


def _b64(s: str | None) -> str:
    return base64.b64decode(s).decode(errors="replace") if s else ""


def _rc(st: dict) -> int:
    if "exitcode" in st:
        return int(st["exitcode"])
    # Killed by a signal: the agent reports the signal instead of an exit code.
    return 128 + int(st.get("signal", 0))
