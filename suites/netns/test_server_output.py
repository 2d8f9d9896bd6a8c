"""A stopped server's output is returned (uperf's slave logs its errors only there)."""
from __future__ import annotations

import os
import time

import pytest

from testbed.host import proc
from testbed.host.nsagent import NsAgent
from testbed.measure.session import claim_tag

pytestmark = pytest.mark.netns


def test_stop_returns_what_the_server_printed(tmp_path) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root to create a network namespace")
    ns = f"tb-{claim_tag()}-so"      # registered: runs beside this test leave it alone
    proc.run(["ip", "netns", "add", ns])
    try:
        agent = NsAgent(ns, str(tmp_path))
        pid = agent.spawn(["/bin/sh", "-c", "echo '** Error executing transactions'; exec sleep 600"])
        time.sleep(0.5)
        assert "** Error executing transactions" in agent.stop(pid)
        assert not agent.alive(pid) and agent.stop(pid) == ""
    finally:
        proc.run(["ip", "netns", "del", ns], check=False)
