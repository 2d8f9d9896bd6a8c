"""The attachment registry (testbed/attachments): one module per mode, one list of modules,
and no mode named in the runner or the measuring code."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from testbed import attachments
from testbed.attachments.base import Fabric, Mode
from testbed.errors import ConfigError
from testbed.topology import config
from testbed.topology.model import Attachment

PKG = Path(attachments.__file__).resolve().parent.parent


def _code(name: str) -> str:
    return (PKG / name).read_text()


@pytest.mark.parametrize("module", ["measure/runner.py", "measure/sampling.py"])
def test_runner_and_measure_name_no_mode(module):
    text = _code(module)
    for mode in attachments.modes():
        # a mode name as a word of its own (not inside an identifier or a longer name)
        hit = re.search(rf"(?<![\w-]){re.escape(mode.name)}(?![\w-])", text)
        assert hit is None, f"{module} names attachment mode {mode.name!r}: ...{text[hit.start() - 40:hit.end() + 40]}..."
    members = re.findall(r"\bAttachment\.[A-Z_]+", text)
    assert members == [], f"{module} names Attachment members {members}"
    # The counters of a test path come from its fabric, not from a host-networking default.
    assert not re.search(r"^\s*(from testbed\.host\.net|import testbed\.host\.net|from testbed\.host import .*\bnet\b)",
                         _code("measure/sampling.py"), re.M)


def test_the_registry_lists_every_mode_module_once():
    # a mode is a module of the folder or a folder of its own (a package with its parts)
    files = ({p.stem for p in (PKG / "attachments").glob("*.py")}
             | {p.parent.name for p in (PKG / "attachments").glob("*/__init__.py")}) - {"__init__", "base"}
    modules = set(attachments.MODULES)
    assert len(attachments.MODULES) == len(modules)
    # every module of the folder that is not a shared helper (_name) is registered
    assert {f for f in files if not f.startswith("_")} == modules
    names = attachments.names()
    assert len(set(names)) == len(names)
    for m in attachments.modes():
        assert isinstance(m, Mode) and callable(m.fabric)
        assert m.endpoints in ("guests", "netns") and m.placement in ("one", "two", "any", "none")


def test_attachment_is_a_name_the_model_does_not_interpret():
    # the model holds the name; what a mode is, the registry says
    assert Attachment("bridge") == "bridge" and Attachment("netns-ovs-veth").value == "netns-ovs-veth"
    assert attachments.get(Attachment("ovs-vxlan")).placement == "two"
    assert attachments.get(Attachment("macvtap")).placement != "two"
    assert not attachments.get("netns-veth").guests and attachments.get("veth-cable").guests
    assert attachments.get("netns-ovs-internal").netns_kind == "ovs-internal"
    with pytest.raises(ValueError, match="unknown attachment 'vdpa'"):
        attachments.get("vdpa")
    # nothing below the registry imports it: the model names no mode
    model = _code("topology/model.py")
    assert "testbed.attachments" not in model and "from testbed import attachments" not in model


def test_fabric_is_the_one_shape():
    # what every fabric answers, with the defaults a tap-based fabric keeps
    for hook in ("nic", "port", "attach", "set_mtu", "counters", "leftovers", "own_pairs", "endpoint"):
        assert callable(getattr(Fabric, hook))
    assert Fabric.guest_sends_as_rx is True


TOY = """\
guests: [{name: g1}, {name: g2}]
matrix:
  attachments: [veth-cable]
  profiles: [{name: tcp_stream}]
"""


def test_config_takes_a_registered_mode_and_its_rules():
    t = config.parse(TOY, "toy.yaml")
    assert t.matrix.attachments == (Attachment("veth-cable"),)
    with pytest.raises(ConfigError) as e:
        config.parse(TOY.replace("veth-cable", "vdpa"), "toy.yaml")
    assert "veth-cable" in str(e.value) and "matrix.attachments[0]" in str(e.value)
    # placement "one": guests on two hosts are refused, naming the mode's entry
    apart = ("hosts: [{name: ha, transport: netns}, {name: hb, transport: netns}]\n"
             "guests: [{name: g1, host: ha}, {name: g2, host: hb}]\n" + TOY.split("\n", 1)[1])
    with pytest.raises(ConfigError) as e:
        config.parse(apart, "toy.yaml")
    assert "veth-cable joins guests on one host" in str(e.value)
    # a mode's own block is a top-level key only because a registered mode owns it
    assert "macvtap" in attachments.get(Attachment("macvtap")).fields
