"""A test session stopped with SIGTERM (a CI job's timeout, `kill`) tears its fixtures down
as for Ctrl-C: the tb- objects they made are gone, not left for `testbed cleanup`."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

pytestmark = [pytest.mark.netns]

INNER = '''
import time
from testbed.measure.session import claim_tag, release_tag
from testbed.host import proc

def test_holds_a_namespace(tmp_path):
    tag = claim_tag()
    ns = f"tb-{tag}-sig"
    proc.run(["ip", "netns", "add", ns])
    try:
        print("MADE", ns, flush=True)
        time.sleep(120)
    finally:
        proc.run(["ip", "netns", "del", ns], check=False)
        release_tag(tag)
'''


def test_sigterm_tears_the_fixtures_down(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("needs root: creates a namespace")
    (tmp_path / "test_inner.py").write_text(INNER)
    p = subprocess.Popen([sys.executable, "-m", "pytest", "-q", "-s", "-p", "no:cacheprovider", "-p", "no:xdist",
                          str(tmp_path / "test_inner.py")], cwd=tmp_path, stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 60
        ns = None
        for line in p.stdout:
            if "MADE " in line:
                ns = line.split("MADE ", 1)[1].split()[0]
                break
            assert time.monotonic() < deadline
        assert ns and ns in subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
        p.send_signal(signal.SIGTERM)
        out, _ = p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    assert p.returncode == 2, out[-2000:]          # pytest's "interrupted"
    assert ns not in subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout


INNER_XDIST = '''
import os, time
import pytest
from testbed.measure.session import claim_tag, release_tag
from testbed.host import proc

@pytest.fixture(scope="session")
def namespace():
    tag = claim_tag()
    ns = f"tb-{tag}-sig"
    proc.run(["ip", "netns", "add", ns])
    try:
        with open(os.path.join(os.environ["MADE_DIR"], ns), "w"):
            pass
        yield ns
    finally:
        # slower than xdist lets a worker be once it is asked to exit (10 s, 15 s for execnet)
        time.sleep(TEARDOWN_S)
        proc.run(["ip", "netns", "del", ns], check=False)
        release_tag(tag)

@pytest.mark.parametrize("n", range(2))
def test_holds_a_namespace(namespace, n):
    time.sleep(120)
'''


@pytest.mark.parametrize("how", ["sigterm-to-the-controller", "ctrl-c-to-the-group"])
def test_an_interrupted_xdist_session_waits_for_its_workers_teardown(tmp_path, how):
    """With two xdist workers each holding a namespace whose teardown takes 20 s, the
    session stopped by SIGTERM to its controller alone, or by Ctrl-C to the whole process
    group, ends only after both workers have torn down: no namespace is left."""
    if os.geteuid() != 0:
        pytest.skip("needs root: creates namespaces")
    pytest.importorskip("xdist")
    (tmp_path / "test_inner.py").write_text(INNER_XDIST.replace("TEARDOWN_S", "20"))
    made = tmp_path / "made"
    made.mkdir()
    p = subprocess.Popen([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "2",
                          str(tmp_path / "test_inner.py")], cwd=tmp_path, stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True, start_new_session=True,
                         env={**os.environ, "MADE_DIR": str(made)})
    try:
        deadline = time.monotonic() + 90
        while len(list(made.iterdir())) < 2:
            assert p.poll() is None and time.monotonic() < deadline, p.communicate()[0][-2000:]
            time.sleep(0.2)
        names = sorted(x.name for x in made.iterdir())
        listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
        assert all(n in listed for n in names)
        if how == "sigterm-to-the-controller":
            p.send_signal(signal.SIGTERM)
        else:
            os.killpg(p.pid, signal.SIGINT)
        out, _ = p.communicate(timeout=120)
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    left = [n for n in names if n in listed]
    for n in left:
        subprocess.run(["ip", "netns", "del", n], check=False)
    assert not left, f"left behind: {left}\n{out[-2000:]}"
    assert p.returncode == 2, out[-2000:]
    assert "waiting up to" in out, out[-2000:]
