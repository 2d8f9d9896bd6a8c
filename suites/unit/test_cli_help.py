"""The command line's conventions, held for every subcommand the parser has (a new one is
checked without being listed here): a description, help on every option, the same metavar
for the same option, global options before or after the command, and `--help` ending with
the command's exit statuses, which come from the one list (testbed.errors.ExitStatus) that
every error class maps to. And the `./tb` wrapper sets nothing up for a command that reads."""
from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from testbed import cli, errors
from testbed.cli import exits
from testbed.errors import ExitStatus

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]


def commands(p: argparse.ArgumentParser | None = None, words: tuple[str, ...] = ()):
    """(words, parser) of every command and subcommand."""
    p = p or cli.parser()
    for a in p._actions:                                  # argparse has no public walk
        if isinstance(a, argparse._SubParsersAction):
            for name, child in a.choices.items():
                yield (*words, name), child
                yield from commands(child, (*words, name))


def test_every_command_has_a_description_help_on_every_option_and_its_exit_statuses():
    seen = list(commands())
    assert len(seen) >= 17
    for words, p in seen:
        what = "testbed " + " ".join(words)
        assert p.description and len(p.description) > 20, what
        assert p.epilog == exits.epilog(" ".join(words)), what
        for a in p._actions:
            if not isinstance(a, argparse._HelpAction):
                assert a.help and a.help.strip(), f"{what}: {a.option_strings or a.dest} has no help"


def test_the_same_option_takes_the_same_metavar_everywhere():
    metavars: dict[str, set] = {}
    for _, p in commands():
        for a in p._actions:
            if a.option_strings and a.nargs != 0 and not a.choices:
                for o in a.option_strings:
                    metavars.setdefault(o, set()).add(a.metavar if not isinstance(a.metavar, tuple) else a.metavar)
    mixed = {o: m for o, m in metavars.items() if len(m) > 1}
    assert not mixed, mixed
    assert metavars["--db"] == {"PATH|URL"} and metavars["--results"] == {"DIR"}


@pytest.mark.parametrize("words", [w for w, _ in commands()], ids=" ".join)
def test_help_ends_with_the_exit_statuses(words, capsys):
    with pytest.raises(SystemExit) as e:
        cli.main([*words, "--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    tail = out[out.rindex("exit statuses:"):]
    listed = [int(m) for m in re.findall(r"^  (\d+) ", tail, re.M)]
    assert listed == [int(s) for s, _ in exits.of(" ".join(words))] and listed[0] == 0
    assert {ExitStatus.BAD_INPUT, ExitStatus.INTERRUPTED} <= set(listed), words
    assert "%%" not in out and "%(" not in out


def test_top_level_help_lists_every_status_and_speaks_to_users(capsys):
    with pytest.raises(SystemExit):
        cli.main(["--help"])
    out = capsys.readouterr().out
    assert "thin front" not in out and "Measure VM-to-VM networking" in out
    assert [int(m) for m in re.findall(r"^  (\d+) ", out[out.rindex("exit statuses:"):], re.M)] == \
        [int(s) for s in ExitStatus]


def _error_classes(cls=errors.TestbedError):
    for sub in cls.__subclasses__():
        yield sub
        yield from _error_classes(sub)


def test_every_error_exits_with_a_listed_status():
    import pkgutil
    import importlib
    import testbed
    for m in pkgutil.walk_packages(testbed.__path__, "testbed."):
        if not m.name.endswith("__main__"):
            importlib.import_module(m.name)
    found = {c.__qualname__: c.exit_status for c in _error_classes()}
    assert len(found) > 15
    assert all(s in set(ExitStatus) for s in found.values()), found
    # and every status but success and the fleet's is some error's (or the gate's) to give
    used = set(found.values()) | {ExitStatus.UNDECIDED, ExitStatus.INTERRUPTED}
    assert set(ExitStatus) - used <= {ExitStatus.OK, ExitStatus.SOME_HOSTS_FAILED, ExitStatus.NO_HOST_DONE}


def test_global_options_work_before_or_after_the_command(tmp_path, capsys):
    topo = ROOT / "examples" / "variants" / "nic-rings.yaml"
    for argv in (["-v", "validate", str(topo)], ["validate", str(topo), "-v"],
                 ["validate", "-v", str(topo)]):
        assert cli.main(argv) == 0, argv
        assert "ok (" in capsys.readouterr().out
    a = cli.parser().parse_args(["--results", "/a", "report", "r"])
    b = cli.parser().parse_args(["report", "r", "--results", "/a"])
    assert a.results_root == b.results_root == "/a" and a.runs == b.runs
    # given twice, the later one wins, as for any option
    assert cli.parser().parse_args(["--results", "/a", "index", "--results", "/b"]).results_root == "/b"
    assert cli.parser().parse_args(["fleet", "report", "F", "--shared-host"]).shared_host is True


# --------------------------------------------------------------------------- ./tb

def _wrapper(tmp_path: Path) -> Path:
    """The real ./tb in a folder whose setup step and testbed command only say they ran."""
    (tmp_path / "scripts").mkdir()
    (tmp_path / ".venv" / "bin").mkdir(parents=True)
    shutil.copy(ROOT / "tb", tmp_path / "tb")
    for path, word in (("scripts/setup-host", "SETUP"), (".venv/bin/testbed", "TESTBED")):
        f = tmp_path / path
        f.write_text(f'#!/bin/sh\necho {word} "$@"\n')
        f.chmod(0o755)
    return tmp_path / "tb"


@pytest.mark.parametrize("argv,sets_up", [
    (["validate", "t.yaml"], False), (["report", "RUN"], False), (["compare", "A", "B"], False),
    (["doctor", "--help"], False), (["run", "--help"], False), (["-v", "history"], False),
    (["scenario", "list"], False), (["fleet", "report", "F"], False), (["--version"], False),
    (["run"], True), (["--results", "/r", "run", "t.yaml"], True), (["image"], True),
    (["bench", "boot"], True), (["scenario", "run", "a"], True), ([], True)])
def test_the_wrapper_sets_up_only_for_commands_that_measure_or_build(tmp_path, argv, sets_up):
    tb = _wrapper(tmp_path)
    p = subprocess.run(["bash", str(tb), *argv], capture_output=True, text=True, timeout=30)
    assert p.returncode == 0, p.stderr
    assert ("SETUP" in p.stdout) == sets_up, p.stdout
    assert p.stdout.strip().splitlines()[-1] == " ".join(["TESTBED", *(argv or ["run"])])


def test_the_wrapper_says_to_set_up_first_when_nothing_is_installed(tmp_path):
    tb = _wrapper(tmp_path)
    os.remove(tmp_path / ".venv" / "bin" / "testbed")
    p = subprocess.run(["bash", str(tb), "validate", "t.yaml"], capture_output=True, text=True, timeout=30)
    assert p.returncode == ExitStatus.MISSING_CAPABILITY and "SETUP" not in p.stdout
    assert "./tb setup" in p.stderr
