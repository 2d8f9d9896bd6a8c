"""The shape every scenario reports in: tables with the study's published figure beside the
measured one, the environment difference, and a verdict per finding. Pure data + text.

A verdict is computed from the measured table by a rule stated in the finding's ``rule``;
a finding that does not hold here is reported as such, never tuned away. TCG figures are
functional checks: their verdicts carry that caveat.
"""
from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
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


def write(run_dir: Path, rep: StudyReport) -> Path:
    from testbed.results import atomic_write
    p = run_dir / FILE
    atomic_write(p, json.dumps(rep.to_dict(), indent=2))
    p.chmod(0o644)
    return p


def load(run_dir: Path) -> dict[str, Any] | None:
    p = Path(run_dir) / FILE
    return json.loads(p.read_text()) if p.is_file() else None


def fmt(v: float | None, digits: int = 3) -> str:
    """A measured or published number; None (not measured / not published) is '-'."""
    if v is None:
        return "-"
    if abs(v) >= 10 ** digits:
        return f"{v:.0f}"
    return f"{v:.{digits}g}"


def env_difference(study_env: Mapping[str, str], here: Mapping[str, Any],
                   extra: Sequence[tuple[str, str, str]] = ()) -> tuple[tuple[str, str, str], ...]:
    """The labelled environment difference: hardware, kernel, accelerator (+ scenario extras)."""
    accel = here.get("accelerator") or "none"
    accel_here = {"none": "none: host namespaces only, no guests",
                  "tcg": "TCG (emulated CPU): functional check only",
                  "kvm": "KVM"}.get(accel, accel)
    cpus = here.get("cpus")
    mhz = here.get("cpu_mhz")
    hw = f"{here.get('cpu_model') or '?'}" + (f", {cpus} CPUs" if cpus else "") + \
        (f" at {mhz / 1000:.2f} GHz" if isinstance(mhz, (int, float)) else "")
    return (("hardware", study_env.get("hardware", "-"), hw),
            ("kernel", study_env.get("kernel", "-"), f"Linux {here.get('kernel', '?')}"),
            ("accelerator", study_env.get("accelerator", "-"), accel_here), *extra)


def ratio_verdict(ok: bool | None) -> Verdict:
    if ok is None:
        return Verdict.NOT_MEASURABLE
    return Verdict.HELD if ok else Verdict.NOT_HELD


def render_text(rep: Mapping[str, Any]) -> str:
    """Plain text of a study report (the dict form, as written to study.json)."""
    out = [f"scenario {rep['scenario']}{' (quick)' if rep['quick'] else ''}: {rep['study']}",
           f"run {rep.get('run_id')}" + (f" (+ {', '.join(rep['extra_runs'])})" if rep.get("extra_runs") else ""),
           "", "environment difference (study | here):"]
    out += [f"  {a:<12} {s} | {h}" for a, s, h in rep["environment"]]
    for t in rep["tables"]:
        out += ["", t["title"]]
        widths = [max(len(str(x)) for x in col) for col in zip(t["columns"], *t["rows"])]
        for r in (t["columns"], *t["rows"]):
            out.append("  " + "  ".join(str(x).ljust(w) for x, w in zip(r, widths)).rstrip())
        if t.get("note"):
            out.append(f"  note: {t['note']}")
    out += ["", "findings:"]
    for f in rep["findings"]:
        out.append(f"  [{f['verdict']}] {f['claim']}")
        out.append(f"      rule: {f['rule']}; measured: {f['evidence']}")
    for c in rep.get("caveats") or ():
        out.append(f"caveat: {c}")
    return "\n".join(out) + "\n"
