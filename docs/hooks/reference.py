"""MkDocs hook: the command reference and the table of exit statuses are generated from the
code at build time, so they cannot drift from it.

- reference/cli.md: every command from `testbed.cli.parser()`: its description, usage,
  arguments by group (as `--help` groups them) and its exit statuses (testbed.cli.exits);
- a page containing the line `<!-- exit-statuses -->` gets the one table of exit statuses
  there (testbed.errors.ExitStatus, and which commands return each).

Nothing is written into docs/: the reference exists only in the built site
(`python docs/hooks/reference.py` prints it)."""
from __future__ import annotations

import argparse

CLI_PAGE = "reference/cli.md"
EXIT_MARKER = "<!-- exit-statuses -->"


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def _usage(p: argparse.ArgumentParser) -> str:
    return p.format_usage().removeprefix("usage: ").rstrip()


def _help(p: argparse.ArgumentParser, a: argparse.Action) -> str:
    """The help text as --help prints it: %-expanded (no `%%`, `%(default)s` filled in)."""
    return p._get_formatter()._expand_help(a) if a.help else ""     # argparse has no public way


def _row(p: argparse.ArgumentParser, a: argparse.Action) -> str:
    if a.option_strings:
        takes = "" if a.nargs == 0 else " " + (
            " ".join(a.metavar) if isinstance(a.metavar, tuple) else a.metavar or a.dest.upper())
        name = ", ".join(f"`{s}{takes}`" for s in a.option_strings)
    else:
        name = f"`{a.metavar or a.dest}`"
    if a.choices and not isinstance(a.choices, dict):
        name += " (" + " \\| ".join(f"`{c}`" for c in a.choices) + ")"
    text = _help(p, a)
    if a.default not in (None, False, argparse.SUPPRESS) and "default" not in text:
        text += f" (default: `{a.default}`)"
    return f"| {name} | {_cell(text)} |"


def _groups(p: argparse.ArgumentParser, *, skip_global: bool) -> list[str]:
    out: list[str] = []
    for g in p._action_groups:                               # argparse has no public walk
        acts = [a for a in g._group_actions
                if not isinstance(a, (argparse._HelpAction, argparse._SubParsersAction))]
        if not acts or (skip_global and (g.title or "").startswith("global options")):
            continue
        out += [f"**{g.title[0].upper() + g.title[1:]}**", "", "| argument | meaning |", "|---|---|",
                *(_row(p, a) for a in acts), ""]
    return out


def _exits(command: str) -> list[str]:
    from testbed.cli import exits
    return ["**Exit statuses**", "", "| status | meaning |", "|---|---|",
            *(f"| {int(s)} | {_cell(words)} |" for s, words in exits.of(command)), ""]


def _description(p: argparse.ArgumentParser) -> list[str]:
    # the description's paragraphs, as written (the help formatter only wraps them)
    return [" ".join(para.split()) + "\n" for para in (p.description or "").strip().split("\n\n")]


def _walk(p: argparse.ArgumentParser, words: list[str], out: list[str]) -> None:
    subs = [a for a in p._actions if isinstance(a, argparse._SubParsersAction)]
    if words:
        out += [f"## `testbed {' '.join(words)}`", "", *_description(p),
                "```text", _usage(p), "```", "",
                *_groups(p, skip_global=True), *_exits(" ".join(words))]
    for s in subs:
        for name, child in s.choices.items():
            _walk(child, [*words, name], out)


def cli_markdown() -> str:
    from testbed import cli
    p = cli.parser()
    commands = [f"[`{n}`](#testbed-{n})" for n in
                next(a for a in p._actions if isinstance(a, argparse._SubParsersAction)).choices]
    out = ["# Command reference", "",
           "Generated from the argument parser of this version of `testbed`: `testbed --help` "
           "and `testbed COMMAND --help` print the same. The global options are accepted before "
           "or after the command (`testbed -v validate FILE` is `testbed validate FILE -v`).", "",
           "Commands: " + ", ".join(commands) + ".", "",
           "## `testbed`", "", *_description(p), "```text", _usage(p), "```", "",
           *_groups(p, skip_global=False),
           "The exit statuses of every command, and which commands return each, are "
           "[one table in Troubleshooting](../troubleshooting.md#exit-statuses); each command "
           "below lists its own.", ""]
    _walk(p, [], out)
    return "\n".join(out)


def exit_table() -> str:
    from testbed.cli import exits
    return exits.markdown_table()


def on_files(files, config):                               # noqa: ANN001 (MkDocs' hook signature)
    from mkdocs.structure.files import File
    files.append(File.generated(config, CLI_PAGE, content=cli_markdown()))
    return files


def on_page_markdown(markdown, page, config, files):       # noqa: ANN001
    return markdown.replace(EXIT_MARKER, exit_table()) if EXIT_MARKER in markdown else markdown


if __name__ == "__main__":
    print(cli_markdown())
