"""Numbers at the door: argparse types with a range and finiteness, so a bad number is refused
by the parser with its argument's name (argparse prefixes "argument --x:"), never deep in the
statistics. And a parser whose errors are one line."""
from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Callable

from testbed.errors import one_line


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
        try:
            v = float(text) if len(text) <= 40 and text.isascii() else math.nan
        except ValueError:
            v = math.nan
        above = v > low if low_open else v >= low
        if not math.isfinite(v) or not above or v > high:
            rng = f"{'above' if low_open else 'from'} {low:g} {'and at most' if low_open else 'to'} {high:g}"
            raise argparse.ArgumentTypeError(f"{one_line(text, 40)!r}: expected a finite number {rng}")
        return v
    parse.__name__ = "number"
    return parse


def fraction(text: str) -> float:
    """A fraction in [0, 1): thresholds, rates, headroom."""
    try:
        v = float(text) if len(text) <= 40 else math.nan
    except ValueError:
        v = math.nan
    if not (math.isfinite(v) and 0 <= v < 1):
        raise argparse.ArgumentTypeError(f"{one_line(text, 40)!r}: expected a fraction in [0, 1)")
    return v


class OneLineParser(argparse.ArgumentParser):
    """argparse prints the usage and then the error: two lines or more. A user mistake here is
    one line naming the argument (the usage stays one `--help` away), exit status 2."""

    def error(self, message: str) -> None:               # type: ignore[override]
        sys.stderr.write(f"{self.prog}: {one_line(message, 600)} (see {self.prog} --help)\n")
        sys.exit(2)
