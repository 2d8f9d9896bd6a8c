"""A/B in one run: two variants (the stock QEMU, and a second "QEMU" that is a wrapper script
exec'ing it, with a larger rx ring) measured interleaved on one host, then compared with
`testbed compare RUN --variants A B`. An unusable variant is bad input: exit 2, nothing made."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from testbed.admin import cleanup
from testbed.analysis import compare

pytestmark = pytest.mark.vm

TOPOLOGY = """\
name: ab
guests: [{{name: g1}}, {{name: g2}}]
matrix:
  attachments: [bridge]
  profiles:
    - {{name: tcp_rr, tool: netperf, protocol: tcp, pattern: rr, message_size: 1, response_size: 1, duration: 2}}
  repetitions: {{warmup: 0, min: 5, max: 5, rsd_target: 0}}
  variants:
    - {{name: a}}
    - {{name: b, emulator: {emulator}, nic: {{rx_queue_size: 512}}}}
"""


def _cli(tmp_path: Path, *args: str, timeout: float = 2400) -> subprocess.CompletedProcess:
    env = {**os.environ, "TESTBED_RESULTS": str(tmp_path / "results")}
    return subprocess.run([sys.executable, "-m", "testbed.cli", *args], capture_output=True,
                          text=True, timeout=timeout, env=env)


@pytest.fixture
def wrapper():
    # libvirt's QEMU user must be able to run it: a 0755 directory, not pytest's 0700 tmp
    d = Path(tempfile.mkdtemp(prefix="tb-qemu-"))
    d.chmod(0o755)
    w = d / "qemu-system-x86_64"
    w.write_text("#!/bin/sh\nexec /usr/bin/qemu-system-x86_64 \"$@\"\n")
    w.chmod(0o755)
    yield w
    w.unlink()
    d.rmdir()


def test_two_variants_interleave_and_compare(accelerator, tmp_path, wrapper):
    topo = tmp_path / "ab.yaml"
    topo.write_text(TOPOLOGY.format(emulator=wrapper))
    p = _cli(tmp_path, "run", str(topo))
    assert p.returncode == 0, p.stderr[-3000:]
    run_dir = Path(p.stdout.strip().splitlines()[-1])
    assert (run_dir / "report.html").is_file()
    run = json.loads((run_dir / "run.json").read_text())
    assert run["counts"]["boots"] == 4
    assert run["variants"]["b"]["emulator"] == str(wrapper)
    assert run["variants"]["b"]["emulator_version"].startswith("QEMU emulator version")
    samples = [json.loads(x) for x in (run_dir / "samples.jsonl").read_text().splitlines()]
    order = [s["cell"]["context"]["variant"] for s in sorted(samples, key=lambda s: s["started"])
             if s["status"] != "noisy"]                   # a noisy sample is measured again in place
    # counterbalanced, by timestamps: each round reverses the last (A B, B A, A B, ...)
    assert order == ["a", "b", "b", "a"] * 2 + ["a", "b"], order
    assert {s["cell"]["hash_without_variant"] for s in samples} == {samples[0]["cell"]["hash_without_variant"]}
    assert len({s["cell"]["hash"] for s in samples}) == 2
    # the domain of variant b really ran the wrapper, with the larger ring
    xml = (run_dir / "guests").glob("*g1b*.xml")
    assert any(str(wrapper) in x.read_text() for x in xml)
    c = _cli(tmp_path, "compare", str(run_dir), "--variants", "a", "b", "--junit",
             str(tmp_path / "ab.xml"), timeout=300)
    print(c.stdout)         # the verdict table, for the log (-s)
    rec = compare.load(run_dir)
    expected = compare.compare_runs(rec, rec, variants=("a", "b"))
    assert c.returncode == expected.exit_status and c.returncode in (0, 1, 5), c.stdout + c.stderr
    assert [x.verdict.value for x in expected.cells][0].upper() in c.stdout
    assert expected.cells[0].base_ok == expected.cells[0].new_ok == 5
    # nothing of this run is left (other sessions' tb- objects may come and go meanwhile)
    tag = run_dir.name.rsplit("-", 1)[1]
    found = cleanup.find(include_live=True)
    assert [n for group in found.__dict__.values() for n in group if n.startswith(f"tb-{tag}")] == []


def test_an_unusable_variant_is_bad_input_and_creates_nothing(tmp_path):
    topo = tmp_path / "ab.yaml"
    topo.write_text(TOPOLOGY.format(emulator="/bin/true"))
    p = _cli(tmp_path, "run", str(topo), timeout=120)
    assert p.returncode == 2, p.stderr
    assert "matrix.variants[1].emulator" in p.stderr and "not a QEMU" in p.stderr
    assert len(p.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "results").exists() or not any((tmp_path / "results").iterdir())
