"""The pytest plugin's markers as a team writes them, in a tests folder of its own, collected
by pytest with the plugin from its entry point: mistakes are one-line collection errors at
the test's line, keywords merge over module, class and function, a topology file's profiles
take the marker's duration and tool, and a session that is not root says it measured nothing.
"""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import testbed
from testbed.pytest_plugin import MergedMark, marker_topology

pytestmark = pytest.mark.unit


def _pytest(tmp_path: Path, files: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    team = tmp_path / "team"
    for name, text in files.items():
        (team / name).parent.mkdir(parents=True, exist_ok=True)
        (team / name).write_text(textwrap.dedent(text))
    env = {**os.environ, "PYTHONPATH": str(Path(testbed.__file__).parent.parent),
           "TESTBED_RESULTS": str(tmp_path / "results")}
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "tests", *args],
                          capture_output=True, text=True, timeout=120, cwd=team, env=env)


#: a bad marker (file -> its decorators) and what its one-line collection error must say
BAD = {
    # a misspelt profile left the floor None for ever (the gate never fired), and a text
    # failed only after the cell was measured
    "floor_typo": ("@pytest.mark.testbed_floor(tcp_strem=5000)",
                   "floor_typo.py::test_x: @pytest.mark.testbed_floor: 'tcp_strem' is no profile of the "
                   "test's matrix (tcp_rr, tcp_stream)"),
    "floor_case": ("@pytest.mark.testbed_floor(TCP_STREAM=5000)", "'TCP_STREAM' is no profile"),
    "floor_text": ('@pytest.mark.testbed_floor(tcp_stream="5 Gbit")', "tcp_stream: expected a positive number"),
    "floor_negative": ("@pytest.mark.testbed_floor(tcp_rr=-1)", "tcp_rr: expected a positive number"),
    # the marker's own line in the file (9), not a line of the topology made from it
    "profile_typo": ('@pytest.mark.testbed(profiles=["tcp_strem"])',
                     "profile_typo.py:9 (@pytest.mark.testbed): profiles: 'tcp_strem' is no built-in profile "
                     "(tcp_stream, tcp_maerts, tcp_rr"),
    "mtu": ("@pytest.mark.testbed(mtus=[70000])", "mtu.py:9 (@pytest.mark.testbed): matrix.mtus[0]: MTU 70000 out of range"),
    "profiles_text": ('@pytest.mark.testbed(profiles="tcp_rr")', "profiles_text.py:9 (@pytest.mark.testbed): matrix.profiles"),
}


def test_a_bad_marker_is_a_one_line_collection_error_at_the_tests_line(tmp_path):
    files = {f"tests/test_{name}.py": f"""
        import pytest


        def test_fine():
            pass


        @pytest.mark.testbed(attachments=["bridge"], profiles=["tcp_stream", "tcp_rr"])
        {deco}
        def test_x(testbed_cell):
            pass
        """ for name, (deco, _) in BAD.items()}
    # the marker lines under test sit on line 9: the first decorator is moved there
    for name, (deco, _) in BAD.items():
        if deco.startswith("@pytest.mark.testbed("):
            files[f"tests/test_{name}.py"] = files[f"tests/test_{name}.py"].replace(
                '        @pytest.mark.testbed(attachments=["bridge"], profiles=["tcp_stream", "tcp_rr"])\n', "")
    p = _pytest(tmp_path, files, "--collect-only", "-q", "--continue-on-collection-errors")
    out = p.stdout + p.stderr
    assert "Traceback" not in out and "pluggy" not in out and "UsageError" not in out, out[-3000:]
    assert f"{len(BAD)} errors" in out, out[-3000:]
    for name, (_, words) in BAD.items():
        lines = [x for x in out.splitlines() if f"/test_{name}.py" in x and not x.startswith(("ERROR ", "_"))]
        assert len(lines) == 1 and words in lines[0], (name, lines)
        assert "'t'" not in lines[0], lines[0]           # a string is not read letter by letter


def test_marker_keywords_merge_over_module_class_and_function(tmp_path):
    p = _pytest(tmp_path, {"tests/test_x.py": """
        import pytest

        pytestmark = pytest.mark.testbed(profiles=["tcp_stream", "tcp_rr"], duration=5)


        @pytest.mark.testbed(connections=[1, 4])
        class TestBridge:
            @pytest.mark.testbed(attachments=["bridge"])
            def test_x(self, testbed_cell):
                pass
        """}, "--collect-only", "-q")
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    ids = sorted(x.split("[", 1)[1].rstrip("]") for x in p.stdout.splitlines() if "::" in x)
    assert ids == ["bridge-qemu-mtu1500-conn1-tcp_rr", "bridge-qemu-mtu1500-conn1-tcp_stream",
                   "bridge-qemu-mtu1500-conn4-tcp_rr", "bridge-qemu-mtu1500-conn4-tcp_stream"], ids


def test_a_topology_files_profiles_take_the_markers_duration_and_tool(tmp_path):
    (tmp_path / "gate.yaml").write_text(textwrap.dedent("""
        name: gate
        guests: [{name: g1}, {name: g2}]
        matrix:
          attachments: [bridge]
          profiles:
            - {name: tcp_stream, pattern: stream, message_size: 16384, duration: 10}
            - {name: udp_stream, protocol: udp, pattern: stream, message_size: 1472, duration: 10}
        """))
    test = tmp_path / "test_x.py"
    t = marker_topology(MergedMark((), {"topology": "gate.yaml", "attachments": ["ovs"], "duration": 3,
                                        "tool": "iperf3"}), test)
    assert [a.value for a in t.matrix.attachments] == ["ovs"]
    assert {(p.name, p.duration_s, p.tool.value) for p in t.matrix.profiles} == {
        ("tcp_stream", 3, "iperf3"), ("udp_stream", 3, "iperf3")}
    # a profile given as a mapping in the marker itself keeps its own duration
    t = marker_topology(MergedMark((), {"profiles": [{"name": "s", "pattern": "stream", "duration": 7}],
                                        "duration": 3}), test)
    assert [p.duration_s for p in t.matrix.profiles] == [7]


def test_a_session_that_is_not_root_says_it_measured_nothing(tmp_path):
    p = _pytest(tmp_path, {
        # the session as another user than root (nothing here may create host objects)
        "tests/conftest.py": "import os\nos.geteuid = lambda: 1000\n",
        "tests/test_x.py": """
            import pytest


            @pytest.mark.testbed(attachments=["netns-veth"], profiles=["tcp_stream"], duration=2)
            def test_x(testbed_cell):
                testbed_cell.measure()
            """})
    assert p.returncode == 0, p.stdout[-3000:]
    assert "1 skipped" in p.stdout
    assert "testbed: nothing measured" in p.stdout and "1 test(s) skipped: not run as root" in p.stdout, p.stdout
    assert not (tmp_path / "results").exists()


@pytest.mark.parametrize("how", ["conftest", "option"])
def test_a_team_that_names_the_plugin_as_well_gets_it_once(tmp_path, how):
    # the entry point already loads it; naming it too (pytest_plugins in a conftest, or
    # -p) is what many teams write, and was a ValueError from pytest about a plugin
    # registered twice
    files = {"tests/test_x.py": """
        import pytest


        @pytest.mark.testbed(attachments=["netns-veth"], profiles=["tcp_stream"], duration=2)
        def test_x(testbed_cell):
            testbed_cell.measure()
        """, "tests/conftest.py": "import os\nos.geteuid = lambda: 1000\n"}
    if how == "conftest":
        files["tests/conftest.py"] += 'pytest_plugins = ["testbed.pytest_plugin"]\n'
    p = _pytest(tmp_path, files, *(["-p", "testbed.pytest_plugin"] if how == "option" else []))
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    assert "1 skipped" in p.stdout and p.stdout.count("testbed: nothing measured") == 1, p.stdout


def test_a_teams_own_fixture_of_the_same_name_is_theirs(tmp_path):
    p = _pytest(tmp_path, {"tests/conftest.py": """
        import pytest


        @pytest.fixture
        def testbed_cell():
            return "ours"
        """, "tests/test_x.py": """
        def test_x(testbed_cell):
            assert testbed_cell == "ours"
        """})
    assert p.returncode == 0 and "1 passed" in p.stdout, p.stdout[-3000:]


def test_a_misspelt_attach_mode_is_a_usage_error(tmp_path):
    """It would run under --attach all and be skipped under any other selection."""
    p = _pytest(tmp_path, {"tests/test_x.py": """
        import pytest


        @pytest.mark.attach("ovz")
        def test_x():
            pass
        """}, "--collect-only", "-q")
    assert p.returncode == 4, p.stdout[-2000:] + p.stderr[-2000:]
    assert "test_x.py::test_x: @pytest.mark.attach('ovz',): expected one mode of" in p.stderr, p.stderr
