"""The public surface: testbed.api's names and signatures, the per-sample hook protocol, and
the pytest plugin's options, markers and fixtures are pinned here. A change to any of them is
deliberate: it goes in the changelog, and an old form stays (with a deprecation warning) for
a release. The API is also used for real on recorded runs."""
from __future__ import annotations

import dataclasses
import inspect
import shutil
from pathlib import Path

import pytest

from testbed import api, pytest_plugin
from testbed.measure import hooks

FIXTURES = Path(__file__).resolve().parent / "fixtures"
EXAMPLES = Path(__file__).resolve().parents[2] / "examples"

SIGNATURES = {
    "load_topology": "(path: 'PathLike') -> 'Topology'",
    "parse_topology": "(text: 'str', source: 'str' = '<string>', base: 'PathLike | None' = None) -> 'Topology'",
    "default_topology": "(attachments: 'Sequence[str] | None' = None) -> 'Topology'",
    "plan": "(topology: 'Topology | PathLike') -> 'list[Cell]'",
    "run": "(topology: 'Topology | PathLike', *, progress: 'Callable[[str], None] | None' = None, "
           "resume: 'PathLike | None' = None, hooks: 'Sequence[SampleHook]' = (), index: 'bool' = True) "
           "-> 'Outcome'",
    "open_run": "(ref: 'PathLike', results_dir: 'PathLike | None' = None) -> 'RunRecord'",
    "find_run": "(ref: 'PathLike', results_dir: 'PathLike | None' = None) -> 'Path'",
    "list_runs": "(results_dir: 'PathLike | None' = None) -> 'list[Path]'",
    "index_run": "(run_dir: 'PathLike', db: 'str | None' = None) -> 'None'",
    "compare": "(base: 'PathLike | RunRecord', new: 'PathLike | RunRecord | None' = None, *, "
               "variants: 'tuple[str, str] | None' = None, threshold: 'float' = 0.05, alpha: 'float' = 0.05, "
               "force: 'bool' = False, results_dir: 'PathLike | None' = None, **options: 'Any') -> 'RunComparison'",
    "render_comparison": "(comparison: 'RunComparison', *, fmt: 'str' = 'text') -> 'str'",
    "history": "(*, cell: 'str | None' = None, metric: 'str | None' = None, threshold: 'float' = 0.05, "
               "by: 'str' = 'host', results_dir: 'PathLike | None' = None, db: 'str | None' = None) "
               "-> 'list[Series]'",
    "capacity": "(run: 'PathLike | RunRecord', profile: 'str', *, host_cores: 'float | None' = None, "
                "headroom: 'float' = 0.2, results_dir: 'PathLike | None' = None, **options: 'Any') -> 'Plan | Any'",
    "write_report": "(runs: 'Sequence[PathLike | RunRecord]', output: 'PathLike', *, "
                    "baseline: 'PathLike | RunRecord | None' = None, results_dir: 'PathLike | None' = None) "
                    "-> 'Path'",
}
CLASSES = {"Outcome", "SampleHook", "SampleWindow", "Finding", "RunRecord", "SampleRecord", "CellOutcome",
           "Topology", "Cell", "Profile", "Attachment", "Backend", "Pattern", "Accelerator",
           "TestbedError", "ConfigError", "CapabilityError"}


def test_the_public_names_are_exactly_these():
    assert set(api.__all__) == set(SIGNATURES) | CLASSES
    for name in CLASSES:
        assert inspect.isclass(getattr(api, name)), name


@pytest.mark.parametrize("name", sorted(SIGNATURES))
def test_each_public_function_keeps_its_signature(name):
    fn = getattr(api, name)
    assert str(inspect.signature(fn)) == SIGNATURES[name]
    assert fn.__doc__ and len(fn.__doc__) > 40, f"{name} needs a docstring: the API reference is built from it"


def test_the_records_and_the_hook_protocol_keep_their_fields():
    assert [f.name for f in dataclasses.fields(api.Outcome)] == ["run_dir", "status", "samples", "failed"]
    assert [f.name for f in dataclasses.fields(api.Finding)] == ["metrics", "data", "failure"]
    assert [f.name for f in dataclasses.fields(api.SampleWindow)] == \
        ["cell", "rep", "warmup", "paths", "qemu_pids", "attempt"]
    assert {n for n in ("name", "applies", "window", "finding") if hasattr(api.SampleHook, n)} == \
        {"name", "applies", "window", "finding"}
    for name in ("status", "reason", "metrics", "cpu", "cell", "rep", "warmup", "ok"):
        assert hasattr(api.SampleRecord, name) or name in {f.name for f in dataclasses.fields(api.SampleRecord)}


def test_the_plugin_keeps_its_options_markers_and_fixtures():
    fixtures = {n for n, v in vars(pytest_plugin).items() if hasattr(v, "_pytestfixturefunction")
                or type(v).__name__ == "FixtureFunctionDefinition"}
    assert fixtures == {"testbed_cell", "testbed_run", "testbed_guests", "testbed_accelerator",
                        # deprecated older names, kept for a release
                        "accelerator", "guest_pair", "run_writer"}
    assert [m.split("(", 1)[0] for m in pytest_plugin.MARKERS] == ["testbed", "testbed_floor", "attach"]
    assert set(pytest_plugin.PROFILES) == {"tcp_stream", "tcp_maerts", "tcp_rr", "tcp_crr", "udp_stream", "udp_rr"}
    assert [n for n in ("id", "metric", "accelerator", "floor", "samples", "cell", "topology", "measure")
            if not hasattr(pytest_plugin.CellUnderTest, n) and n not in
            {f.name for f in dataclasses.fields(pytest_plugin.CellUnderTest)}] == []


def test_the_api_reads_validates_and_plans_a_topology(tmp_path):
    t = api.load_topology(EXAMPLES / "variants" / "nic-rings.yaml")
    cells = api.plan(t)
    assert cells and all(isinstance(c, api.Cell) for c in cells)
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\nmatrix:\n  attachments: [brigde]\n  profiles: [{name: tcp_rr, pattern: rr}]\n")
    with pytest.raises(api.ConfigError, match=r"bad\.yaml.*matrix\.attachments\[0\]"):
        api.load_topology(bad)
    # a path plans as its topology does; one mode named alone is that mode, not its letters
    assert [c.id for c in api.plan(EXAMPLES / "variants" / "nic-rings.yaml")] == [c.id for c in cells]
    assert {c.attachment.value for c in api.plan(api.default_topology("bridge"))} == {"bridge"}


def test_every_public_name_is_on_the_reference_page():
    page = (Path(__file__).resolve().parents[2] / "docs" / "reference" / "api.md").read_text()
    assert [n for n in api.__all__ if f"::: testbed.api.{n}\n" not in page] == []


def test_the_api_opens_compares_and_reports_recorded_runs(tmp_path):
    root = tmp_path / "results"
    root.mkdir()
    shutil.copytree(FIXTURES / "runs" / "format2", root / "run-a")
    shutil.copytree(FIXTURES / "runs" / "format2", root / "run-b")
    run = api.open_run("run-a", results_dir=root)
    assert isinstance(run, api.RunRecord) and run.samples and isinstance(run.samples[0], api.SampleRecord)
    assert [p.name for p in api.list_runs(root)] == ["run-a", "run-b"]
    verdict = api.compare("run-a", "run-b", results_dir=root)
    assert verdict.refused is None and verdict.exit_status in (0, 5)
    assert "cells" in api.render_comparison(verdict) and api.render_comparison(verdict, fmt="json").startswith("{")
    with pytest.raises(api.ConfigError, match="fmt: 'xml': expected text, json or junit"):
        api.render_comparison(verdict, fmt="xml")
    with pytest.raises(api.TestbedError):          # as its docstring says: no such run
        api.open_run("run-c", results_dir=root)
    out = api.write_report([run], tmp_path / "report.html")
    assert run.run_id in out.read_text()
    api.index_run(root / "run-a")
    assert (root / "index.sqlite").is_file()
    assert isinstance(api.history(results_dir=root), list)


def test_a_hooks_findings_fold_into_the_sample():
    class Cost(api.SampleHook):
        name = "cost"

        def finding(self, window, sample):
            return api.Finding(metrics={"cost_ns_per_packet": 12.5}, data={"basis": "host"})

    metrics, extra = {"throughput_mbps": 100.0}, {}
    assert hooks.apply([(Cost(), Cost().finding(None, None))], metrics, extra) is None
    assert metrics == {"throughput_mbps": 100.0, "cost_ns_per_packet": 12.5} and extra == {"cost": {"basis": "host"}}
    # a hook that would overwrite a measured figure, or fails, fails the sample with its name
    assert hooks.apply([(Cost(), api.Finding(metrics={"throughput_mbps": 1.0}))], dict(metrics), {}) == \
        "cost: would overwrite measured throughput_mbps"
    assert hooks.apply([(Cost(), api.Finding(failure="tracer lost 3 events"))], {}, {}) == \
        "cost: tracer lost 3 events"
