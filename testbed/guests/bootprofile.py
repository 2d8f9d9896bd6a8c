"""Where a cold boot's time goes, read from inside the guest (through its agent).

Three sources that can contradict each other: systemd's own account (`systemd-analyze
time`: kernel, initrd, userspace; `blame`: each unit's start time; `critical-chain`), cloud-
init's account of its stages (`cloud-init analyze show`: the time inside each stage, which
starts only once Python has imported cloud-init), and the console, where cloud-init prints
the guest's uptime as each stage starts and as it finishes. A stage's unit time minus its
stage time is Python start-up and imports, which under TCG is most of it (the testbed's
image runs both stages in one process, so its final stage's difference is only reading
the configuration in the running process; images/debian12/files/cloud-init-boot).

The parsers are pure and tested on output captured from the testbed's guest
(suites/unit/test_bootprofile.py); `collect` runs the commands through a guest agent.
"""
from __future__ import annotations

import re

#: cloud-init stage (as `cloud-init analyze` names it) -> the systemd unit that runs it
STAGE_UNITS = {"init-local": "cloud-init-local.service", "init-network": "cloud-init.service",
               "modules-config": "cloud-config.service", "modules-final": "cloud-final.service"}

_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)\s*(h|min|ms|us|µs|s)(?![a-z])")
_UNIT_SECONDS = {"h": 3600.0, "min": 60.0, "s": 1.0, "ms": 1e-3, "us": 1e-6, "µs": 1e-6}


def duration_s(text: str) -> float | None:
    """Pure: systemd's time span ('1min 2.345s', '345ms', '2.1s') in seconds."""
    parts = _DURATION_PART.findall(text)
    if not parts:
        return None
    return round(sum(float(v) * _UNIT_SECONDS[u] for v, u in parts), 3)


def parse_time(text: str) -> dict[str, float]:
    """Pure: `systemd-analyze time` -> {kernel_s, initrd_s, userspace_s, total_s} (those
    present); {} when the boot had not finished or the output is not understood."""
    m = re.search(r"Startup finished in (.*?)=\s*([^\n]+)", text)
    if not m:
        return {}
    out = {}
    for span, what in re.findall(r"([^+()]+?)\s*\((\w+)\)", m.group(1)):
        d = duration_s(span)
        if d is not None:
            out[f"{what}_s"] = d
    total = duration_s(m.group(2))
    if total is not None:
        out["total_s"] = total
    return out


def parse_blame(text: str) -> list[tuple[str, float]]:
    """Pure: `systemd-analyze blame` -> [(unit, seconds)], slowest first."""
    rows = []
    for line in text.splitlines():
        m = re.match(r"\s*(.+?)\s+(\S+\.(?:service|mount|device|socket|target|path|timer|scope|slice|swap))\s*$",
                     line)
        if m:
            d = duration_s(m.group(1))
            if d is not None:
                rows.append((m.group(2), d))
    return sorted(rows, key=lambda r: -r[1])


def parse_critical_chain(text: str) -> list[dict]:
    """Pure: `systemd-analyze critical-chain UNIT` -> [{unit, at_s, took_s}], from the
    unit asked about down to the first one of the chain."""
    rows = []
    for line in text.splitlines():
        m = re.match(r"[\s│└├─]*(\S+)\s+@(.+?)(?:\s+\+(.+))?$", line)
        if m and "." in m.group(1):
            at = duration_s(m.group(2))
            if at is None:
                continue
            rows.append({"unit": m.group(1), "at_s": at,
                         "took_s": duration_s(m.group(3)) if m.group(3) else None})
    return rows


def parse_cloud_init_stages(text: str) -> dict[str, float]:
    """Pure: `cloud-init analyze show` (the last boot record) -> {stage: seconds}."""
    records = re.split(r"-- Boot Record \d+ --", text)
    last = records[-1] if records else text
    return {s: float(v) for s, v in re.findall(r"Finished stage: \((\S+)\) ([\d.]+) seconds", last)}


def parse_console(text: str) -> dict[str, float]:
    """Pure: the guest's uptime when each cloud-init stage printed its banner (after Python
    start-up), and when cloud-init finished, from the console log: {stage: uptime_s}."""
    out = {}
    for stage, up in re.findall(r"Cloud-init v\. \S+ running '([^']+)' at [^\n]*?Up ([\d.]+) seconds", text):
        out[stage] = float(up)
    m = re.findall(r"Cloud-init v\. \S+ finished at [^\n]*?Up ([\d.]+) seconds", text)
    if m:
        out["finished"] = float(m[-1])
    return out


def breakdown(*, time_text: str, blame_text: str, chain_text: str, analyze_text: str,
              console_text: str, top: int = 8) -> dict:
    """Pure: the parsed sources, and per cloud-init stage its unit's time next to the
    stage's own (the difference: Python start-up and imports)."""
    blame = parse_blame(blame_text)
    units = dict(blame)
    stages = parse_cloud_init_stages(analyze_text)
    per_stage = []
    for stage, unit in STAGE_UNITS.items():
        if stage in stages or unit in units:
            u, s = units.get(unit), stages.get(stage)
            per_stage.append({"stage": stage, "unit": unit, "unit_s": u, "stage_s": s,
                              "startup_s": round(u - s, 2) if u is not None and s is not None else None})
    return {"systemd": parse_time(time_text), "top_units": blame[:top], "cloud_init": per_stage,
            "critical_chain": parse_critical_chain(chain_text), "console": parse_console(console_text)}


def format_breakdown(b: dict) -> list[str]:
    """Pure: the breakdown as lines for `testbed bench boot`."""
    lines = []
    t = b.get("systemd") or {}
    if t:
        parts = [f"{k.removesuffix('_s')} {t[k]:.2f} s" for k in ("firmware_s", "loader_s", "kernel_s", "initrd_s",
                                                                  "userspace_s") if k in t]
        lines.append(f"  systemd-analyze time  {' + '.join(parts)} = {t.get('total_s', 0):.2f} s")
    else:
        lines.append("  systemd-analyze time  - (boot not finished or not reported)")
    if b.get("cloud_init"):
        lines.append("  cloud-init stage      unit (systemd)  stage (cloud-init)  start-up (difference)")
        for s in b["cloud_init"]:
            lines.append(f"    {s['stage']:<19} {_s(s['unit_s']):>14}  {_s(s['stage_s']):>18}  "
                         f"{_s(s['startup_s']):>21}")
    con = b.get("console") or {}
    if con:
        lines.append("  console (guest uptime)  " + ", ".join(f"{k} {v:.1f} s" for k, v in con.items()))
    if b.get("top_units"):
        lines.append("  slowest units         " + ", ".join(f"{u} {s:.2f} s" for u, s in b["top_units"]))
    chain = b.get("critical_chain") or []
    if chain:
        lines.append("  critical chain        " + " <- ".join(
            f"{c['unit']} @{c['at_s']:.1f}" + (f" +{c['took_s']:.1f}" if c["took_s"] is not None else "")
            for c in chain))
    return lines


def _s(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f} s"


#: The commands run in the guest, in order; systemctl first waits for the boot to finish
#: (cloud-final is still running when boot-finished appears), or systemd-analyze refuses.
COMMANDS = {
    "wait": ["/bin/systemctl", "is-system-running", "--wait"],
    "time": ["/usr/bin/systemd-analyze", "time"],
    "blame": ["/usr/bin/systemd-analyze", "blame", "--no-pager"],
    "chain": ["/usr/bin/systemd-analyze", "critical-chain", "--no-pager", "cloud-final.service"],
    "analyze": ["/usr/bin/cloud-init", "analyze", "show"],
}


def collect(agent, console_text: str, timeout: float = 120) -> dict:
    """Run COMMANDS through ``agent`` (a testbed.guests.guest.Agent) and parse what they print.
    A command that fails leaves its part empty and its reason under ``failed``."""
    out, failed = {}, []
    for name, argv in COMMANDS.items():
        try:
            res = agent.run(argv, check=False, timeout=timeout)
        except Exception as e:   # noqa: BLE001 - a missing breakdown part is reported, not fatal
            failed.append(f"{' '.join(argv)}: {e}")
            out[name] = ""
            continue
        out[name] = res.stdout
        if res.rc != 0 and name not in ("wait",):
            failed.append(f"{' '.join(argv)}: rc {res.rc}: {(res.stderr or res.stdout).strip()[:200]}")
    b = breakdown(time_text=out["time"], blame_text=out["blame"], chain_text=out["chain"],
                  analyze_text=out["analyze"], console_text=console_text)
    b["system_state"] = out["wait"].strip()
    b["failed"] = failed
    return b
