"""How every `testbed` command presents itself: a description, help on every option, the same
metavar for the same thing, global options accepted before or after the subcommand, and its
exit statuses at the end of its --help (testbed.cli.exits). Subcommands are made through
``command`` so that none can miss one of these; a test walks the parser and holds them to it."""
from __future__ import annotations

import argparse
import re
import textwrap
from typing import Any

from testbed.cli import exits
from testbed.cli.argtypes import OneLineParser

#: the one metavar for each kind of value, wherever an option takes it
DB = "PATH|URL"
RUN = "RUN"
FILE = "FILE"
TOPOLOGY = "TOPOLOGY"


class Formatter(argparse.HelpFormatter):
    """Descriptions are paragraphs (blank-line separated) wrapped to the terminal; a paragraph
    whose lines are indented (the exit statuses, examples) is kept as written."""

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        out = []
        for para in text.strip("\n").split("\n\n"):
            lines = para.splitlines()
            if any(line.startswith(" ") for line in lines[1:]) or para.startswith(" "):
                out.append("\n".join(indent + row for line in lines for row in _hang(line, width)))
            else:
                out.append(textwrap.fill(" ".join(para.split()), width, initial_indent=indent,
                                         subsequent_indent=indent))
        return "\n\n".join(out)


def _hang(line: str, width: int) -> list[str]:
    """An indented table row ("  5    meaning ...") wrapped under its second column."""
    m = re.match(r"(\s+\S+\s+)(\S.*)", line)
    if not m or len(line) <= width:
        return [line]
    return textwrap.wrap(m.group(2), width, initial_indent=m.group(1),
                         subsequent_indent=" " * len(m.group(1)))


def add_global_options(p: argparse.ArgumentParser, *, on_subcommand: bool = False) -> None:
    """Options that apply to every command. On a subcommand they default to SUPPRESS, so one
    given before the subcommand is not reset by the subcommand's parser: `testbed -v validate
    FILE` and `testbed validate FILE -v` are the same."""
    quiet = {"default": argparse.SUPPRESS} if on_subcommand else {}
    g = p.add_argument_group("global options (before or after the command)")
    g.add_argument("-v", "--verbose", action="store_true", help="log what is done, step by step",
                   **quiet)
    g.add_argument("--results", dest="results_root", metavar="DIR",
                   help="where runs are written and looked up (default: ./results, or "
                        "$TESTBED_RESULTS)", **quiet)
    g.add_argument("--shared-host", action="store_true",
                   help="run beside other shared runs on this host instead of holding it alone "
                        "(for functional checks on a shared machine: noisy samples are kept, "
                        "marked, not measured again; also $TESTBED_SHARED_HOST=1)", **quiet)


def command(sub: Any, name: str, summary: str, description: str = "", *,
            path: str | None = None, **kw: Any) -> argparse.ArgumentParser:
    """A subcommand with its one-line summary (in the parent's list), its description (the
    summary, then ``description``'s paragraphs), the global options and its exit statuses.
    ``path`` is the command as typed after `testbed` (default: ``name``), the key into
    testbed.cli.exits."""
    full = summary[0].upper() + summary[1:] + "."
    if description:
        full += "\n\n" + textwrap.dedent(description).strip("\n")
    p = sub.add_parser(name, help=summary, description=full, epilog=exits.epilog(path or name),
                       formatter_class=Formatter, **kw)
    add_global_options(p, on_subcommand=True)
    return p


def subcommands(p: argparse.ArgumentParser, dest: str, title: str = "commands") -> Any:
    return p.add_subparsers(dest=dest, required=True, title=title, metavar="COMMAND",
                            parser_class=OneLineParser,
                            help="one of the commands below, each with its own --help")
