"""A new attachment mode is one module plus one registry line: a throwaway mode, written
here as a user would write it, validates in a topology, runs a namespace cell whose sample
is cross-checked, and leaves nothing behind."""
from __future__ import annotations

import subprocess
import textwrap

import pytest

from testbed import attachments
from testbed.errors import ConfigError
from testbed.measure import runner
from testbed.pytest_plugin import require_root
from testbed.records import results
from testbed.topology import config

TOY_MODE = '''\
"""A toy mode: two namespaces joined by a veth pair, through the host layer's own connection."""
import contextlib

from testbed.attachments.base import Mode
from testbed.attachments.netns import ConnectionFabric
from testbed.host.net import netns


@contextlib.contextmanager
def fabric(req):
    with netns.veth_pair(req.tag, subnet=req.topology.subnet, mtu=req.max_mtu,
                         offloads=req.offloads) as conn:
        yield ConnectionFabric(conn)


MODES = (Mode("netns-toy", fabric, endpoints="netns", placement="none", netns_kind="veth"),)
'''

TOPOLOGY = """\
name: toy
matrix:
  attachments: [netns-toy]
  profiles:
    - {name: tcp_rr, pattern: rr, message_size: 1, response_size: 1, duration: 2}
"""


@pytest.fixture
def toy_mode(tmp_path, monkeypatch):
    pkg = tmp_path / "tbtoy"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "mode.py").write_text(textwrap.dedent(TOY_MODE))
    monkeypatch.syspath_prepend(str(tmp_path))
    # the one registry line
    monkeypatch.setattr(attachments, "MODULES", (*attachments.MODULES, "tbtoy.mode"))
    monkeypatch.setattr(attachments, "_modes", {})
    yield "netns-toy"
    attachments._modes.clear()


def _tb_links() -> set[str]:
    out = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    ns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    return {w.rstrip(":").split("@")[0] for w in out.split() if w.startswith("tb-")} | \
        {line.split()[0] for line in ns.splitlines() if line.startswith("tb-")}


def test_a_throwaway_mode_validates_runs_and_cleans_up(toy_mode, tmp_path, monkeypatch):
    require_root()
    t = config.parse(TOPOLOGY, "toy.yaml")
    assert t.matrix.attachments == ("netns-toy",)
    # without its registry line the same file is refused, naming the field
    with pytest.raises(ConfigError, match=r"matrix\.attachments\[0\].*netns-toy"):
        monkeypatch.setattr(attachments, "_modes", {})
        monkeypatch.setattr(attachments, "MODULES", tuple(m for m in attachments.MODULES if m != "tbtoy.mode"))
        config.parse(TOPOLOGY, "toy.yaml")
    monkeypatch.setattr(attachments, "MODULES", (*attachments.MODULES, "tbtoy.mode"))
    monkeypatch.setattr(attachments, "_modes", {})

    before = _tb_links()
    monkeypatch.setenv("TESTBED_RESULTS", str(tmp_path / "results"))
    out = runner.execute(config.parse(TOPOLOGY, "toy.yaml"))
    run = results.read_run(out.run_dir)
    ok = [s for s in run.samples if s.status == "ok"]
    assert ok, [s.reason for s in run.samples]
    assert {s.cell.attachment for s in run.samples} == {"netns-toy"}
    # a measured fact, cross-checked on the wire: transactions really crossed the veth
    assert ok[0].metrics["transactions_per_s"] > 0
    assert ok[0].crosscheck.verdict == "ok", ok[0].crosscheck
    # this run's objects are gone (other tests' runs beside this one come and go meanwhile)
    tag = out.run_dir.name.rsplit("-", 1)[1]
    left = {n for n in _tb_links() - before if n.startswith(f"tb-{tag}")}
    assert not left, f"left behind: {left}"


TOY_TOOL = '''\
"""A toy tool: iperf3's driver under another name (a site's wrapper would look like this)."""
from testbed.tools.iperf3 import Iperf3Driver
from testbed.topology.model import Tool


class ToyDriver(Iperf3Driver):
    name = Tool("tbtoy")


DRIVER = ToyDriver()
'''

TOOL_TOPOLOGY = """\
name: toytool
matrix:
  attachments: [netns-veth]
  profiles:
    - {name: tcp_stream, tool: tbtoy, pattern: stream, duration: 2}
"""


def test_a_throwaway_tool_driver_validates_and_runs_a_cell(tmp_path, monkeypatch):
    """A new tool is one driver module plus one registry line: its name validates, the one
    sampling loop runs it, and the wire cross-check agrees with what it reports."""
    require_root()
    from testbed import tools
    pkg = tmp_path / "tbtooltoy"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "driver.py").write_text(TOY_TOOL)
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ConfigError, match=r"profiles\[0\]\.tool.*tbtoy"):
        config.parse(TOOL_TOPOLOGY, "toytool.yaml")
    monkeypatch.setattr(tools, "MODULES", (*tools.MODULES, "tbtooltoy.driver"))
    monkeypatch.setattr(tools, "_drivers", {})
    t = config.parse(TOOL_TOPOLOGY, "toytool.yaml")
    assert t.matrix.profiles[0].tool == "tbtoy"
    monkeypatch.setenv("TESTBED_RESULTS", str(tmp_path / "results"))
    run = results.read_run(runner.execute(t).run_dir)
    ok = [s for s in run.samples if s.status == "ok"]
    assert ok, [s.reason for s in run.samples]
    assert ok[0].metrics["throughput_mbps"] > 0
    assert ok[0].crosscheck.verdict == "ok", ok[0].crosscheck
    tools._drivers.clear()
