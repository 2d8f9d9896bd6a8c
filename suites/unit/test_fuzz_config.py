"""Property-based fuzzing of the topology loader through the real CLI (Hypothesis).

Valid topologies (the examples/ files and the built-in default) are mutated: values deleted,
duplicated (emitted as YAML anchors and aliases) and retyped; strings given newlines, quotes,
`$()`, control characters, look-alike letters and leading dashes; numbers made huge; and the
text given YAML tricks (custom tags, merge keys, extra documents, deep nesting, directives).
For every case `testbed validate` must either refuse it (exit 2, exactly one stderr line
naming the file) or accept it, and then the topology must render domain XML that libvirt's
schema accepts. Never a traceback, never another exit status.

Bounded: a fixed number of examples and no per-example deadline (a subprocess validates XML);
the examples database is Hypothesis's default .hypothesis/ folder, kept out of git.
"""
from __future__ import annotations

import contextlib
import copy
import io
import os
import shutil
import subprocess
import traceback
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest
import yaml

from testbed import attachments, cli
from testbed.guests import render
from testbed.topology import config
from testbed.topology.model import Attachment

hypothesis = pytest.importorskip("hypothesis", reason="hypothesis missing (pip install -e .[test])")
from hypothesis import HealthCheck, event, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def _seeds() -> list[Any]:
    docs = [yaml.safe_load(p.read_text()) for p in sorted(EXAMPLES.rglob("*.yaml"))]
    docs.append(yaml.safe_load(config.DEFAULT_TOPOLOGY.replace("{attachments}", "bridge, ovs, macvtap")))
    # a richer one: every optional section present
    docs.append({"name": "full", "accelerator": "tcg", "subnet": "198.18.4.0/24", "ready_timeout": 300,
                 "hosts": [{"name": "local", "uri": "qemu:///system"}],
                 "guests": [{"name": "g1", "memory_mib": 512, "vcpus": 2}, {"name": "g2"}],
                 "client": "g1", "server": "g2", "offloads": {"tso": False}, "macvtap": {"mode": "vepa"},
                 "limits": {"max_cells": 100, "max_hours": 2},
                 "matrix": {"attachments": ["bridge", "macvtap", "netns-veth"], "backends": ["qemu"],
                            "queues": [1, 2], "mtus": [1500, 9000], "connections": [1, 4],
                            "profiles": [{"name": "udp", "tool": "iperf3", "protocol": "udp", "rate_bps": 10**8,
                                          "duration": 5},
                                         {"name": "rr", "tool": "uperf", "pattern": "rr", "message_size": 1,
                                          "response_size": 1}],
                            "repetitions": {"warmup": 1, "min": 2, "max": 3, "rsd_target": 0.1},
                            "randomize": True, "seed": 7}})
    # a real second host over ssh (validate never connects to it)
    docs.append({"hosts": [{"name": "ha", "underlay": "eth1"},
                           {"name": "hb", "uri": "qemu+libssh2://root@hb:2222/system?known_hosts=/k"
                                                 "&known_hosts_verify=normal",
                            "ssh": "root@hb", "ssh_port": 2222, "underlay": "ens5"}],
                 "guests": [{"name": "g1", "host": "ha"}, {"name": "g2", "host": "hb"}],
                 "tunnel": {"vni": 7, "udp_port": 8472, "underlay_mtu": 1600},
                 "matrix": {"attachments": ["bridge-vxlan", "ovs-vxlan", "macvtap"],
                            "profiles": [{"name": "s", "tool": "netperf", "confidence": [99, 5],
                                          "iterations": [5, 3]}]}})
    return docs


SEEDS = _seeds()

NASTY_STRINGS = ["", " ", "\n", "g1\n", "\r", "'", '"', "$(reboot)", "`id`", "; rm -rf /", "-oProxyCommand=x",
                 "--", "-", ".", "..", "a/b", "a:b", "\x00", "\x1b[31m", "\u202e", "\u200b",
                 "g\u0456", "\u0261\u0031",  # Cyrillic i, Latin script g: look-alikes
                 "\uff47\uff11", "<x/>", "&amp;", "]]>", "%s", "{{7*7}}", "a" * 300, "No_Verify=1",
                 "qemu+ssh://root@h/system?No_Verify=1", "qemu+libssh2://h/system?known_hosts_verify=ignore",
                 "qemu+ext:///system?command=/bin/sh", "198.18.0.1/32", "::1/128", "2001:db8::/64",
                 "root@-h", "-E/tmp/x@h", "eth0\n", "tb-", "\ud7ff", "NaN", "yes", "0x10", "1e9"]
NASTY_SCALARS: list[Any] = [None, True, False, 0, -1, 1, 2**31, 2**63, 10**40, -(10**40), 1.5, float("nan"),
                            float("inf"), float("-inf"), 1e308, [], {}, [None], {"": None}]

scalars = st.one_of(st.sampled_from(NASTY_SCALARS), st.sampled_from(NASTY_STRINGS),
                    st.text(max_size=20), st.integers(), st.floats())


def _paths(node: Any, prefix: tuple = ()) -> list[tuple]:
    """Every place in a document: (path-to-container, key-or-index)."""
    out = []
    if isinstance(node, dict):
        for k, v in node.items():
            out.append(prefix + (k,))
            out += _paths(v, prefix + (k,))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            out.append(prefix + (i,))
            out += _paths(v, prefix + (i,))
    return out


def _holds(node: Any, obj: Any) -> bool:
    """``obj`` is ``node`` or somewhere inside it (by identity)."""
    stack, seen = [node], set()
    while stack:
        n = stack.pop()
        if n is obj:
            return True
        if id(n) in seen:
            continue
        seen.add(id(n))
        stack.extend(n.values() if isinstance(n, dict) else n if isinstance(n, list) else ())
    return False


def _get(doc: Any, path: tuple) -> Any:
    for p in path:
        doc = doc[p]
    return doc


@st.composite
def mutated(draw) -> str:
    doc = copy.deepcopy(draw(st.sampled_from(SEEDS)))
    for _ in range(draw(st.integers(1, 3))):
        paths = _paths(doc)
        if not paths:
            break
        path = draw(st.sampled_from(paths))
        parent, key = _get(doc, path[:-1]), path[-1]
        op = draw(st.sampled_from(["delete", "duplicate", "retype", "string", "huge", "rename", "alias"]))
        if op == "delete":
            del parent[key]
        elif op == "duplicate":
            # the same value again (a list gets a second copy; a mapping a copy under a new key)
            if isinstance(parent, list):
                parent.insert(key, copy.deepcopy(parent[key]))
            else:
                parent[draw(st.sampled_from(["name", "mtus", "guests", "x", str(key) + "2"]))] = parent[key]
        elif op == "retype":
            parent[key] = draw(scalars)
        elif op == "string":
            old = parent[key]
            base = old if isinstance(old, str) else str(old)
            nasty = draw(st.sampled_from(NASTY_STRINGS))
            where = draw(st.sampled_from(["prefix", "suffix", "replace"]))
            parent[key] = nasty + base if where == "prefix" else base + nasty if where == "suffix" else nasty
        elif op == "huge":
            parent[key] = draw(st.sampled_from([10**100, -(10**100), 2**64, 10**5000 // 10**4000, 1e300]))
        elif op == "rename" and isinstance(parent, dict):
            parent[draw(st.sampled_from(NASTY_STRINGS + [1, None, True]))] = parent.pop(key)
        elif op == "alias":
            # one object in two places: safe_dump writes an anchor and an alias
            target = draw(st.sampled_from(paths))
            value = _get(doc, target)
            # not an ancestor, by path or (after a shared duplicate) by identity: no cycle
            if path[:len(target)] != target and not _holds(value, parent):
                parent[key] = value
    try:
        text = yaml.safe_dump(doc, sort_keys=False, allow_unicode=draw(st.booleans()))
    except (yaml.YAMLError, ValueError, RecursionError):
        text = "matrix: {}\n"
    trick = draw(st.sampled_from(["none", "none", "tag", "std_tag", "std_tag", "python_tag", "merge", "second_doc", "markers",
                                  "deep", "directive", "anchor_bomb", "tab", "bom", "flow_break", "splice",
                                  "splice"]))
    if trick == "tag":
        text = text.replace(": ", ": !env ", 1)
    elif trick == "std_tag":
        # YAML's own tags on values they do not fit: the constructors fail in odd ways
        tag = draw(st.sampled_from(["!!bool", "!!int", "!!float", "!!timestamp", "!!binary", "!!null", "!!str",
                                    "!!map", "!!seq", "!!set", "!!omap", "!!pairs", "!!merge", "!!value"]))
        text = text.replace(": ", f": {tag} ", draw(st.integers(1, 3)))
    elif trick == "python_tag":
        text = text.replace(": ", ": !!python/object/apply:os.system ", 1)
    elif trick == "merge":
        text = "<<: {name: merged}\n" + text
    elif trick == "second_doc":
        text = text + "---\n" + text
    elif trick == "markers":
        text = "---\n" + text + "...\n"
    elif trick == "deep":
        n = draw(st.integers(10, 2000))
        text = text.replace(": ", ": " + "[" * n + "1" + "]" * n + " #", 1)
    elif trick == "directive":
        text = "%YAML 1.1\n%TAG !e! tag:example.com,2000:\n---\n" + text
    elif trick == "anchor_bomb":
        text = ("a: &a [1, 1, 1, 1, 1, 1, 1, 1, 1]\nb: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a]\n"
                "c: &c [*b, *b, *b, *b, *b, *b, *b, *b, *b]\nd: [*c, *c, *c, *c, *c, *c, *c, *c, *c]\n" + text)
    elif trick == "tab":
        text = text.replace("  ", "\t", 1)
    elif trick == "bom":
        text = "\ufeff" + text
    elif trick == "flow_break":
        text = text[: draw(st.integers(0, len(text)))]
    elif trick == "splice":
        # a few characters of YAML syntax (or anything) dropped in anywhere
        at = draw(st.integers(0, len(text)))
        bit = draw(st.one_of(st.sampled_from(["&a ", "*a", "!", "? ", "- ", ": ", "{", "}", "[", "]", ",", "|",
                                              ">", "'", '"', "#", "%", "@", "`", "\t", "\n  ", "<<: *a", "~"]),
                             st.text(max_size=4)))
        text = text[:at] + bit + text[at:]
    return text


_VALIDATED: set[str] = set()


def _schema_check(xml: str, tmp: Path) -> None:
    ET.fromstring(xml)
    if xml in _VALIDATED or not shutil.which("virt-xml-validate"):
        return
    f = tmp / "domain.xml"
    f.write_text(xml)
    p = subprocess.run(["virt-xml-validate", str(f), "domain"], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stdout + p.stderr + xml
    _VALIDATED.add(xml)


def _render_all(topo_path: Path, tmp: Path) -> None:
    """What the runner would render for this topology: each guest's domain with each NIC."""
    t = config.load(topo_path)
    kinds = {Attachment("bridge"): "bridge", Attachment("bridge-vxlan"): "bridge", Attachment("ovs"): "ovs",
             Attachment("ovs-vxlan"): "ovs", Attachment("macvtap"): "direct"}
    for g in t.guests:
        d = render.DomainParams(
            name=f"tb-ab12-{g.name}", run_id="20260101T000000Z-ab12", domain_type="qemu",
            memory_mib=g.memory_mib, vcpus=g.vcpus, disk=g.image or f"/var/lib/testbed/tb-ab12/tb-ab12-{g.name}.qcow2",
            seed=f"/var/lib/testbed/tb-ab12/tb-ab12-{g.name}-seed.iso",
            console_log=f"/var/lib/testbed/tb-ab12/tb-ab12-{g.name}.console.log",
            kernel=None if g.image else "/var/cache/testbed/images/x/vmlinuz",
            initrd=None if g.image else "/var/cache/testbed/images/x/initrd.img",
            cmdline="" if g.image else "root=/dev/vda rw console=ttyS0")
        xml = render.domain_xml(d)
        nics = [render.interface_xml(render.NicParams(
            kinds[a], "tb-ab12-br", "tb-ab12-t0", "52:54:ab:12:00:00", b.driver_name, max(t.matrix.mtus),
            queues=q, options=(("mode", t.macvtap.mode.value),)))
            for a in t.matrix.attachments if attachments.get(a).guests for b in t.matrix.backends for q in t.matrix.queues]
        _schema_check(xml.replace("</devices>", "".join(nics[:3]) + "</devices>"), tmp)


@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("fuzz")


#: 300 examples take ~20 s here; TESTBED_FUZZ_EXAMPLES=5000 for a deeper hunt by hand.
EXAMPLES_PER_RUN = int(os.environ.get("TESTBED_FUZZ_EXAMPLES", "300"))


@settings(max_examples=EXAMPLES_PER_RUN, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                   HealthCheck.function_scoped_fixture])
@given(text=mutated())
def test_mutated_topologies_are_refused_in_one_line_or_render(workdir, text):
    f = workdir / "topo.yaml"
    f.write_text(text, encoding="utf-8", errors="surrogatepass")
    err, out = io.StringIO(), io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
            rc = cli.main(["validate", str(f)])
    except BaseException:   # noqa: BLE001 - any escape is the failure being looked for
        pytest.fail(f"traceback for:\n{text}\n{traceback.format_exc()}")
    lines = err.getvalue().splitlines()
    assert rc in (0, 2), (rc, err.getvalue(), text)
    event(f"exit {rc}")     # --hypothesis-show-statistics: how often each outcome was reached
    if rc == 2:
        assert len(lines) == 1, (err.getvalue(), text)
        assert lines[0].startswith(f"testbed: {f}"), lines[0]
        assert "Traceback" not in lines[0]
    else:
        assert lines == [] and out.getvalue().startswith(f"{f}: ok"), (err.getvalue(), out.getvalue())
        _render_all(f, workdir)


def test_the_seeds_themselves_validate_and_render(workdir):
    for i, doc in enumerate(SEEDS):
        f = workdir / f"seed{i}.yaml"
        f.write_text(yaml.safe_dump(doc, sort_keys=False))
        assert cli.main(["validate", str(f)]) == 0, doc
        _render_all(f, workdir)
