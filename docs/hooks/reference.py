"""MkDocs hook: the command reference is generated from `testbed.cli.parser()` at build time,
so it cannot drift from the code. Nothing is written into docs/: the page exists only in the
built site (and `python docs/hooks/reference.py` prints it)."""
from __future__ import annotations

import argparse

CLI_PAGE = "reference/cli.md"


def _usage(p: argparse.ArgumentParser) -> str:
    return p.format_usage().removeprefix("usage: ").strip()


def _options(p: argparse.ArgumentParser) -> list[str]:
    rows = []
    for a in p._actions:                                   # argparse has no public walk
        if isinstance(a, (argparse._HelpAction, argparse._SubParsersAction)):
            continue
        name = ", ".join(f"`{s}`" for s in a.option_strings) or f"`{a.metavar or a.dest}`"
        if a.choices and not isinstance(a.choices, dict):
            name += " (" + " \\| ".join(str(c) for c in a.choices) + ")"
        text = (a.help or "").replace("|", "\\|").replace("\n", " ")
        if a.default not in (None, False, argparse.SUPPRESS) and "default" not in text:
            text += f" (default: `{a.default}`)"
        rows.append(f"| {name} | {text} |")
    return rows


def _walk(p: argparse.ArgumentParser, words: list[str], out: list[str]) -> None:
    subs = [a for a in p._actions if isinstance(a, argparse._SubParsersAction)]
    helps = {c.dest: c.help for s in subs for c in s._choices_actions}
    if words:
        out += [f"## `testbed {' '.join(words)}`", ""]
        if helps_of := getattr(p, "_tb_help", None):
            out += [helps_of, ""]
        out += ["```", _usage(p), "```", ""]
        rows = _options(p)
        if rows:
            out += ["| argument | meaning |", "|---|---|", *rows, ""]
    for s in subs:
        for name, child in s.choices.items():
            child._tb_help = helps.get(name)               # type: ignore[attr-defined]
            _walk(child, [*words, name], out)


def cli_markdown() -> str:
    from testbed import cli
    p = cli.parser()
    out = ["# Command reference", "",
           "Generated from the argument parser of this version of `testbed` "
           "(`testbed SUBCOMMAND --help` prints the same).", "",
           "```", _usage(p), "```", "",
           "| argument | meaning |", "|---|---|", *_options(p), ""]
    _walk(p, [], out)
    out += ["Exit statuses are listed in [Troubleshooting](../troubleshooting.md#exit-statuses).", ""]
    return "\n".join(out)


def on_files(files, config):                               # noqa: ANN001 (MkDocs' hook signature)
    from mkdocs.structure.files import File
    files.append(File.generated(config, CLI_PAGE, content=cli_markdown()))
    return files


if __name__ == "__main__":
    print(cli_markdown())
