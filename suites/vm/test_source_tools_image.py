"""A tool built from source into the guest image, the way uperf is: the tests' own C program
(suites/vm/data/tbhello-image/tbhello, configure + make) is built inside an image root derived from the
cached debian12 image, the guest boots from it and runs the program. The run preflight reads
the image's recorded tool list, never this host's.

Cost: about 1 min 45 s to build the image here (unpack the base 5 s, apt-get install
build-essential ~80 s, compile, purge, mkfs + qcow2 ~15 s) once per cache, plus one guest
boot (1-3 min under TCG)."""
from __future__ import annotations

import dataclasses
import time
from pathlib import Path

import pytest

from testbed.admin import cleanup
from testbed.errors import CapabilityError
from testbed.guests import images, virt
from testbed.measure import runner
from testbed.records import results
from testbed.topology import config
from testbed.topology.model import GuestSpec, Profile, Tool

pytestmark = pytest.mark.vm
RECIPE = Path(__file__).resolve().parent / "data" / "tbhello-image"


@pytest.fixture(scope="module")
def tbhello_image(accelerator):
    recipe = images.load_recipe(RECIPE)
    t0 = time.monotonic()
    img = images.ensure(recipe)
    print(f"tbhello image {img.name}-{img.digest}: {time.monotonic() - t0:.1f} s (0 when cached)")
    return img


def test_image_records_the_tool_and_its_version(tbhello_image):
    assert tbhello_image.tools is not None
    assert tbhello_image.tools["tbhello"] == "0.3"          # as the built binary reports it
    assert {"netperf", "iperf3"} <= set(tbhello_image.tools)   # the base image's tools are kept
    assert "uperf" not in tbhello_image.tools


def test_preflight_refuses_a_tool_the_image_lacks(tbhello_image):
    topo = config.default()
    uperf = Profile("u_rr", tool=Tool("uperf"), duration_s=2)
    topo = dataclasses.replace(topo, matrix=dataclasses.replace(topo.matrix, profiles=(uperf,)))
    with pytest.raises(CapabilityError, match="uperf is not in guest image tbhello-"):
        runner.guest_tools_preflight(topo, runner.plan(topo), tbhello_image)
    netperf = dataclasses.replace(topo, matrix=dataclasses.replace(topo.matrix, profiles=(
        Profile("n", tool=Tool("netperf"), duration_s=2),)))
    runner.guest_tools_preflight(netperf, runner.plan(netperf), tbhello_image)   # no error


def test_guest_runs_the_source_built_tool(tbhello_image, accelerator):
    with cleanup.owned_fresh_state(results.new_run_id) as (run_id, tag, state), virt.connect("qemu:///system") as conn, \
            virt.guest(conn, GuestSpec("g1", "local"), tbhello_image, accelerator, run_id, tag, state) as g:
        g.wait_ready(600)
        res = g.agent.run(["/usr/local/bin/tbhello", "-V"], timeout=30)
        assert res.stdout.strip() == "tbhello version 0.3"
        # the compiler was there for the build only
        assert g.agent.run(["/bin/sh", "-c", "command -v cc gcc"], check=False).rc != 0
        # the version the guest reports is the one the manifest recorded
        nv = g.agent.run(["/usr/bin/netperf", "-V"], check=False).stdout
        assert tbhello_image.tools["netperf"] in nv
        # a server's output is read when it is stopped (uperf's slave logs its errors there)
        pid = g.agent.spawn(["/bin/sh", "-c", "echo '** Error executing transactions'; exec sleep 600"])
        time.sleep(1)
        # (the output comes with the exit status, after which the agent forgets the pid)
        assert "** Error executing transactions" in g.agent.stop(pid)
