"""The shape every scenario reports in: tables with the study's published figure beside the
measured one, the environment difference, and a verdict per finding. Pure data + text.

A verdict is computed from the measured table by a rule stated in the finding's ``rule``;
a finding that does not hold here is reported as such, never tuned away. TCG figures are
functional checks: their verdicts carry that caveat.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from testbed.records.records import Environment, as_environment

# The typed study result lives in testbed.records.study_result so that reporting need not import the
# scenarios; the names stay importable from here for the scenarios.
from testbed.records.study_result import FILE, Finding, StudyReport, Table, Verdict, load, render_text, write


def fmt(v: float | None, digits: int = 3) -> str:
    """A measured or published number; None (not measured / not published) is '-'."""
    if v is None:
        return "-"
    if abs(v) >= 10 ** digits:
        return f"{v:.0f}"
    return f"{v:.{digits}g}"


def env_difference(study_env: Mapping[str, str], here: Environment | Mapping[str, Any],
                   extra: Sequence[tuple[str, str, str]] = ()) -> tuple[tuple[str, str, str], ...]:
    """The labelled environment difference: hardware, kernel, accelerator (+ scenario extras)."""
    here = as_environment(here)
    accel = here.accelerator or "none"
    accel_here = {"none": "none: host namespaces only, no guests",
                  "tcg": "TCG (emulated CPU): functional check only",
                  "kvm": "KVM"}.get(accel, accel)
    cpus = here.cpus
    mhz = here.cpu_mhz
    hw = f"{here.cpu_model or '?'}" + (f", {cpus} CPUs" if cpus else "") + \
        (f" at {mhz / 1000:.2f} GHz" if isinstance(mhz, (int, float)) else "")
    return (("hardware", study_env.get("hardware", "-"), hw),
            ("kernel", study_env.get("kernel", "-"), f"Linux {here.kernel if 'kernel' in here.present else '?'}"),
            ("accelerator", study_env.get("accelerator", "-"), accel_here), *extra)


def ratio_verdict(ok: bool | None) -> Verdict:
    if ok is None:
        return Verdict.NOT_MEASURABLE
    return Verdict.HELD if ok else Verdict.NOT_HELD


__all__ = ["FILE", "Finding", "StudyReport", "Table", "Verdict", "env_difference", "fmt", "load",
           "ratio_verdict", "render_text", "write"]
