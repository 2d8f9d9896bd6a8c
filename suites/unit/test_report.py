"""testbed.analysis.report: a self-contained HTML page with real plots, and the CSV of every sample.

The last test opens the page in headless Chromium and checks that the screenshot shows
plots; it is skipped when Chromium is not installed (Debian: apt-get install -y chromium).
"""
from __future__ import annotations

import argparse
import base64
import csv
import io
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from testbed.analysis import compare, report
from testbed.cli import results as cli_results
from testbed.host import proc
from testbed.records.results import RunWriter, SampleRecord, now
from testbed.topology.model import Attachment, Backend, Cell, GuestSpec, HostSpec, Matrix, Pattern, Profile, Topology

pytestmark = pytest.mark.unit

STREAM = Profile("tcp_stream", message_size=16384)
RR = Profile("tcp_rr", pattern=Pattern.RR, message_size=1, response_size=1)
TCG = {"accelerator": "tcg", "comparable_class": "tcg-functional-only"}


def cpu(host: float, guest: float) -> dict:
    return {"host": {"busy": host}, "guest": {"g1": {"busy": guest / 2}, "g2": {"busy": guest / 2}},
            "per_guest": {"g1": {"total": host / 3}, "g2": {"total": host / 3}},
            "named": {"ovs-vswitchd": 0.0}, "window_s": 10.0}


def write_run(root: Path, run_id: str, *, k: float = 1.0, reps: int = 4, failed: int = 0,
              seed: int = 0, attachments=("bridge", "ovs"), mtus=(1500, 9000),
              conns=(1, 2, 4), **env) -> Path:
    """Stream and rr cells over attachments x MTUs x connections, numbers shaped like the
    real run 20261122T030019Z-a0e9 (2.2 Gbit/s, 1700 tps, p99 1.3 ms), 3 % noise."""
    rng = np.random.default_rng(seed)
    cells = [Cell(Attachment(a), Backend.QEMU, m, c, p) for a in attachments for m in mtus
             for c in conns for p in (STREAM, RR)]
    topo = Topology("t", "<test>", (HostSpec("local"),),
                    (GuestSpec("g1", "local"), GuestSpec("g2", "local")), "g1", "g2",
                    Matrix(tuple(Attachment(a) for a in attachments), (Backend.QEMU,), mtus,
                           conns, (STREAM, RR)))
    environment = {"accelerator": "kvm", "comparable_class": "kvm", "cpu_model": "AMD EPYC",
                   "cpu_mhz": 2596.1, "cpus": 2, "kernel": "6.18.44", "host": "vm",
                   "versions": {"qemu": "7.2.22", "ovs": "3.1.0"}, **env}
    with RunWriter(root, run_id, topo, environment) as w:
        for c in cells:
            f = (0.8 if c.attachment == Attachment("ovs") else 1.0) * k
            for rep in range(reps):
                n = rng.normal(1, 0.03)
                if c.profile is STREAM:
                    m = {"throughput_mbps": 2232 * f * (c.mtu / 1500) ** 0.5 * c.connections ** 0.6 * n,
                         "latency_p50_us": 16.0, "latency_p90_us": 64.0, "latency_p99_us": 729.0}
                    load = 0.8 + 0.15 * c.connections
                else:
                    m = {"transactions_per_s": 1688 * f * c.connections ** 0.5 * n,
                         "latency_p50_us": 545 * n, "latency_p90_us": 736 * n,
                         "latency_p99_us": 1322 * (1 + c.mtu / 20000) * n}
                    load = 1.0 + 0.1 * c.connections
                w.add_sample(SampleRecord.new(run_id, c.as_dict(), rep, False, "ok", None, m,
                                              cpu(load, load * 0.8), now(), now()))
            for rep in range(failed):
                w.add_sample(SampleRecord.new(run_id, c.as_dict(), reps + rep, False, "failed",
                                              "netperf: timed out <after> 30 s", {}, {}, now(), now()))
            w.add_cell(c, "ok", None, True, {})
    return w.dir


def run_cli(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="testbed")
    cli_results.add_commands(parser.add_subparsers(dest="cmd", required=True))
    args = parser.parse_args(argv)
    return args.func(args)


def pngs(html: str) -> list[Image.Image]:
    return [Image.open(io.BytesIO(base64.b64decode(b)))
            for b in re.findall(r'src="data:image/png;base64,([A-Za-z0-9+/=]+)"', html)]


def inked(img: Image.Image) -> float:
    """Fraction of pixels that are not (near) white."""
    a = np.asarray(img.convert("RGB")).astype(int)
    return float((a.min(axis=2) < 235).mean())


# --------------------------------------------------------------------------- the page

def test_report_is_self_contained_with_three_real_plots(tmp_path):
    rec = compare.load(write_run(tmp_path, "r1", failed=1))
    html = report.render(report.build([rec], generated="2026-11-22T00:00:00Z"))
    assert not re.search(r'(src|href)="(https?:)?//', html)           # nothing fetched
    assert "<script" not in html and "<link" not in html
    images = pngs(html)
    assert len(images) == 3
    for img in images:
        assert img.width >= 500 and img.height >= 300
        assert 0.03 < inked(img) < 0.6, "a plot should have lines and text, not be blank"
    for title in ("Throughput against connections", "Latency percentiles against MTU",
                  "CPU cost and efficiency per mode"):
        assert title in html
    assert "Gbit/s per host core" in html and "host µs per trans" in html
    assert "TCG" not in html.split("<body>")[1].split('id="environment"')[0]


def test_tcg_runs_get_a_banner_and_values_are_escaped(tmp_path):
    rec = compare.load(write_run(tmp_path, "r1", failed=1, cpu_model="<b>EPYC</b>", **TCG))
    html = report.render(report.build([rec], generated="now"))
    assert 'class="banner tcg"' in html and report.TCG_BANNER in html
    assert "&lt;b&gt;EPYC&lt;/b&gt;" in html and "<b>EPYC</b>" not in html
    assert "netperf: timed out &lt;after&gt; 30 s" in html                # failures listed


def test_baseline_comparison_on_the_page(tmp_path):
    base = compare.load(write_run(tmp_path, "base", seed=1, reps=5))
    new = compare.load(write_run(tmp_path, "new", seed=2, k=0.6, reps=5))
    tcg = compare.load(write_run(tmp_path, "tcg", seed=3, **TCG))
    rep = report.build([base, new, tcg], generated="now", baseline=base)
    assert [rc.new.run_id for rc in rep.comparisons] == ["new", "tcg"]
    html = report.render(rep)
    assert "gate fails" in html and 'class="verdict regressed"' in html
    assert "not compared" in html and "NEVER COMPARABLE" in html


def test_runs_with_different_tools_and_a_dead_run_line_up(tmp_path):
    full = compare.load(write_run(tmp_path, "full", attachments=("bridge",), conns=(1,),
                                  versions={"qemu": "8.2.0", "uperf": "1.0.8"}))
    dead = compare.load(write_run(tmp_path, "dead", reps=0, attachments=("bridge",), conns=(1,)))
    rep = report.build([dead, full], generated="now")
    html = report.render(rep)
    row = re.search(r"<tr><th>uperf</th>(.*?)</tr>", html).group(1)
    assert row == "<td>-</td><td>1.0.8</td>"
    # one connection count, two MTUs: lines along MTU only
    assert [p.title for p in rep.plots] == ["Throughput against MTU", "Latency percentiles against MTU",
                                           "CPU cost and efficiency per mode"]


def test_default_shaped_run_draws_bars_per_mode_with_intervals(tmp_path):
    """The default run's shape (three modes, one MTU, one connection count): bars."""
    rec = compare.load(write_run(tmp_path, "three", reps=3, attachments=("bridge", "ovs", "macvtap"),
                                 mtus=(1500,), conns=(1,)))
    rep = report.build([rec], generated="now")
    (plot,) = rep.plots
    assert plot.title == "Per mode: rate and CPU per unit of traffic"
    (img,) = pngs(report.render(rep))
    assert 0.03 < inked(img) < 0.6


def test_single_sample_runs_render(tmp_path):
    """Like the real TCG run: one sample per cell, one MTU, one connection count."""
    rec = compare.load(write_run(tmp_path, "one", reps=1, attachments=("bridge",), mtus=(1500,),
                                 conns=(1,), **TCG))
    rep = report.build([rec], generated="now", baseline=rec)
    # nothing varies but the mode: bars side by side, no dots on empty axes
    assert [p.title for p in rep.plots] == ["Per mode: rate and CPU per unit of traffic"]
    assert rep.comparisons == ()
    assert "Comparison with baseline" not in report.render(rep)


# --------------------------------------------------------------------------- CSV and CLI

def test_csv_has_every_sample_with_metrics_and_cpu(tmp_path):
    rec = compare.load(write_run(tmp_path, "r1", reps=2, failed=1, attachments=("bridge",),
                                 mtus=(1500,), conns=(1,)))
    buf = io.StringIO()
    assert report.write_csv([rec], buf) == 6
    rows = list(csv.DictReader(io.StringIO(buf.getvalue())))
    assert len(rows) == 6
    assert list(rows[0])[:3] == ["run_id", "seq", "cell_id"]
    ok = [r for r in rows if r["status"] == "ok"]
    assert all(r["host_cores"] and r["guest_cores"] for r in ok)
    assert {r["profile"] for r in ok if r["throughput_mbps"]} == {"tcp_stream"}
    assert {r["profile"] for r in ok if r["transactions_per_s"]} == {"tcp_rr"}
    bad = [r for r in rows if r["status"] == "failed"]
    assert len(bad) == 2 and all(r["reason"].startswith("netperf: timed out") for r in bad)
    assert all(r["throughput_mbps"] == "" for r in bad)


def test_report_command_writes_html_and_csv_and_includes_the_baseline(tmp_path, capsys):
    write_run(tmp_path, "base", seed=1, attachments=("bridge",), conns=(1,), reps=5)
    write_run(tmp_path, "new", seed=2, attachments=("bridge",), conns=(1,), reps=5)
    out = tmp_path / "out" / "report.html"
    assert run_cli(["report", "new", "--baseline", "base", "-o", str(out), "--csv",
                    str(tmp_path / "out" / "all.csv"), "--results", str(tmp_path)]) == 0
    html = out.read_text()
    # 5 samples a side may not show every cell unchanged (equivalence needs the interval
    # within the threshold): undecided is as valid a gate line here as passes
    assert "<code>base</code> &rarr; <code>new</code>" in html
    assert "gate passes" in html or "gate undecided" in html
    assert (out.stat().st_mode & 0o777) == 0o644
    # header + 2 runs x 4 cells x 5 samples
    assert len((tmp_path / "out" / "all.csv").read_text().splitlines()) == 1 + 2 * 4 * 5
    assert "2 runs, 3 plots" in capsys.readouterr().err
    assert run_cli(["export-csv", "base", "--results", str(tmp_path)]) == 0
    assert capsys.readouterr().out.startswith("run_id,seq,cell_id,")


# --------------------------------------------------------------------------- in a browser

def _chromium() -> str | None:
    for name in ("/usr/bin/chromium", "chromium", "chromium-browser"):
        found = shutil.which(name)
        if found:
            return found
    return None


PLOT_COLOURS = [(31, 119, 180), (255, 127, 14), (44, 160, 44), (214, 39, 40)]   # C0..C3


def test_report_shows_plots_in_headless_chromium(tmp_path):
    browser = _chromium()
    if browser is None:
        pytest.skip("Chromium not installed (Debian: apt-get install -y chromium)")
    page = tmp_path / "report.html"
    rec = compare.load(write_run(tmp_path, "r1", failed=1, **TCG))
    page.write_text(report.render(report.build([rec], generated="now")))
    shot = tmp_path / "out.png"
    # under the test's own tmp_path: a Chromium helper still writing after the browser has
    # gone recreated a profile folder removed in /tmp, which stayed there
    profile = tmp_path / "chromium-profile"
    profile.mkdir()
    try:
        proc.run([browser, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                  "--no-first-run", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync", f"--user-data-dir={profile}",
                  f"--screenshot={shot}", "--window-size=1200,2000", page.as_uri()],
                 timeout=120)
    finally:
        shutil.rmtree(profile, ignore_errors=True)
    img = np.asarray(Image.open(shot).convert("RGB")).astype(int)
    assert img.shape[:2] == (2000, 1200)
    assert (img.min(axis=2) < 235).mean() > 0.05, "the page is blank"
    # Pixels in matplotlib's first line colours can only come from the plots.
    near = np.zeros(img.shape[:2], dtype=bool)
    for colour in PLOT_COLOURS:
        near |= (np.abs(img - np.array(colour)).max(axis=2) <= 12)
    ys, xs = np.nonzero(near)
    assert near.sum() > 2000, f"only {near.sum()} plot-coloured pixels: plots not shown"
    assert xs.max() - xs.min() > 400 and ys.max() - ys.min() > 200, "plot lines span too little"
