"""Hostile and careless input beyond topology files: run directories, output paths, numeric
arguments, the results store, image recipes and environment variables. Each case goes through
`testbed.cli.main` and must give exit 2 (or 3), one stderr line naming the file or argument,
no traceback, and nothing created or changed: device nodes, FIFOs and directories given as
outputs stay what they were."""
from __future__ import annotations

import json
import os
import re
import shutil
import stat
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from testbed import cli

pytestmark = pytest.mark.unit

RUN = Path(__file__).resolve().parent / "fixtures" / "runs" / "format2"
IMAGES = Path(__file__).resolve().parents[2] / "images"


def snapshot(root: Path) -> dict[str, tuple]:
    """Every path under ``root`` with its type, size and modification time."""
    out = {}
    for p in [root, *root.rglob("*")]:
        st_ = os.lstat(p)
        out[str(p)] = (stat.S_IFMT(st_.st_mode), st_.st_size, st_.st_mtime_ns, st_.st_ino)
    return out


def refused(capsys, args: list[str], names: str | None = None, statuses=(2,)) -> str:
    rc = cli.main(args)
    err = capsys.readouterr().err
    assert rc in statuses, (rc, err)
    lines = err.strip("\n").split("\n")
    assert len(lines) == 1, err
    assert "Traceback" not in err
    if names is not None:
        assert names in err, err
    return err


@pytest.fixture
def run(tmp_path) -> Path:
    d = tmp_path / "runs" / "r1"
    shutil.copytree(RUN, d)
    return d


def edit_line(path: Path, n: int, fn) -> None:
    lines = path.read_text().splitlines()
    lines[n] = fn(lines[n])
    path.write_text("\n".join(lines) + "\n")


def edit_sample(run: Path, n: int, fn) -> None:
    def change(line: str) -> str:
        d = json.loads(line)
        fn(d)
        return json.dumps(d)
    edit_line(run / "samples.jsonl", n, change)


# --------------------------------------------------------------------------- run directories

RUN_CASES = {
    "metrics as a list": lambda r: edit_sample(r, 1, lambda d: d.update(metrics=[1, 2])),
    "a 5000-digit integer": lambda r: edit_line(r / "samples.jsonl", 1,
                                                lambda l: re.sub(r'"rep": \d+', '"rep": ' + "9" * 5000, l)),
    "NaN in a metric": lambda r: edit_line(r / "samples.jsonl", 1,
                                           lambda l: re.sub(r'"throughput_mbps": [0-9.e+-]+',
                                                            '"throughput_mbps": NaN', l)),
    "Infinity": lambda r: edit_line(r / "samples.jsonl", 0,
                                    lambda l: re.sub(r'"rep": \d+', '"rep": Infinity', l)),
    "missing samples.jsonl": lambda r: (r / "samples.jsonl").unlink(),
    "truncated run.json": lambda r: (r / "run.json").write_text((r / "run.json").read_text()[:300]),
    "garbage in the middle": lambda r: edit_line(r / "samples.jsonl", 2, lambda l: "garbage{"),
    "format_version 99": lambda r: (r / "run.json").write_text(
        json.dumps({**json.loads((r / "run.json").read_text()), "format_version": 99})),
    "format_version as text": lambda r: (r / "run.json").write_text(
        json.dumps({**json.loads((r / "run.json").read_text()), "format_version": "2"})),
    "cells as a mapping": lambda r: (r / "run.json").write_text(
        json.dumps({**json.loads((r / "run.json").read_text()), "cells": {"a": 1}})),
    "run.json a list": lambda r: (r / "run.json").write_text("[1, 2, 3]"),
    "deep nesting": lambda r: (r / "run.json").write_text("[" * 50000 + "]" * 50000),
    "samples.jsonl a directory": lambda r: ((r / "samples.jsonl").unlink(), (r / "samples.jsonl").mkdir()),
    "samples.jsonl a FIFO": lambda r: ((r / "samples.jsonl").unlink(), os.mkfifo(r / "samples.jsonl")),
    "status neither ok nor failed": lambda r: edit_sample(r, 0, lambda d: d.update(status="maybe")),
    "a metric as text": lambda r: edit_sample(r, 0, lambda d: d["metrics"].update(throughput_mbps="fast")),
    "not UTF-8": lambda r: (r / "samples.jsonl").write_bytes(b"\xff\xfe" + b"{}\n"),
    # finite, yet no figure a sample holds: the statistics and the report overflowed on them
    "a metric near the float maximum": lambda r: edit_sample(r, 0, lambda d: d["metrics"].update(throughput_mbps=1.7e308)),
    "a denormal metric": lambda r: edit_sample(r, 0, lambda d: d["metrics"].update(throughput_mbps=5e-324)),
    "a negative metric": lambda r: edit_sample(r, 0, lambda d: d["metrics"].update(throughput_mbps=-1)),
    "negative host cores": lambda r: edit_sample(r, 0, lambda d: d.setdefault("cpu", {}).setdefault(
        "host", {}).update(busy=-3)),
    "negative counts": lambda r: (r / "run.json").write_text(json.dumps(
        {**json.loads((r / "run.json").read_text()), "counts": {"samples": -8, "failed": 0, "boots": 0}})),
    # a store's integer column holds 64 bits
    "a 30-digit count": lambda r: edit_line(r / "samples.jsonl", 1,
                                            lambda l: re.sub(r'"rep": \d+', '"rep": ' + "9" * 30, l)),
}


@pytest.mark.parametrize("case", sorted(RUN_CASES))
@pytest.mark.parametrize("command", ["export-csv", "compare", "report", "capacity", "index"])
def test_a_bad_run_is_refused_by_every_reader(capsys, tmp_path, run, case, command) -> None:
    RUN_CASES[case](run)
    before = snapshot(tmp_path)
    out = tmp_path / "out"
    args = {"export-csv": ["export-csv", str(run), "-o", str(out)],
            "compare": ["compare", str(run), str(RUN)],
            "report": ["report", str(run), "-o", str(out)],
            "capacity": ["capacity", str(run), "--profile", "stream:1gbit"],
            "index": ["index", str(run), "--db", str(tmp_path / "new.sqlite")]}[command]
    refused(capsys, args, names=str(run))
    assert snapshot(tmp_path) == before            # no output, and no store was created


def test_an_unterminated_last_line_is_a_torn_write_not_an_error(capsys, tmp_path, run) -> None:
    with open(run / "samples.jsonl", "a") as f:
        f.write('{"run_id": "x", "cel')
    assert cli.main(["export-csv", str(run), "-o", str(tmp_path / "o.csv")]) == 0
    assert len((tmp_path / "o.csv").read_text().splitlines()) == 1 + 8


# --------------------------------------------------------------------------- outputs

def special_files(tmp_path: Path) -> dict[str, str]:
    out = {"a directory": tmp_path / "adir", "a FIFO": tmp_path / "afifo"}
    out["a directory"].mkdir()
    os.mkfifo(out["a FIFO"])
    if os.geteuid() == 0:
        out["a character device"] = tmp_path / "null"
        os.mknod(out["a character device"], 0o666 | stat.S_IFCHR, os.makedev(1, 3))
    regular = tmp_path / "regular"
    regular.write_text("keep")
    out["under a regular file"] = regular / "x.csv"
    named = {k: str(v) for k, v in out.items()}
    named["an empty name"] = ""
    named["a trailing slash"] = str(tmp_path / "new") + "/"
    return named


@pytest.mark.parametrize("command", ["export-csv", "report-o", "report-csv", "compare-junit",
                                     "history-o"])
def test_outputs_that_are_not_regular_files_are_refused_before_any_work(capsys, tmp_path, command) -> None:
    for what, target in special_files(tmp_path).items():
        before = snapshot(tmp_path)
        t = target
        args, arg = {
            "export-csv": (["export-csv", str(RUN), "-o", t], "--output"),
            "report-o": (["report", str(RUN), "-o", t, "--csv", str(tmp_path / "ok.csv")], "--output"),
            "report-csv": (["report", str(RUN), "-o", str(tmp_path / "ok.html"), "--csv", t], "--csv"),
            "compare-junit": (["compare", str(RUN), str(RUN), "--junit", t], "--junit"),
            "history-o": (["history", "--db", str(tmp_path / "none.sqlite"), "-o", t], "--output"),
        }[command]
        refused(capsys, args, names=arg)
        assert snapshot(tmp_path) == before, what     # nothing replaced, nothing half-written


@pytest.mark.skipif(not Path("/dev/null").is_char_device(), reason="no /dev/null here")
def test_dev_null_and_dev_full_stay_devices(capsys, tmp_path) -> None:
    for dev in ("/dev/null", "/dev/full"):
        if not Path(dev).exists():
            continue
        ino = os.stat(dev).st_ino
        refused(capsys, ["export-csv", str(RUN), "-o", dev], names=dev)
        assert Path(dev).is_char_device() and os.stat(dev).st_ino == ino


def test_a_regular_output_is_written_and_a_symlink_to_one_written_through(capsys, tmp_path) -> None:
    real = tmp_path / "real.csv"
    real.write_text("old")
    link = tmp_path / "link.csv"
    link.symlink_to(real)
    assert cli.main(["export-csv", str(RUN), "-o", str(link)]) == 0
    assert link.is_symlink() and real.read_text().startswith("run_id") or "," in real.read_text()


# --------------------------------------------------------------------------- numbers

NUMBERS = [
    (["compare", str(RUN), str(RUN), "--min-samples", "0"], "--min-samples"),
    (["compare", str(RUN), str(RUN), "--min-samples", "1"], "--min-samples"),
    (["compare", str(RUN), str(RUN), "--threshold", "nan"], "--threshold"),
    (["compare", str(RUN), str(RUN), "--fdr", "-0.1"], "--fdr"),
    (["capacity", str(RUN), "--profile", "stream:1gbit", "--host-cores", "inf"], "--host-cores"),
    (["capacity", str(RUN), "--profile", "stream:1gbit", "--link-gbit", "nan"], "--link-gbit"),
    (["capacity", str(RUN), "--profile", "stream:1gbit", "--memory-mib", "-1024"], "--memory-mib"),
    (["capacity", str(RUN), "--profile", "stream:1gbit", "--mtu", "0"], "--mtu"),
    (["capacity", str(RUN), "--profile", "stream:1gbit", "--overcommit", "1e999"], "--overcommit"),
    (["capacity", str(RUN), "--profile", "stream:1gbit", "--headroom", "1"], "--headroom"),
    (["capacity", str(RUN), "--profile", "stream:1gbit", "--connections", "9" * 50], "--connections"),
    (["bench", "boot", "--rounds", "0"], "--rounds"),
]


@pytest.mark.parametrize("args,arg", NUMBERS, ids=[f"{a[0]}{a[-2]}={a[-1][:8]}" for a, _ in NUMBERS])
def test_numbers_are_refused_at_the_parser_naming_the_argument(capsys, args, arg) -> None:
    with pytest.raises(SystemExit) as e:
        cli.main(args)
    err = capsys.readouterr().err
    assert e.value.code == 2 and arg in err and len(err.strip().splitlines()) == 1, err


# --------------------------------------------------------------------------- the store

def store_files(tmp_path: Path) -> dict[str, Path]:
    out = {}
    (p := tmp_path / "empty.sqlite").write_bytes(b"")
    out["an empty file"] = p
    (p := tmp_path / "text.sqlite").write_text("hello\n")
    out["a text file"] = p
    (p := tmp_path / "random.sqlite").write_bytes(os.urandom(4096))
    out["random bytes"] = p
    (p := tmp_path / "corrupt.sqlite").write_bytes(b"SQLite format 3\x00" + os.urandom(4000))
    out["a corrupt SQLite file"] = p
    # Version bytes that say WAL: SQLite opens -wal and -shm for these before it reads.
    (p := tmp_path / "walbytes.sqlite").write_bytes(b"SQLite format 3\x00" + os.urandom(2)
                                                    + b"\x02\x02" + os.urandom(4000))
    out["a corrupt SQLite file whose version bytes say WAL"] = p
    import sqlite3
    (p := tmp_path / "walhead.sqlite").write_bytes(
        b"SQLite format 3\x00\x10\x00\x02\x02\x00\x40\x20\x20" + os.urandom(4072))
    out["a WAL header over random pages"] = p
    p = tmp_path / "foreign.sqlite"
    with sqlite3.connect(p) as c:
        c.execute("CREATE TABLE other (x)")
    out["another application's database"] = p
    p = tmp_path / "foreignwal.sqlite"
    c = sqlite3.connect(p)
    c.execute("PRAGMA journal_mode = WAL")
    c.execute("CREATE TABLE other (x)")
    c.commit()
    c.close()
    out["another application's WAL database"] = p
    out["a missing file"] = tmp_path / "missing.sqlite"
    out["a directory"] = tmp_path
    return out


def test_a_read_never_creates_or_changes_a_store(capsys, tmp_path) -> None:
    for what, db in store_files(tmp_path).items():
        before = snapshot(tmp_path)
        refused(capsys, ["history", "--db", str(db)], names=str(db))
        assert snapshot(tmp_path) == before, what


def test_a_newer_store_is_refused(capsys, tmp_path, run) -> None:
    import sqlite3
    db = tmp_path / "idx.sqlite"
    assert cli.main(["index", str(run), "--db", str(db)]) == 0
    with sqlite3.connect(db) as c:
        c.execute("INSERT INTO schema_version VALUES (999, 'future', 'x')")
    capsys.readouterr()
    refused(capsys, ["history", "--db", str(db)], names="newer")


def test_history_without_a_store_creates_nothing(capsys, tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("TESTBED_RESULTS", str(tmp_path / "nowhere"))
    refused(capsys, ["history"], names="index")
    assert not (tmp_path / "nowhere").exists()


def test_an_unknown_metric_is_named(capsys, tmp_path, run) -> None:
    db = tmp_path / "idx.sqlite"
    assert cli.main(["index", str(run), "--db", str(db)]) == 0
    capsys.readouterr()
    err = refused(capsys, ["history", "--db", str(db), "--metric", "bogus"], names="--metric")
    assert "throughput_mbps" in err


# --------------------------------------------------------------------------- environment

@pytest.mark.parametrize("var", ["TESTBED_RESULTS", "TESTBED_STATE", "TESTBED_CACHE"])
def test_environment_folders_must_be_folders(capsys, tmp_path, monkeypatch, var) -> None:
    f = tmp_path / "file"
    f.write_text("x")
    monkeypatch.setenv(var, str(f))
    before = snapshot(tmp_path)
    refused(capsys, ["export-csv", str(RUN), "-o", str(tmp_path / "o.csv")], names=var)
    assert snapshot(tmp_path) == before


@pytest.mark.parametrize("value", ["yes", "2", " true"])
def test_shared_host_variable_is_0_or_1(capsys, tmp_path, monkeypatch, value) -> None:
    monkeypatch.setenv("TESTBED_SHARED_HOST", value)
    before = snapshot(tmp_path)
    err = refused(capsys, ["export-csv", str(RUN), "-o", str(tmp_path / "o.csv")], names="TESTBED_SHARED_HOST")
    assert "expected 0 or 1" in err
    assert snapshot(tmp_path) == before


def test_results_option_must_be_a_folder(capsys, tmp_path) -> None:
    f = tmp_path / "file"
    f.write_text("x")
    refused(capsys, ["--results", str(f), "export-csv", str(RUN)], names="--results")


def test_a_newline_in_a_run_argument_stays_one_line(capsys, tmp_path) -> None:
    refused(capsys, ["export-csv", "no\nsuch\nrun", "-o", str(tmp_path / "o")])


# --------------------------------------------------------------------------- image recipes

def recipe(tmp_path: Path, edit) -> Path:
    d = tmp_path / "rec"
    shutil.copytree(IMAGES / "debian12", d)
    edit(d)
    return d


def sub(old: str, new: str):
    def edit(d: Path) -> None:
        f = d / "recipe.yaml"
        f.write_text(f.read_text().replace(old, new))
    return edit


RECIPES = {
    "missing customize.sh": (lambda d: (d / "customize.sh").unlink(), "customize.sh"),
    "customize.sh a link out": (lambda d: ((d / "customize.sh").unlink(),
                                           (d / "customize.sh").symlink_to("/bin/true")), "customize.sh"),
    "hostile package name": (sub("  - netperf", '  - "netperf; rm -rf /"'), "packages"),
    "package option": (sub("  - netperf", "  - --allow-unauthenticated"), "packages"),
    "100 ZB disk": (sub("disk_size: 2G", "disk_size: 100000000000000000000000G"), "disk_size"),
    "disk in petabytes": (sub("disk_size: 2G", "disk_size: 900000G"), "disk_size"),
    "name escapes the cache": (sub("name: debian12", "name: ../../escaped"), "name"),
    "invalid YAML": (lambda d: (d / "recipe.yaml").write_text("name: [x\n"), "yaml"),
    "a YAML tag": (sub("name: debian12", "name: !!python/object:os.system x"), "name"),
    "mirror not http": (sub("mirror: http://deb.debian.org/debian", "mirror: file:///etc"), "mirror"),
    "unknown key": (lambda d: (d / "recipe.yaml").write_text((d / "recipe.yaml").read_text() + "hook: x\n"),
                    "hook"),
    "source out of the folder": (lambda d: (d / "recipe.yaml").write_text(
        "name: x\nbase: debian12\nsource_tools:\n  - {name: x, source: ../../../etc, build: make}\n"),
        "source_tools[0].source"),
    "recipe a directory": (lambda d: ((d / "recipe.yaml").unlink(), (d / "recipe.yaml").mkdir()), "recipe.yaml"),
}


@pytest.mark.parametrize("case", sorted(RECIPES))
def test_bad_recipes_are_refused_before_any_build(capsys, tmp_path, monkeypatch, case) -> None:
    edit, field = RECIPES[case]
    d = recipe(tmp_path, edit)
    monkeypatch.setenv("TESTBED_CACHE", str(tmp_path / "cache"))
    before = snapshot(tmp_path)
    refused(capsys, ["image", str(d)], names=field)
    assert snapshot(tmp_path) == before and not (tmp_path / "cache").exists()


def test_a_recipe_name_from_the_environment_is_checked(capsys, monkeypatch) -> None:
    monkeypatch.setenv("TESTBED_IMAGE", "../../x")
    refused(capsys, ["image"], names="../../x")


# --------------------------------------------------------------------------- the fuzzer

FUZZ = int(os.environ.get("TESTBED_FUZZ_EXAMPLES", "120"))
_lines = (RUN / "samples.jsonl").read_text().splitlines()
_json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12)


@st.composite
def mutated_line(draw) -> tuple[str, str]:
    """One mutation of run.json or a samples.jsonl line: a field's value replaced by any JSON
    value (NaN and infinities included), a key dropped, bytes cut, or raw text spliced in."""
    which = draw(st.sampled_from(["sample", "run"]))
    doc = json.loads(_lines[draw(st.integers(0, len(_lines) - 1))]) if which == "sample" \
        else json.loads((RUN / "run.json").read_text())
    kind = draw(st.sampled_from(["replace", "nested", "drop", "cut", "splice"]))
    keys = sorted(doc)
    key = draw(st.sampled_from(keys))
    if kind == "replace":
        doc[key] = draw(_json_values)
        text = json.dumps(doc)
    elif kind == "nested" and isinstance(doc[key], dict) and doc[key]:
        k2 = draw(st.sampled_from(sorted(doc[key])))
        doc[key][k2] = draw(_json_values)
        text = json.dumps(doc)
    elif kind == "drop":
        doc.pop(key)
        text = json.dumps(doc)
    else:
        text = json.dumps(doc)
        at = draw(st.integers(0, len(text)))
        text = text[:at] if kind == "cut" else text[:at] + draw(st.text(max_size=10)) + text[at:]
    return which, text


@settings(max_examples=FUZZ, deadline=None, suppress_health_check=list(HealthCheck))
@given(m=mutated_line(), command=st.sampled_from(["export-csv", "compare", "capacity"]))
def test_fuzzed_runs_are_read_or_refused_never_crash(tmp_path_factory, m, command) -> None:
    tmp = tmp_path_factory.mktemp("fz")
    run = tmp / "r"
    shutil.copytree(RUN, run)
    which, text = m
    if which == "run":
        (run / "run.json").write_text(text)
    else:
        lines = _lines.copy()
        lines[1] = text
        (run / "samples.jsonl").write_text("\n".join(lines) + "\n")
    import contextlib
    import io
    err, out = io.StringIO(), io.StringIO()
    args = {"export-csv": ["export-csv", str(run), "-o", str(tmp / "o.csv")],
            "compare": ["compare", str(run), str(RUN)],
            "capacity": ["capacity", str(run), "--profile", "stream:1gbit"]}[command]
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
        try:
            rc = cli.main(args)
        except SystemExit as e:          # argparse; cannot happen for these argv
            rc = e.code
    text_err = err.getvalue()
    assert "Traceback" not in text_err
    if rc not in (0, 1, 5):
        assert rc in (2, 3), (rc, text_err)
        assert len(text_err.strip().splitlines()) == 1, text_err


@pytest.mark.parametrize("db", ["/etc/hostname", "/tmp", "/dev/null"])
def test_run_refuses_a_bad_store_before_measuring(capsys, tmp_path, db) -> None:
    topo = tmp_path / "t.yaml"
    topo.write_text("matrix: {attachments: [netns-veth], profiles: [{name: s, pattern: stream, duration: 1}]}\n")
    refused(capsys, ["run", str(topo), "--db", db], names=db)


def test_cleanup_uri_is_checked(capsys) -> None:
    refused(capsys, ["cleanup", "--uri", "x\ny"], names="--uri")
