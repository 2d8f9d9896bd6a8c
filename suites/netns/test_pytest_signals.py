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
