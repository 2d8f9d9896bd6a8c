"""nuttcp UDP at a constant bit rate (study A): argv and a pure parser of ``-fparse`` output.

nuttcp is not one of the runner's tools (it measures loss at a target rate, not a maximum
rate), so it has its own small record: one ``Interval`` per ``-i`` line and the final
summary, whose ``tx_cpu``/``rx_cpu`` are nuttcp's own sender and receiver CPU %.
Real output: suites/unit/fixtures/nuttcp (SOURCES.md says how it was made).
"""
from __future__ import annotations

import re
from dataclasses import dataclass

PORT = 5000
_KV = re.compile(r"(\w+)=(\S+)")


@dataclass(frozen=True)
class Interval:
    seconds: float
    mbps: float
    dropped: int
    packets: int
    loss_pct: float


@dataclass(frozen=True)
class NuttcpResult:
    ok: bool
    reason: str | None
    intervals: tuple[Interval, ...] = ()
    mbps: float | None = None
    dropped: int | None = None
    packets: int | None = None
    loss_pct: float | None = None
    tx_cpu_pct: float | None = None
    rx_cpu_pct: float | None = None


def server_argv(port: int = PORT) -> list[str]:
    return ["nuttcp", "-S", "--nofork", f"-P{port}"]


def client_argv(server: str, *, rate: str, length: int = 8000, streams: int = 4,
                seconds: int = 10, window: str = "4m", port: int = PORT) -> list[str]:
    """The study's ``-l8000 -u -w4m -R20G -i1 -N4``, rate and duration as given."""
    return ["nuttcp", f"-P{port}", "-fparse", f"-l{length}", "-u", f"-w{window}", f"-R{rate}",
            "-i1", f"-N{streams}", f"-T{seconds}", server]


def parse(stdout: str, stderr: str = "", rc: int = 0) -> NuttcpResult:
    intervals: list[Interval] = []
    final: dict[str, str] | None = None
    for line in stdout.splitlines():
        kv = dict(_KV.findall(line))
        if "real_sec" in kv:
            intervals.append(Interval(float(kv["real_sec"]), float(kv["rate_Mbps"]), int(kv["drop"]),
                                      int(kv["pkt"]), float(kv["data_loss"])))
        elif "real_seconds" in kv:
            final = kv
    if rc != 0 or final is None:
        text = " | ".join(x.strip() for x in (stderr + "\n" + stdout).splitlines() if x.strip()
                          and "=" not in x)
        why = f"nuttcp exited {rc}" if rc != 0 else "nuttcp printed no summary line"
        return NuttcpResult(False, f"{why}: {text[-300:] or 'no output'}", tuple(intervals))
    if float(final.get("megabytes", "nan")) == 0 and int(final.get("pkt", "0")) > 0:
        # The control connection worked but the receiver got none of the datagrams: the data
        # path is broken, which is not a loss rate to report (a 0 would stand as one).
        return NuttcpResult(False, f"nuttcp: the receiver got none of the {final['pkt']} datagrams sent "
                            f"(data_loss={final.get('data_loss', '?')}%): the path carried no test traffic",
                            tuple(intervals))
    cpu = lambda k: float(final[k].rstrip("%")) if k in final else None  # noqa: E731
    return NuttcpResult(True, None, tuple(intervals), float(final["rate_Mbps"]), int(final["drop"]),
                        int(final["pkt"]), float(final["data_loss"]), cpu("tx_cpu"), cpu("rx_cpu"))
