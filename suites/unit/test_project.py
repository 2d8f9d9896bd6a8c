"""The repository is a whole project on its own: its docs build, the README is a front page,
nothing reads outside the clone, every topology key is documented, and the unit tier needs no
libvirt-python."""
from __future__ import annotations

import ast
import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from testbed import __version__, cli

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
#: what a user reads or runs: none of it may cite the project's internal issue numbers
PUBLIC = ("README.md", "CHANGELOG.md", "docs", "testbed", "suites", "examples", "scripts", "tb",
          ".ci", "templates", "images")
TEXT = {".md", ".py", ".yaml", ".yml", ".j2", ".sh", ".toml", ".ini", ".cfg", ""}


def public_files():
    for name in PUBLIC:
        p = ROOT / name
        if p.is_file():
            yield p
            continue
        for f in p.rglob("*") if p.is_dir() else ():
            if f.is_file() and f.suffix in TEXT and "fixtures" not in f.parts \
                    and "__pycache__" not in f.parts:
                yield f


def test_readme_is_a_front_page():
    text = (ROOT / "README.md").read_text()
    assert len(text.encode()) <= 12 * 1024
    for link in re.findall(r"\]\((docs/[^)#]+)", text):
        assert (ROOT / link).is_file(), link


def test_readme_shows_a_run_as_this_version_prints_it():
    """"What a run prints" is `./tb run`'s own output (scripts/refresh-readme writes it): its
    lines have the shape this version prints, its status line adds up, and the README says
    which accelerator made it (TCG figures are functional checks)."""
    block = text_between((ROOT / "README.md").read_text(), "<!-- run-output:start -->", "<!-- run-output:end -->")
    out = re.search(r"```text\n(.*?)```", block, re.S).group(1).splitlines()
    head = next(m for line in out if (m := re.fullmatch(r"run \S+: (\d+) cells, accelerator (\w+).*", line)))
    cells, accel = int(head.group(1)), head.group(2)
    assert [int(m.group(1)) for line in out if (m := re.match(r"\[(\d+)/%d\] " % cells, line))] == \
        list(range(1, cells + 1))
    status = next(m for line in out if (m := re.fullmatch(
        r"status: (complete|complete-with-failures), (\d+) samples: (\d+) ok, (\d+) failed"
        r"(?:, (\d+) retried \(host busy\))?(?:, (\d+) kept noisy)?", line)))
    n, ok, failed, retried = (int(status.group(i) or 0) for i in (2, 3, 4, 5))
    assert n == ok + failed + retried and ok + failed >= cells
    assert out[-1].startswith("results/") and out[-2] == out[-1] + "/report.html"
    if accel == "tcg":
        assert "TCG" in block and "functional" in block
    assert "docs/img/report.png" in block and (ROOT / "docs/img/report.png").is_file()


def text_between(text: str, start: str, end: str) -> str:
    return text[text.index(start) + len(start):text.index(end)]


def test_no_internal_issue_numbers():
    hits = [f"{f.relative_to(ROOT)}:{n}" for f in public_files()
            for n, line in enumerate(f.read_text(errors="replace").splitlines(), 1)
            if re.search(r"\bissues? ?#?\d+\b", line, re.IGNORECASE)
            and f.name != "test_project.py"]
    assert not hits, hits


def test_nothing_reads_outside_the_clone():
    """A public clone has no folder beside it: no test, script or CI step may reach one."""
    pattern = re.compile(r"\.\./shared|parents\[3\]\s*/\s*[\"']shared")
    hits = [str(f.relative_to(ROOT)) for f in public_files()
            if f.name != "test_project.py" and pattern.search(f.read_text(errors="replace"))]
    assert not hits, hits


def test_recorded_fixtures_have_their_sources():
    for folder in (ROOT / "suites/unit/fixtures").iterdir():
        recordings = [f for f in folder.rglob("*") if f.is_file() and f.name != "SOURCES.md"]
        if folder.is_dir() and folder.name not in ("runs",) and recordings:
            sources = folder / "SOURCES.md"
            assert sources.is_file(), f"{folder} has no SOURCES.md"
            text = sources.read_text()
            for f in recordings:
                # each file (or its family, e.g. netperf_real_*) is named in SOURCES.md
                # named whole, or by a pattern such as `<profile>-conn<N>.client.out` or
                # netperf/netperf_real_*.txt
                patterns = [re.escape(t).replace(re.escape("*"), ".*")
                            for t in re.findall(r"[\w./{},<>*-]+", text)]
                patterns = [re.sub(r"\\<[^>]*\\>|<[^>]*>", ".+", t) for t in patterns]
                rel = str(f.relative_to(folder))
                assert f.name in text or any(re.fullmatch(t, f.name) or re.fullmatch(t, rel)
                                             for t in patterns), f"{f} not in {sources}"


def _accepted_keys() -> set[str]:
    """Every key the topology loader accepts: the literal sets its `.mapping(...)` calls take."""
    keys: set[str] = set()
    for src in [ROOT / "testbed/topology/config.py", ROOT / "testbed/topology/config_placement.py",
                *(ROOT / "testbed/attachments").glob("*.py")]:
        tree = ast.parse(src.read_text())
        consts = {t.id: n.value for n in ast.walk(tree) if isinstance(n, ast.Assign)
                  for t in n.targets if isinstance(t, ast.Name)}
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "mapping" and node.args:
                arg = node.args[0]
                if isinstance(arg, ast.Name):
                    arg = consts.get(arg.id, arg)
                if isinstance(arg, ast.Set):
                    keys |= {e.value for e in arg.elts if isinstance(e, ast.Constant)}
    return keys


def test_every_topology_key_is_documented():
    # the topology page and the pages it points to for a feature's own block
    page = "".join((ROOT / "docs" / f).read_text() for f in (
        "topology.md", "two-hosts.md", "nightly.md", "placement.md", "service-levels.md"))
    keys = _accepted_keys()
    assert {"matrix", "profiles", "mtus", "guests"} <= keys      # the extraction works
    missing = sorted(k for k in keys if not re.search(rf"\b{re.escape(k)}\b", page))
    assert not missing, f"topology keys not described in the docs: {missing}"


def test_version(capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(["--version"])
    assert e.value.code == 0
    assert capsys.readouterr().out.strip() == f"testbed {__version__}"


def test_no_module_needs_libvirt_at_import():
    """With libvirt-python made unimportable, every module of the package still imports: the
    unit tier runs as an unprivileged user in a venv without it."""
    code = ("import sys, pkgutil, importlib, testbed\n"
            "sys.modules['libvirt'] = None; sys.modules['libvirt_qemu'] = None\n"
            "bad = []\n"
            "for m in pkgutil.walk_packages(testbed.__path__, 'testbed.'):\n"
            "    if m.name.endswith('__main__'): continue\n"
            "    try: importlib.import_module(m.name)\n"
            "    except ImportError as e: bad.append(f'{m.name}: {e}')\n"
            "print('\\n'.join(bad)); sys.exit(1 if bad else 0)\n")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                       env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert p.returncode == 0, p.stdout + p.stderr[-2000:]


@pytest.mark.parametrize("argv", [["compare", "tb-no-such-run", "tb-nor-this"],
                                  ["capacity", "tb-no-such-run", "--profile", "x"],
                                  ["report", "tb-no-such-run", "-o", "r.html"]])
def test_a_result_command_refuses_a_missing_run_before_it_imports_scipy(argv, tmp_path):
    """scipy takes about half a second to import: a result command given a run that is not
    there says so before any statistics module pulls it in."""
    code = ("import sys\nfrom testbed.cli import main\n"
            "try:\n    rc = main(sys.argv[1:])\nexcept SystemExit as e:\n    rc = e.code\n"
            "print('scipy' if any(m == 'scipy' or m.startswith('scipy.') for m in sys.modules) else 'no scipy')\n"
            "sys.exit(rc)\n")
    p = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True, timeout=120,
                       cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert p.returncode != 0 and "tb-no-such-run" in p.stderr and "Traceback" not in p.stderr, p.stderr
    assert p.stdout.strip().splitlines()[-1] == "no scipy", p.stdout


def test_test_modules_have_unique_names():
    """The suites are folders without __init__.py, so pytest imports test modules by their
    base name: two files of one name in different tiers fail collection of the whole suite."""
    names = [p.name for p in (ROOT / "suites").rglob("test_*.py")]
    assert sorted(n for n in set(names) if names.count(n) > 1) == []


def test_unit_tier_files_touch_nothing_on_the_host():
    """`./tb test` runs the unit tier on one worker beside the root tiers and schedules by
    folder: a test that makes host objects (a root tier's marker, the namespace pair) filed
    under suites/unit would run beside them and change the host snapshot they are checked by."""
    root_marks = re.compile(r"pytest\.mark\.(netns|vm|store|scenarios)\b|\bnetns_pair\b")
    offenders = [f"{p.name}:{n}" for p in sorted((ROOT / "suites" / "unit").glob("test_*.py"))
                 if p.name != "test_project.py"
                 for n, line in enumerate(p.read_text().splitlines(), 1) if root_marks.search(line)]
    assert not offenders, offenders
