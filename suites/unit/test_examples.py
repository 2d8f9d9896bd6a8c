"""The worked examples under examples/: every topology file validates, every folder explains
itself, the pytest example collects the ids its --attach asks for, and the nightly job's
files are well formed. (The examples run for real in the netns, store and vm tiers.)"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

import testbed
from testbed import cli

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
FOLDERS = ("pytest-per-mode", "nightly", "capacity", "two-hosts", "variants", "hops")
TOPOLOGIES = sorted(EXAMPLES.rglob("*.yaml"))


def test_every_use_has_a_folder_with_a_readme_and_an_entry_in_the_docs():
    assert {p.name for p in EXAMPLES.iterdir() if p.is_dir()} >= set(FOLDERS)
    assert not list(EXAMPLES.glob("*.yaml")), "topology files live in their example's folder"
    index = (ROOT / "docs" / "examples.md").read_text()
    for name in FOLDERS:
        readme = (EXAMPLES / name / "README.md").read_text()
        assert len(readme) > 800, name
        assert f"examples/{name}/" in index, name


@pytest.mark.parametrize("path", TOPOLOGIES, ids=lambda p: str(p.relative_to(EXAMPLES)))
def test_example_topology_validates(path, capsys):
    assert cli.main(["validate", str(path)]) == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    assert out.startswith(f"{path}: ok (") and " 0 cells" not in out, out


def test_there_are_topologies_for_each_use():
    names = {str(p.relative_to(EXAMPLES)) for p in TOPOLOGIES}
    assert {"two-hosts/emulated.yaml", "two-hosts/ssh.yaml", "variants/nic-rings.yaml",
            "nightly/gate.yaml", "nightly/gate-ab.yaml", "capacity/density.yaml"} <= names


# --------------------------------------------------------------------------- pytest-per-mode

def _collect(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    """The example copied into a team's repository (a tests/ folder of its own, outside this
    project), collected there by pytest with the testbed plugin from its entry point."""
    team = tmp_path / "team"
    if not team.exists():
        shutil.copytree(EXAMPLES / "pytest-per-mode", team / "tests", ignore=shutil.ignore_patterns("*.md"))
    env = {**os.environ, "PYTHONPATH": str(Path(testbed.__file__).parent.parent)}
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--collect-only", "-q",
                           "tests", *args], capture_output=True, text=True, timeout=120, cwd=team, env=env)


def _ids(p: subprocess.CompletedProcess) -> list[str]:
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    return [line.split("::", 1)[1] for line in p.stdout.splitlines() if "::" in line]


def test_pytest_example_collects_the_modes_attach_names(tmp_path):
    assert _ids(_collect(tmp_path, "--attach", "bridge")) == [
        "test_mode[bridge-qemu-mtu1500-conn1-tcp_stream]", "test_mode[bridge-qemu-mtu1500-conn1-tcp_rr]"]
    assert _ids(_collect(tmp_path, "--attach", "netns")) == [
        "test_mode[netns-veth-qemu-mtu1500-conn1-tcp_stream]",
        "test_mode[netns-veth-qemu-mtu1500-conn1-tcp_rr]"]
    both = _ids(_collect(tmp_path, "--attach", "ovs,netns"))
    assert [i.split("[")[1].split("-")[0] for i in both] == ["ovs", "ovs", "netns", "netns"], both
    every = _ids(_collect(tmp_path))                     # the plugin's default: all
    assert {i.split("[")[1].split("-qemu")[0] for i in every} == {"bridge", "ovs", "macvtap", "netns-veth"}
    assert len(every) == 8
    assert _ids(_collect(tmp_path, "-k", "macvtap and tcp_rr")) == ["test_mode[macvtap-qemu-mtu1500-conn1-tcp_rr]"]


def test_pytest_example_refuses_an_unknown_mode(tmp_path):
    p = _collect(tmp_path, "--attach", "brigde")
    assert p.returncode == 4            # pytest's usage error: nothing collected, nothing created
    assert "--attach brigde: expected a comma list of all, bridge," in p.stderr
    assert "Traceback" not in p.stdout + p.stderr


def test_pytest_example_uses_the_public_surface_only():
    # a team copies one short file: no conftest, no import of the package's internals
    files = sorted(p.name for p in (EXAMPLES / "pytest-per-mode").iterdir())
    assert files == ["README.md", "test_modes.py"], files
    text = (EXAMPLES / "pytest-per-mode" / "test_modes.py").read_text()
    assert "import testbed." not in text and "from testbed." not in text
    assert len(text.splitlines()) <= 30


def test_the_readme_and_the_pytest_page_show_the_example_as_it_is_shipped():
    """The snippet a newcomer reads is the file they copy: every line of it, in order, is a
    line of examples/pytest-per-mode/test_modes.py (so ids and cell counts said beside it hold)."""
    shipped = (EXAMPLES / "pytest-per-mode" / "test_modes.py").read_text().splitlines()
    for page in (ROOT / "README.md", ROOT / "docs" / "tests.md"):
        blocks = re.findall(r"```python\n(.*?)```", page.read_text(), re.S)
        [block] = [b for b in blocks if "@pytest.mark.testbed(" in b]
        lines = block.splitlines()
        lines = lines[next(i for i, x in enumerate(lines) if x.startswith("@pytest.mark.testbed(")):]
        start = shipped.index(lines[0])
        assert lines == shipped[start:start + len(lines)], (page.name, lines)


def test_pytest_describes_every_testbed_option_fixture_and_marker(tmp_path):
    """What a team sees: --help groups the options under the testbed's name, --fixtures and
    --markers describe each of the plugin's fixtures and markers."""
    def run(*args: str) -> str:
        _collect(tmp_path)       # the team folder
        env = {**os.environ, "PYTHONPATH": str(Path(testbed.__file__).parent.parent)}
        p = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *args, "tests"],
                           capture_output=True, text=True, timeout=120, cwd=tmp_path / "team", env=env)
        assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
        return p.stdout
    helptext = run("--help")
    group = helptext.split("testbed (VM-to-VM networking per attachment mode):", 1)[1].split("\n\n", 1)[0]
    for opt in ("--attach=MODES", "--tb-accelerator", "--results=DIR"):
        assert opt in group, group
    assert "--tb-store-durations" not in helptext        # the project's own suite only
    fixtures = run("--fixtures")
    for name in ("testbed_cell", "testbed_run", "testbed_guests", "testbed_accelerator"):
        m = re.search(rf"^{name}( \[[a-z ]+\])? -- .*\n    (\S.*)$", fixtures, re.M)
        assert m and len(m.group(2)) > 30, (name, fixtures[-3000:])
    markers = run("--markers")
    for mark in ("@pytest.mark.testbed(", "@pytest.mark.testbed_floor(", "@pytest.mark.attach("):
        assert mark in markers, mark


# --------------------------------------------------------------------------- nightly

def test_nightly_script_parses_and_the_pipeline_runs_it_with_5_as_a_warning():
    script = EXAMPLES / "nightly" / "nightly.sh"
    assert os.access(script, os.X_OK)
    subprocess.run(["bash", "-n", str(script)], check=True, timeout=30)
    ci = yaml.safe_load((EXAMPLES / "nightly" / ".gitlab-ci.yml").read_text())
    job = ci["nightly-gate"]
    assert job["script"] == ["examples/nightly/nightly.sh"]
    assert job["allow_failure"] == {"exit_codes": [5]}
    assert job["artifacts"]["reports"]["junit"] == "nightly-out/compare.xml"
    assert job["variables"]["NIGHTLY_OUT"].endswith("/nightly-out")
    # every status the script can end with is handled in its one decide() case statement
    text = script.read_text()
    assert text.count("case \"$1:$2\" in") == 1
    for status in ("echo 0 ", "echo 1 ", "echo 5 ", "echo 2 "):
        assert status in text


def test_nightly_script_refuses_an_unknown_mode(tmp_path):
    p = subprocess.run(["bash", str(EXAMPLES / "nightly" / "nightly.sh")], capture_output=True, text=True,
                       timeout=30, cwd=tmp_path, env={**os.environ, "NIGHTLY_MODE": "nightly"})
    assert p.returncode == 2
    assert p.stderr.strip() == "nightly: NIGHTLY_MODE=nightly: expected baseline or variants"
