"""A study's result, typed: the tables a scenario reports in, with the study's published figure
beside the measured one, the environment difference, and a verdict per finding.

Here (not in testbed.scenarios) so that reporting reads a study's result without importing
the scenarios that produce it. Pure data, its JSON form (``study.json`` in the run
directory) and its text.
"""
from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

FILE = "study.json"


class Verdict(StrEnum):
    HELD = "held"
    NOT_HELD = "did not hold"
    NOT_MEASURABLE = "not measurable here"


@dataclass(frozen=True)
class Finding:
    claim: str                 # what the study found, in its words and figures
    rule: str                  # how "held" is decided from the measured table
    verdict: Verdict
    evidence: str              # the measured numbers behind the verdict, or why not measurable


@dataclass(frozen=True)
class Table:
    title: str
    columns: tuple[str, ...]
    rows: tuple[tuple[str, ...], ...]
    note: str = ""


@dataclass(frozen=True)
class StudyReport:
    scenario: str
    study: str
    quick: bool
    #: (aspect, the study's, here): hardware, kernel, accelerator, datapath, tool
    environment: tuple[tuple[str, str, str], ...]
    tables: tuple[Table, ...]
    findings: tuple[Finding, ...]
    caveats: tuple[str, ...] = ()
    run_id: str | None = None
    extra_runs: tuple[str, ...] = field(default_factory=tuple)

    def to_dict(self) -> dict[str, Any]:
        return json.loads(json.dumps(asdict(self)))

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> StudyReport:
        return cls(scenario=str(d["scenario"]), study=str(d["study"]), quick=bool(d["quick"]),
                   environment=tuple(tuple(e) for e in d.get("environment") or ()),  # type: ignore[misc]
                   tables=tuple(Table(t["title"], tuple(t["columns"]),
                                      tuple(tuple(r) for r in t["rows"]), t.get("note") or "")
                                for t in d.get("tables") or ()),
                   findings=tuple(Finding(f["claim"], f["rule"], Verdict(f["verdict"]),
                                          f["evidence"]) for f in d.get("findings") or ()),
                   caveats=tuple(d.get("caveats") or ()), run_id=d.get("run_id"),
                   extra_runs=tuple(d.get("extra_runs") or ()))


def write(run_dir: Path, rep: StudyReport) -> Path:
    from testbed.records.results import atomic_write
    p = run_dir / FILE
    atomic_write(p, json.dumps(rep.to_dict(), indent=2))
    p.chmod(0o644)
    return p


def load(run_dir: Path) -> StudyReport | None:
    p = Path(run_dir) / FILE
    return StudyReport.from_dict(json.loads(p.read_text())) if p.is_file() else None


def render_text(rep: StudyReport | Mapping[str, Any]) -> str:
    """Plain text of a study report (typed, or the dict form written to study.json)."""
    r = rep if isinstance(rep, StudyReport) else StudyReport.from_dict(rep)
    out = [f"scenario {r.scenario}{' (quick)' if r.quick else ''}: {r.study}",
           f"run {r.run_id}" + (f" (+ {', '.join(r.extra_runs)})" if r.extra_runs else ""),
           "", "environment difference (study | here):"]
    out += [f"  {a:<12} {s} | {h}" for a, s, h in r.environment]
    for t in r.tables:
        out += ["", t.title]
        widths = [max(len(str(x)) for x in col) for col in zip(t.columns, *t.rows)]
        for row in (t.columns, *t.rows):
            out.append("  " + "  ".join(str(x).ljust(w) for x, w in zip(row, widths)).rstrip())
        if t.note:
            out.append(f"  note: {t.note}")
    out += ["", "findings:"]
    for f in r.findings:
        out.append(f"  [{f.verdict}] {f.claim}")
        out.append(f"      rule: {f.rule}; measured: {f.evidence}")
    for c in r.caveats:
        out.append(f"caveat: {c}")
    return "\n".join(out) + "\n"
