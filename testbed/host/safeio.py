"""Files a user hands the testbed, read and written with care.

Reading: only regular files (a FIFO would block, a device would be read for ever), with a size
cap, as strict JSON: finite numbers only (no NaN or Infinity, no 5,000-digit integers), and a
nesting cap. Writing a user-named output: refused, before any work, when the name is empty or
names a directory, a device, a FIFO or a socket, or sits under something that is not a
directory; the text goes to a temporary file beside it that is renamed over the target only
after the target is checked again, so a device node is never replaced by a regular file.

Every refusal is a :class:`UserFileError` (exit status 2) naming the file or the argument,
one line whatever the name holds.
"""
from __future__ import annotations

import contextlib
import json
import math
import os
import stat
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from testbed.errors import TestbedError, one_line

#: a JSON document may nest this deep; run.json is about six levels
MAX_DEPTH = 64
#: digits in a JSON integer: every count the testbed records fits in 18, and a store's
#: integer column holds 64 bits (19 digits), so a longer one is no figure of a run
MAX_INT_DIGITS = 18


class UserFileError(TestbedError):
    """A file or argument the user gave cannot be used: names it, one line."""

    exit_status = 2

    def __init__(self, where: str | os.PathLike, problem: str) -> None:
        self.where, self.problem = one_line(str(where)), one_line(problem, 600)
        super().__init__(f"{self.where}: {self.problem}")


def kind(mode: int) -> str:
    """What a file of this mode is, in words."""
    for test, name in ((stat.S_ISDIR, "a directory"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISFIFO, "a FIFO"),
                       (stat.S_ISSOCK, "a socket"), (stat.S_ISLNK, "a symbolic link"),
                       (stat.S_ISREG, "a regular file")):
        if test(mode):
            return name
    return "not a regular file"


# --------------------------------------------------------------------------- reading

def _stat_regular(path: Path, where: str) -> os.stat_result:
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise UserFileError(where, "missing") from None
    except OSError as e:
        raise UserFileError(where, f"cannot be read: {e.strerror}") from None
    if not stat.S_ISREG(st.st_mode):
        raise UserFileError(where, f"is {kind(st.st_mode)}, not a regular file")
    return st


def read_regular(path: Path, limit: int, what: str | None = None) -> bytes:
    """The bytes of a regular file of at most ``limit`` bytes. Stat before opening, so a
    device or FIFO is never opened; fstat after, so it cannot be swapped in between."""
    where = what or str(path)
    _stat_regular(path, where)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as e:
        raise UserFileError(where, f"cannot be read: {e.strerror}") from None
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode):
            raise UserFileError(where, f"is {kind(st.st_mode)}, not a regular file")
        if st.st_size > limit:
            raise UserFileError(where, f"is {st.st_size} bytes, more than the {limit} allowed")
        try:
            data = f.read(limit + 1)
        except OSError as e:
            raise UserFileError(where, f"cannot be read: {e.strerror}") from None
    if len(data) > limit:
        raise UserFileError(where, f"is more than the {limit} bytes allowed")
    return data


def check_regular(path: Path, limit: int, what: str | None = None) -> int:
    """A regular file of at most ``limit`` bytes that this process may read, found by stat()
    alone (it is not opened: a key file stays unread). Returns its size."""
    where = what or str(path)
    st = _stat_regular(path, where)
    if st.st_size > limit:
        raise UserFileError(where, f"is {st.st_size} bytes, more than the {limit} allowed")
    if not os.access(path, os.R_OK):
        raise UserFileError(where, "cannot be read: permission denied")
    return st.st_size


def _bad_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a number this testbed records")


def _int(text: str) -> int:
    if len(text.lstrip("-")) > MAX_INT_DIGITS:
        raise ValueError(f"an integer of {len(text)} digits")
    return int(text)


def _float(text: str) -> float:
    v = float(text)
    if not math.isfinite(v):
        raise ValueError(f"{text[:20]} is out of range")
    return v


def _depth(value: Any) -> int:
    deepest, stack = 0, [(value, 1)]
    while stack:
        v, d = stack.pop()
        deepest = max(deepest, d)
        if isinstance(v, dict):
            stack.extend((x, d + 1) for x in v.values())
        elif isinstance(v, list):
            stack.extend((x, d + 1) for x in v)
    return deepest


def loads(text: str | bytes, where: str) -> Any:
    """Strict JSON: refuses NaN and infinities, huge integers, and deep nesting, naming
    ``where`` (a file, or file:line)."""
    try:
        if isinstance(text, bytes):
            text = text.decode("utf-8")
        value = json.loads(text, parse_constant=_bad_constant, parse_int=_int,
                           parse_float=_float)
    except UnicodeDecodeError as e:
        raise UserFileError(where, f"not UTF-8 text (byte {e.start})") from None
    except json.JSONDecodeError as e:
        raise UserFileError(where, f"not valid JSON: {e.msg} at column {e.colno}") from None
    except RecursionError:
        raise UserFileError(where, f"nested more than {MAX_DEPTH} levels deep") from None
    except ValueError as e:
        raise UserFileError(where, f"not valid JSON here: {e}") from None
    if _depth(value) > MAX_DEPTH:
        raise UserFileError(where, f"nested more than {MAX_DEPTH} levels deep")
    return value


def json_lines(data: bytes, name: str) -> Iterator[tuple[int, Any]]:
    """(line number, value) for each non-empty line of a JSON-lines file. A line that does not
    parse is refused with its number, except an unterminated last line: the mark of a writer
    killed mid-write, whose earlier lines are whole (each was fsynced)."""
    lines = data.split(b"\n")
    torn_last = not data.endswith(b"\n")
    for n, raw in enumerate(lines, 1):
        if not raw.strip():
            continue
        try:
            yield n, loads(raw, f"{name}:{n}")
        except UserFileError:
            if torn_last and n == len(lines):
                return
            raise


# --------------------------------------------------------------------------- writing

def check_output(path: str | os.PathLike, arg: str) -> Path | None:
    """A user-named output, checked before any work: None for ``-`` (stdout). Refuses empty
    names, NUL bytes, existing targets that are not regular files (followed through symbolic
    links), and parents that exist but are not directories."""
    text = os.fspath(path)
    if text == "-":
        return None
    if not text or not text.strip():
        raise UserFileError(arg, "an empty file name")
    if "\0" in text:
        raise UserFileError(arg, f"{text!r}: a file name cannot hold a NUL byte")
    p = Path(text)
    if text.endswith("/") or p.name in ("", ".", ".."):
        raise UserFileError(arg, f"{text}: names a directory, not a file")
    try:
        st = os.stat(p)
    except FileNotFoundError:
        st = None
    except NotADirectoryError:
        raise UserFileError(arg, f"{text}: a parent is not a directory") from None
    except OSError as e:
        raise UserFileError(arg, f"{text}: {e.strerror}") from None
    if st is not None and not stat.S_ISREG(st.st_mode):
        raise UserFileError(arg, f"{text}: is {kind(st.st_mode)}; an output must be a regular file")
    # the nearest existing ancestor must be a directory we can write into
    parent = p.absolute().parent
    while not parent.exists() and parent != parent.parent:
        if parent.is_symlink():
            raise UserFileError(arg, f"{text}: {parent} is a dangling symbolic link")
        parent = parent.parent
    if not parent.is_dir():
        raise UserFileError(arg, f"{text}: {parent} is not a directory")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise UserFileError(arg, f"{text}: {parent} is not writable")
    return p


def check_outputs(named: Iterable[tuple[str | os.PathLike | None, str]]) -> dict[str, Path | None]:
    """Every output of one command checked before the first is written: {arg: path}. Two
    arguments naming the same file are refused too."""
    out: dict[str, Path | None] = {}
    seen: dict[Path, str] = {}
    for path, arg in named:
        if path is None:
            continue
        p = check_output(path, arg)
        if p is not None:
            real = p.resolve()
            if real in seen:
                raise UserFileError(arg, f"{path}: the same file as {seen[real]}")
            seen[real] = arg
        out[arg] = p
    return out


def write_output(path: Path | None, text: str, arg: str, mode: int = 0o644) -> None:
    """Write ``text`` to a checked output (None: stdout), atomically. The target is looked at
    again just before the rename: if it became anything but a regular file, nothing is
    replaced."""
    import sys
    if path is None:
        sys.stdout.write(text)
        return
    target = path.resolve() if path.is_symlink() else path
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, mode)
        with contextlib.suppress(FileNotFoundError):
            st = os.lstat(target)
            if not stat.S_ISREG(st.st_mode):
                raise UserFileError(arg, f"{path}: became {kind(st.st_mode)} while writing; "
                                         f"nothing was replaced")
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def check_flag_variable(name: str, value: str | None) -> None:
    """An environment variable that switches something on (1) or off (0, or unset)."""
    if value is not None and value.strip() not in ("0", "1"):
        raise UserFileError(name, f"expected 0 or 1, got {value[:40]!r}")


def check_dir_variable(name: str, value: str | None) -> None:
    """An environment variable that names a folder the testbed writes into (TESTBED_RESULTS,
    TESTBED_STATE): it may be missing, but not anything other than a directory."""
    if value is None:
        return
    if not value.strip():
        raise UserFileError(name, "set but empty")
    if "\0" in value:
        raise UserFileError(name, "holds a NUL byte")
    p = Path(value)
    try:
        st = os.stat(p)
    except FileNotFoundError:
        anc = p.absolute().parent
        while not anc.exists() and anc != anc.parent:
            anc = anc.parent
        if not anc.is_dir():
            raise UserFileError(name, f"{value}: {anc} is not a directory") from None
        return
    except NotADirectoryError:
        raise UserFileError(name, f"{value}: a parent is not a directory") from None
    except OSError as e:
        raise UserFileError(name, f"{value}: {e.strerror}") from None
    if not stat.S_ISDIR(st.st_mode):
        raise UserFileError(name, f"{value}: is {kind(st.st_mode)}, not a directory")
