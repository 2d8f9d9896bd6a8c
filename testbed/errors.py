"""One exception tree, and the exit statuses it maps to. The CLI maps each class to an exit
status and prints one line; ``ExitStatus`` is the one list of statuses, from which every
command's ``--help`` and the documentation's table are generated (testbed.cli.exits)."""
from __future__ import annotations

from collections.abc import Sequence
from enum import IntEnum


class ExitStatus(IntEnum):
    """Every status a `testbed` command exits with. What each means in general is
    ``meaning``; a command's own words for it are in testbed.cli.exits."""

    OK = 0
    FAILED = 1
    BAD_INPUT = 2
    MISSING_CAPABILITY = 3
    HOST_UNAVAILABLE = 4
    UNDECIDED = 5
    SOME_HOSTS_FAILED = 6
    NO_HOST_DONE = 7
    INTERRUPTED = 130

    @property
    def meaning(self) -> str:
        return _MEANINGS[self]


_MEANINGS = {
    ExitStatus.OK: "success",
    ExitStatus.FAILED: "something failed: a sample or a cell, a regression the gate found, or an "
                       "error that is none of the others (its one line says what was run and "
                       "what it printed)",
    ExitStatus.BAD_INPUT: "bad input: one line names the file or argument, the field and the "
                          "problem; nothing was created or changed",
    ExitStatus.MISSING_CAPABILITY: "a capability you asked for is missing on this host (e.g. "
                                   "vhost without /dev/vhost-net); it is never silently replaced",
    ExitStatus.HOST_UNAVAILABLE: "the host cannot take the run: another run holds it, a dead run "
                                 "left tb- objects (`testbed cleanup`), it stayed busy, its disk "
                                 "is full, or a daemon or guests it needs were lost (finished "
                                 "cells are kept: `--resume`)",
    ExitStatus.UNDECIDED: "the nightly gate could not decide: nothing regressed, but some cell "
                          "has too few samples, is inconclusive or has no baseline",
    ExitStatus.SOME_HOSTS_FAILED: "a fleet run finished on some hosts and failed on others (each "
                                  "named with its reason)",
    ExitStatus.NO_HOST_DONE: "a fleet run finished on no host",
    ExitStatus.INTERRUPTED: "interrupted (Ctrl-C or SIGTERM); everything created was torn down",
}


class TestbedError(Exception):
    """Base of every error the testbed raises on purpose."""

    exit_status: int = ExitStatus.FAILED


def one_line(text: str, limit: int = 300) -> str:
    """``text`` made safe for one line of a message: control characters (newlines, escapes,
    NUL, bidi overrides...) shown escaped as repr would, and a length cap, so a hostile key,
    path or value can neither split an error into two lines nor flood the terminal."""
    out = "".join(c if c.isprintable() else repr(c)[1:-1] for c in str(text))
    return out if len(out) <= limit else out[:limit] + f"...({len(out) - limit} more characters)"


class ConfigError(TestbedError):
    """Bad user input: names the file and the field, so the user can fix it without a traceback.
    Always one line: every part is passed through one_line."""

    exit_status = ExitStatus.BAD_INPUT

    def __init__(self, file: str, field: str, message: str, line: int | None = None) -> None:
        file, field, message = one_line(file), one_line(field), one_line(message, 600)
        self.file, self.field, self.message, self.line = file, field, message, line
        where = f"{file}:{line}" if line else file
        super().__init__(f"{where}: {field}: {message}")


class CapabilityError(TestbedError):
    """A requested capability is missing on this host. Never silently substituted."""

    exit_status = ExitStatus.MISSING_CAPABILITY


class CommandError(TestbedError):
    """A command failed or timed out. Carries what was run and the tail of what it printed."""

    def __init__(self, argv: Sequence[str], rc: int | None, stderr: str, timed_out: bool = False,
                 stdout: str = "") -> None:
        self.argv, self.rc, self.timed_out, self.stdout = list(argv), rc, timed_out, stdout
        self.stderr_tail = "\n".join(stderr.strip().splitlines()[-8:])
        what = "timed out" if timed_out else f"exited {rc}"
        tail = f": {self.stderr_tail}" if self.stderr_tail else ""
        super().__init__(f"`{' '.join(self.argv)}` {what}{tail}")


class StoppedError(CommandError):
    """A command was stopped before its end because what it measured through was already
    broken (the host guard saw a device, namespace, daemon or guest go during it): waiting
    for it to time out would only make the user wait."""

    def __init__(self, argv: Sequence[str], why: str) -> None:
        super().__init__(argv, None, "")
        self.args = (f"`{' '.join(self.argv)}` stopped early: {why}",)


class ReadinessError(TestbedError):
    """A wait passed its deadline. Says what it waited for and the last console lines."""

    def __init__(self, what: str, waited_s: float, console_tail: str = "") -> None:
        self.what, self.waited_s, self.console_tail = what, waited_s, console_tail
        msg = f"{what} not ready after {waited_s:.0f} s"
        if console_tail:
            msg += "; last console lines:\n" + console_tail
        super().__init__(msg)


class GuestError(TestbedError):
    """A command inside a guest could not be run (agent unreachable, binary missing)."""


class LeftoversError(TestbedError):
    """A dead run left tb- objects behind; a new run refuses to start on top of them."""

    exit_status = ExitStatus.HOST_UNAVAILABLE


class HostNotQuiet(TestbedError):
    """The host stayed busy with other work past the wait for a quiet start (noise.quiet_start)."""

    exit_status = ExitStatus.HOST_UNAVAILABLE
