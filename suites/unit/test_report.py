"""testbed.analysis.report: a self-contained HTML page with interactive plots, and the CSV of
every sample. Samples the noise guard measured again are "retried", never "failed", in the
same words as `testbed run`'s last line.

The last test opens the page in headless Chromium with no network and checks that the
figures are drawn, with their intervals and n; it is skipped when Chromium is not installed
(Debian: apt-get install -y chromium).
"""
from __future__ import annotations

import argparse
import base64
import csv
import io
import json
import re
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from testbed.analysis import compare, report, report_interactive
from testbed.cli import results as cli_results
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


#: the noise guard's record of a real sample taken while other work used 1.22 cores
#: (a TCG bridge run on a shared 2-core host)
NOISE = {"action": "retried", "attempt": 0, "harness_cores": 0.0151, "noisy": True, "other_cores": 1.2213,
         "run_queue_max": 11, "run_queue_mean": 8.52, "run_queue_threshold": None, "threshold_cores": 0.5}


def write_run(root: Path, run_id: str, *, k: float = 1.0, reps: int = 4, failed: int = 0,
              seed: int = 0, attachments=("bridge", "ovs"), mtus=(1500, 9000),
              conns=(1, 2, 4), retried: int = 0, kept_noisy: int = 0, **env) -> Path:
    """Stream and rr cells over attachments x MTUs x connections, numbers shaped like the
    real run 20261122T030019Z-a0e9 (2.2 Gbit/s, 1700 tps, p99 1.3 ms), 3 % noise. Per cell,
    ``retried`` samples the noise guard set aside before the ok ones, and the last
    ``kept_noisy`` ok samples kept although noisy."""
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
        if retried or kept_noisy:
            w.update(noise_guard={"threshold_cores": 0.5, "action": "retry", "max_retries": 3})
        for c in cells:
            f = (0.8 if c.attachment == Attachment("ovs") else 1.0) * k
            for attempt in range(retried):
                w.add_sample(SampleRecord.new(
                    run_id, c.as_dict(), 0, False, "noisy", "noisy: 1.22 cores used by other work (threshold 0.5)",
                    {"throughput_mbps": 1.0} if c.profile is STREAM else {"transactions_per_s": 1.0},
                    cpu(1.9, 1.0), now(), now(), extra={"noise": {**NOISE, "attempt": attempt}}))
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
                marked = {"noise": {**NOISE, "action": "kept", "attempt": retried}} if rep >= reps - kept_noisy else {}
                w.add_sample(SampleRecord.new(run_id, c.as_dict(), rep, False, "ok", None, m,
                                              cpu(load, load * 0.8), now(), now(), extra=marked))
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


def figures_of(html: str) -> list[list[dict]]:
    """The traces of every Plotly figure on the page, as the page hands them to Plotly."""
    dec = json.JSONDecoder()
    return [dec.raw_decode(html, m.end())[0] for m in re.finditer(r'Plotly\.newPlot\(\s*"[^"]+",\s*', html)]


# --------------------------------------------------------------------------- the page

def test_report_is_self_contained_with_three_real_plots(tmp_path):
    rec = compare.load(write_run(tmp_path, "r1", failed=1))
    html = report.render(report.build([rec], generated="2026-11-22T00:00:00Z"))
    lib = report_interactive.plotly_js().replace("</script", "<\\/script")
    assert html.count(lib) == 1                                     # plotly.js inlined, once
    assert not re.search(r'(src|href)="(https?:)?//', html.replace(lib, ""))    # nothing fetched
    assert "<link" not in html
    figs = figures_of(html)
    assert len(figs) == 3
    for traces in figs:
        assert traces and all(t["y"] for t in traces)
    # four ok samples a cell: every rate point has its interval and n=4
    [tput] = [f for f in figs if any(t.get("error_y") for t in f)][:1]
    assert all(len(t["error_y"]["array"]) == len(t["y"]) for t in tput)
    assert all("n=4" in c for t in tput for c in t["customdata"])
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
    # every cell 40 % down: the night's shift fails the gate (one finding, not a regression a cell)
    assert "gate fails" in html and "the night's shift" in html
    assert "not compared" in html and "NEVER COMPARABLE" in html


def test_an_undecided_comparison_is_not_shown_as_a_pass(tmp_path):
    """Two 2-sample runs of the same levels: every cell has too few samples to be decided
    (exit 5). The section under the table said "Gate passes." for that; it says undecided."""
    base = compare.load(write_run(tmp_path, "base", seed=1, reps=2))
    new = compare.load(write_run(tmp_path, "new", seed=2, reps=2))
    rep = report.build([base, new], generated="now", baseline=base)
    (rc,) = rep.comparisons
    assert rc.exit_status == compare.UNDECIDED_STATUS
    section = report.render(rep).split('id="comparison"')[1].split('id="environment"')[0]
    assert "Gate passes." not in section
    assert f"Gate undecided (exit 5): {len(rc.undecided)} cell" in section and "not a pass" in section


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
    """The default run's shape (three modes, one MTU, one connection count): bars, n= on each."""
    rec = compare.load(write_run(tmp_path, "three", reps=3, attachments=("bridge", "ovs", "macvtap"),
                                 mtus=(1500,), conns=(1,)))
    rep = report.build([rec], generated="now")
    (plot,) = rep.plots
    assert plot.title == "Per mode: rate and CPU per unit of traffic"
    assert [n for _, n in plot.panels] == [1, 1, 1, 1]          # stream and rr: rate and cost
    (traces,) = figures_of(report.render(rep))
    rate = traces[0]
    assert rate["type"] == "bar" and rate["x"] == ["bridge/qemu", "macvtap/qemu", "ovs/qemu"]
    assert rate["text"] == ["n=3"] * 3 and len(rate["error_y"]["array"]) == 3


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


def test_retried_samples_are_never_failures_and_the_report_says_what_stderr_says(tmp_path, capsys):
    """Noise retries on a busy host: the cell table, the header and the sections call them
    retried, the failed count stays what really failed, a sample kept noisy is marked, and
    the summary is the line `testbed run` prints on stderr (report.status_line)."""
    write_run(tmp_path, "busy", reps=2, retried=2, kept_noisy=1, failed=1, attachments=("bridge",),
              mtus=(1500,), conns=(1,), **TCG)
    rec = compare.load("busy", tmp_path)
    line = report.status_line(rec)
    assert line == "status: complete-with-failures, 10 samples: 4 ok, 2 failed, 4 retried (host busy), 2 kept noisy"
    assert run_cli(["report", "busy", "--results", str(tmp_path)]) == 0      # no -o: the run's folder
    html = (tmp_path / "busy" / "report.html").read_text()
    assert line in html
    text = re.sub(r"<[^>]+>", "", html)
    assert "2 / 1 / 2" in text                                       # ok / failed / retried, per cell
    assert "busy: 2 failed" in text and "busy: 4 retried" in text and "busy: 2 kept noisy" in text
    failed = html.split('id="failures"')[1].split("</section>")[0]
    assert "noisy" not in failed and failed.count("<li>") == 2
    assert "The host was busy with other work" in html and "other work on the host used more than 0.5 cores" in html
    # what the retried samples measured is in no figure
    assert all(1.0 not in t["y"] for f in figures_of(html) for t in f)


# --------------------------------------------------------------------------- in a browser

PLOT_COLOURS = [(31, 119, 180), (255, 127, 14), (44, 160, 44), (214, 39, 40)]   # C0..C3


def test_report_draws_its_figures_in_headless_chromium_with_no_network(tmp_path, chromium):
    page = tmp_path / "report.html"
    rec = compare.load(write_run(tmp_path, "r1", failed=1, retried=1, **TCG))
    page.write_text(report.render(report.build([rec], generated="now")))
    tab = chromium.open(page.as_uri())
    tab.wait("document.querySelectorAll('.js-plotly-plot .main-svg').length >= 3", "three figures drawn")
    drawn = tab.js("""Array.from(document.querySelectorAll('.js-plotly-plot')).map(g => ({
        traces: g.querySelectorAll('.scatterlayer .trace, .barlayer .trace').length,
        errorbars: g.querySelectorAll('.errorbar').length}))""")
    assert len(drawn) == 3 and all(d["traces"] > 0 for d in drawn), drawn
    assert sum(d["errorbars"] for d in drawn) > 10, drawn          # the intervals are drawn
    assert not tab.errors, tab.errors
    assert [u for u in tab.requests if not u.startswith(("file:", "data:", "blob:", "about:"))] == []
    # seen, not only in the DOM: pixels in the series' colours can only come from the figures
    shot = chromium.call("Page.captureScreenshot", {"format": "png", "captureBeyondViewport": True,
                                                    "clip": {"x": 0, "y": 0, "width": 1200, "height": 2400,
                                                             "scale": 1}}, session=tab.session)
    img = np.asarray(Image.open(io.BytesIO(base64.b64decode(shot["data"]))).convert("RGB")).astype(int)
    near = np.zeros(img.shape[:2], dtype=bool)
    for colour in PLOT_COLOURS:
        near |= (np.abs(img - np.array(colour)).max(axis=2) <= 12)
    ys, xs = np.nonzero(near)
    assert near.sum() > 2000, f"only {near.sum()} plot-coloured pixels: plots not shown"
    assert xs.max() - xs.min() > 400 and ys.max() - ys.min() > 200, "plot lines span too little"
    text = tab.js("document.body.innerText")
    assert "retried" in text and "Retried and noisy samples" in text
