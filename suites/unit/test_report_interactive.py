"""The report's interactive plots (testbed.analysis.report_interactive): built from a run in the real
format with a rate search, histograms and paced loads; the page carries plotly.js itself;
and in headless Chromium with no network at all (its own network namespace) the plots
render and a real mouse move over a point brings up its hover label.

Chromium is the suite's `chromium` fixture (suites/conftest.py); skipped when Chromium is not
installed (Debian: apt-get install -y chromium)."""
from __future__ import annotations

from pathlib import Path

import pytest

from testbed.analysis import compare, report, report_interactive, slo
from testbed.records.results import RunWriter, SampleRecord, now
from testbed.topology.model import (
    Attachment,
    Backend,
    Cell,
    GuestSpec,
    HostSpec,
    Matrix,
    Pattern,
    Profile,
    Protocol,
    RateSearch,
    Tool,
    Topology,
)

pytestmark = pytest.mark.unit

NDR = Profile("udp_ndr", tool=Tool("iperf3"), protocol=Protocol.UDP, message_size=1472, duration_s=2,
              search=RateSearch(trial_s=(1, 2)))
RR = Profile("tcp_rr", pattern=Pattern.RR, message_size=1, response_size=1)


def paced(tps: int) -> Profile:
    return Profile("tcp_rr_paced", pattern=Pattern.RR, message_size=1, response_size=1, rate_tps=tps,
                   rate=f"{tps}tps")


def write(root: Path) -> Path:
    profiles = (NDR, RR, paced(1000), paced(4000))
    topo = Topology("t", "<test>", (HostSpec("local"),), (GuestSpec("g1", "local"), GuestSpec("g2", "local")),
                    "g1", "g2", Matrix((Attachment("bridge"),), (Backend.QEMU,), (1500,), (1,), profiles))
    env = {"accelerator": "kvm", "comparable_class": "kvm", "cpu_model": "AMD EPYC", "cpus": 2}
    with RunWriter(root, "r1", topo, env) as w:
        c = Cell(Attachment("bridge"), Backend.QEMU, 1500, 1, NDR)
        for i, (mbps, loss) in enumerate(((40.0, 0.5), (19.0, 0.0), (21.0, 0.05), (19.8, 0.0))):
            trial = {"index": i, "intended_duration_s": 1.0, "offered_mbps": mbps, "loss_ratio": loss,
                     "wire": {"verdict": "ok"}}
            w.add_sample(SampleRecord.new("r1", c.as_dict(), i, False, "ok", None,
                                          {"throughput_mbps": mbps * (1 - loss)}, {}, now(), now(),
                                          extra={"trial": trial}))
        w.add_cell(c, "ok", None, True, {}, extra={"search": {
            "ndr": {"lower_mbps": 19.8, "upper_mbps": 21.0}, "pdr": {"lower_mbps": 19.8, "upper_mbps": 21.0}}})
        c = Cell(Attachment("bridge"), Backend.QEMU, 1500, 1, RR)
        hist = [[100, 200, 30000], [200, 300, 4000], [1000, 2000, 90]]
        for rep in range(3):
            w.add_sample(SampleRecord.new("r1", c.as_dict(), rep, False, "ok", None,
                                          {"transactions_per_s": 3400.0, "latency_p50_us": 150.0},
                                          {}, now(), now(), extra={"histogram": hist, "percentiles": [
                                    {"p": 50.0, "value_us": 150.0, "sufficient": True, "source": "histogram"},
                                    {"p": 99.9, "value_us": 1900.0, "sufficient": True, "source": "histogram"}]}))
        w.add_cell(c, "ok", None, True, {})
        for tps, p99 in ((1000, 300.0), (4000, 900.0)):
            c = Cell(Attachment("bridge"), Backend.QEMU, 1500, 1, paced(tps))
            w.add_sample(SampleRecord.new(
                "r1", c.as_dict(), 0, False, "ok", None,
                {"transactions_per_s": tps * 0.99, "latency_p99_us": p99, "latency_p50_us": p99 / 3},
                {}, now(), now(), extra={"latency_loop": "closed-loop (coordinated omission)"}))
            w.add_cell(c, "ok", None, True, {})
    return w.dir


def test_the_plots_are_built_from_the_records(tmp_path):
    rec = compare.load(write(tmp_path))
    titles = [p.title for p in report_interactive.plots(rec and [rec])]
    assert titles == ["Latency CDF", "Latency against load", "Rate search trials"]
    load = report_interactive.load_curve_plot([rec])
    assert "(closed-loop)" in load.html and "tb-load" in load.html
    search = report_interactive.search_plot([rec])
    assert "NDR 19.8 Mbit" in search.html      # plotly writes "/" as \\u002f in its JSON


def test_slo_plot_draws_the_bound():
    lv = [slo.Level(n, 1, w, w < 500, (), None, None) for n, w in ((1, 200.0), (2, 300.0), (4, 700.0))]
    a = slo.Answer(slo.parse("p99.9<500us@5000tps"), "bridge/qemu tcp_rr", tuple(lv), 2, lv[2], "x", 8)
    p = report_interactive.slo_plot([a])
    # plotly's JSON writes "<" as \u003c; the bound is drawn across the measured N
    assert "SLO p99.9\\u003c500us@5000tps" in p.html and p.title == "Capacity at p99.9<500us@5000tps"
    assert '"x":[1,4],"y":[500.0,500.0]' in p.html.replace(" ", "")


def test_the_page_carries_plotly_itself(tmp_path):
    rec = compare.load(write(tmp_path))
    page = report.render(report.build([rec], generated="now"))
    assert "cdn.plot.ly" not in page.split("<script>", 1)[0]
    assert page.count(report_interactive.plotly_js()[:2000]) == 1
    assert 'src="http' not in page and "src='http" not in page


# -- in a browser (the chromium fixture: suites/conftest.py) ----------------------------------

def test_plots_render_and_answer_hover_in_headless_chromium_with_no_network(tmp_path, chromium):
    rec = compare.load(write(tmp_path))
    page = tmp_path / "report.html"
    page.write_text(report.render(report.build([rec], generated="now")))
    tab = chromium.open(page.as_uri())
    tab.wait("document.querySelectorAll('.js-plotly-plot .main-svg').length >= 3", "the plots rendered")
    assert tab.js("typeof Plotly") == "object"
    # every interactive plot drew its traces
    assert tab.js("Array.from(document.querySelectorAll('.js-plotly-plot')).every("
                  "g => g.querySelectorAll('.scatterlayer .trace, .barlayer .trace').length > 0)")
    # a real mouse move over the first trial of the rate-search plot
    pos = tab.js("""(() => {
        const gd = document.getElementById('tb-search');
        gd.scrollIntoView();
        const xa = gd._fullLayout.xaxis, ya = gd._fullLayout.yaxis, r = gd.getBoundingClientRect();
        return [r.left + xa._offset + xa.d2p(gd.data[0].x[0]), r.top + ya._offset + ya.d2p(gd.data[0].y[0])];
    })()""")
    chromium.call("Input.dispatchMouseEvent", {"type": "mouseMoved", "x": pos[0] + 1, "y": pos[1] + 1},
                  session=tab.session)
    text = tab.wait("Array.from(document.querySelectorAll('#tb-search .hoverlayer .hovertext'))"
                    ".map(e => e.textContent).join(' | ')", "a hover label after moving the mouse over a point", 10)
    assert "trial 0 (1.00 s): 40.00 Mbit/s offered, loss 50.000%, wire ok" in text, text
    assert not tab.errors, tab.errors
    assert [u for u in tab.requests if not u.startswith(("file:", "data:", "blob:", "about:"))] == []


def test_open_and_closed_loop_samples_are_never_one_curve(tmp_path):
    """The same series measured open-loop (sockperf) in one run and closed-loop (uperf) in
    another: two curves, each labelled, never joined."""
    recs = []
    for run_id, tool, loop in (("ro", "sockperf", "open-loop"),
                               ("rc", "uperf", "closed-loop (coordinated omission: ...)")):
        profiles = tuple(Profile("rr", tool=Tool(tool), pattern=Pattern.RR, message_size=64, rate_tps=t,
                                 rate=f"{t}tps") for t in (1000, 4000))
        topo = Topology("t", "<test>", (HostSpec("local"),), (GuestSpec("g1", "local"), GuestSpec("g2", "local")),
                        "g1", "g2", Matrix((Attachment("bridge"),), (Backend.QEMU,), (1500,), (1,), profiles))
        with RunWriter(tmp_path, run_id, topo, {"accelerator": "tcg", "cpus": 2}) as w:
            for p in profiles:
                c = Cell(Attachment("bridge"), Backend.QEMU, 1500, 1, p)
                w.add_sample(SampleRecord.new(run_id, c.as_dict(), 0, False, "ok", None,
                                              {"transactions_per_s": float(p.rate_tps), "latency_p99_us": 300.0},
                                              {}, now(), now(), extra={"latency_loop": loop}))
                w.add_cell(c, "ok", None, True, {})
        recs.append(compare.load(w.dir))
    html = report_interactive.load_curve_plot(recs).html
    assert "p99 (open-loop) [ro]" in html and "p99 (closed-loop) [rc]" in html
    assert html.count('"mode":"lines+markers"') == 2
