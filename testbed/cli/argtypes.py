"""Numbers at the door: argparse types with a range and finiteness, so a bad number is refused
by the parser with its argument's name (argparse prefixes "argument --x:"), never deep in the
statistics. And a parser whose errors are one line."""
from __future__ import annotations

import argparse
import math
import re
import sys
from collections.abc import Callable
from typing import Any

from testbed.errors import one_line


_DECIMAL = re.compile(r"\s*[+-]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]{1,3})?\s*")


def _float(text: str) -> float:
    """A decimal number written in ASCII (float() would also take '١٠', '1_0' and 'inf'),
    else NaN (refused by every caller)."""
    if len(text) > 40 or not _DECIMAL.fullmatch(text):
        return math.nan
    return float(text)


def integer(low: int, high: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        t = text.strip()
        # isdigit() and int() take any script's digits ("١٢", "１２"): only ASCII ones here
        if not t.isascii() or not t.lstrip("+-").isdigit() or len(t) > 20:
            raise argparse.ArgumentTypeError(f"{one_line(text, 40)!r}: expected a whole number "
                                             f"from {low} to {high}")
        v = int(t)
        if not low <= v <= high:
            raise argparse.ArgumentTypeError(f"{v}: expected a whole number from {low} to {high}")
        return v
    parse.__name__ = "integer"
    return parse


def number(low: float, high: float, *, low_open: bool = False) -> Callable[[str], float]:
    def parse(text: str) -> float:
        v = _float(text)
        above = v > low if low_open else v >= low
        if not math.isfinite(v) or not above or v > high:
            rng = f"{'above' if low_open else 'from'} {low:g} {'and at most' if low_open else 'to'} {high:g}"
            raise argparse.ArgumentTypeError(f"{one_line(text, 40)!r}: expected a finite number {rng}")
        return v
    parse.__name__ = "number"
    return parse


def level(text: str) -> float:
    """A test's level or a false discovery rate: in (0, 1), as the statistics take it."""
    v = _float(text)
    if not (math.isfinite(v) and 0 < v < 1):
        raise argparse.ArgumentTypeError(f"{one_line(text, 40)!r}: expected a level above 0 and below 1")
    return v


def fraction(text: str) -> float:
    """A fraction in [0, 1): thresholds, rates, headroom."""
    v = _float(text)
    if not (math.isfinite(v) and 0 <= v < 1):
        raise argparse.ArgumentTypeError(f"{one_line(text, 40)!r}: expected a fraction in [0, 1)")
    return v


class OneLineParser(argparse.ArgumentParser):
    """argparse prints the usage and then the error: two lines or more. A user mistake here is
    one line naming the argument (the usage stays one `--help` away), exit status 2. An
    option that takes one value is taken once (:class:`Once`): argparse would keep the last
    of two and drop the other without a word."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.register("action", None, Once)
        self.register("action", "store", Once)

    def error(self, message: str) -> None:               # type: ignore[override]
        sys.stderr.write(f"{self.prog}: {one_line(message, 600)} (see {self.prog} --help)\n")
        sys.exit(2)


def text(limit: int, what: str = "text") -> Callable[[str], str]:
    """One printable line of at most ``limit`` characters: a name or a reason that is written
    into a file and echoed (a control character would rewrite the terminal or split a line)."""
    def parse(value: str) -> str:
        if not value.strip():
            raise argparse.ArgumentTypeError(f"an empty {what}")
        if not value.isprintable():
            raise argparse.ArgumentTypeError(f"{one_line(value, 40)!r}: a {what} may not hold control characters")
        if len(value) > limit:
            raise argparse.ArgumentTypeError(f"a {what} of {len(value)} characters; at most {limit}")
        return value
    parse.__name__ = what
    return parse


def path_ref(what: str = "run directory or id") -> Callable[[str], str]:
    """A file, folder or id given on the command line: non-empty, printable, and a length the
    file system can look up (a 5000-character name would be an OSError, not an answer)."""
    def parse(value: str) -> str:
        if not value.strip():
            raise argparse.ArgumentTypeError(f"an empty {what}")
        if not value.isprintable():
            raise argparse.ArgumentTypeError(f"{one_line(value, 40)!r}: a {what} may not hold control characters")
        if len(value) > 4096 or any(len(part.encode()) > 255 for part in value.split("/")):
            raise argparse.ArgumentTypeError(f"{one_line(value, 40)!r}: a {what} this long names nothing")
        return value
    parse.__name__ = what
    return parse


def counts(low: int, high: int, most: int) -> Callable[[str], str]:
    """A comma-separated list of whole numbers (``1,2,4,8``): ASCII digits only (``²`` and
    ``٣`` are digits to Python, not to a count), each from ``low`` to ``high``, at most
    ``most`` of them. Returns the text as given, checked."""
    def parse(value: str) -> str:
        parts = [p.strip() for p in value.split(",")]
        if not value.strip() or len(parts) > most:
            raise argparse.ArgumentTypeError(f"{one_line(value, 40)!r}: expected 1 to {most} whole numbers, "
                                             f"comma-separated (e.g. 1,2,4,8)")
        for p in parts:
            if not p.isascii() or not p.isdigit() or len(p) > 9 or not low <= int(p) <= high:
                raise argparse.ArgumentTypeError(f"{one_line(p, 20)!r}: expected a whole number from {low} "
                                                 f"to {high} (e.g. 1,2,4,8)")
        return value
    parse.__name__ = "counts"
    return parse


class Once(argparse.Action):
    """An option that may be given once: a second --slo would silently replace the first.
    The default action of every option of a OneLineParser."""

    def __call__(self, parser, namespace, values, option_string=None):  # type: ignore[no-untyped-def]
        seen = f"_seen_{self.dest}"
        if option_string is not None and getattr(namespace, seen, False):
            parser.error(f"argument {option_string}: given more than once (it takes one value)")
        if option_string is not None:
            setattr(namespace, seen, True)
        setattr(namespace, self.dest, values)
