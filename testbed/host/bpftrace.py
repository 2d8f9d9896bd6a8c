"""bpftrace (Debian's package) on a kernel: its version, and which of the probes per-hop
tracing uses (testbed.measure.hops) attach there, found by attaching them.

A kernel offers the device tracepoints (``net:net_dev_queue``,
``net:netif_receive_skb``) and, for the socket ends, tracepoints (recent kernels:
``tcp:tcp_sendmsg_locked``, ``sock:sock_recv_length``), fentry or kprobes (Debian 12's
6.1), or none; each combination is a :class:`Flavour`, tried best first.
"""
from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

from testbed.errors import CommandError
from testbed.host import proc, tracefs

BPFTRACE = "bpftrace"
#: entries of bpftrace's maps (its default, 4096, is less than a busy second's packets in flight
#: between two points when a direction's end is lost)
ENV = {"BPFTRACE_MAP_KEYS_MAX": "65536"}
VERSION_RE = re.compile(r"bpftrace v?(\d+(?:\.\d+)+)")


@dataclass(frozen=True)
class Flavour:
    """The probes a kernel offers for the socket ends. Tracepoints where the kernel has
    them (recent 6.x kernels: tcp_sendmsg_locked, sock_recv_length); else fentry (kfuncs:
    Debian 12's 6.1 guests), else kprobes on the same functions; none: the stack hops are
    not observed."""

    name: str
    send_probe: str | None
    recv_probe: str | None
    recv_sk: str = ""
    recv_len: str = ""
    #: where data is queued to a socket, right after the last device's receive on that CPU
    ready_probe: str = ""
    ready_sk: str = ""
    #: the device transmit tracepoint: net_dev_queue fires as a packet is queued to a device
    #: (dev_queue_xmit: a stack's send, a bridge's forward, OVS's packet socket). It records
    #: three fields where net_dev_start_xmit fills some twenty, and every packet on the host
    #: pays for that fill whatever the program does with it; its time stamp is before the
    #: device's egress qdisc, so a packet's wait there falls in the hop after it
    xmit_event: str = "net_dev_queue"


TRACEPOINTS = Flavour("tracepoints", "tracepoint:tcp:tcp_sendmsg_locked", "tracepoint:sock:sock_recv_length",
                      recv_sk="args->sk", recv_len="(args->family == 2 ? args->ret : 0)",
                      ready_probe="tracepoint:sock:sk_data_ready", ready_sk="args->skaddr")
#: fentry (BPF trampolines, where the kernel has them: Debian 12's 6.1 guests): no breakpoint
#: trap per call, which a kprobe takes and which costs most under emulation (TCG)
KFUNCS = Flavour("kfuncs", "kfunc:tcp_sendmsg", "kfunc:tcp_cleanup_rbuf", recv_sk="args->sk",
                 recv_len="(int32)args->copied", ready_probe="kfunc:tcp_data_ready", ready_sk="args->sk")
KPROBES = Flavour("kprobes", "kprobe:tcp_sendmsg", "kprobe:tcp_cleanup_rbuf", recv_sk="arg0",
                  recv_len="(int32)arg1", ready_probe="kprobe:tcp_data_ready", ready_sk="arg0")
#: kernels whose tcp_data_ready is inlined: the socket's default callback instead
KPROBES_READABLE = Flavour("kprobes", "kprobe:tcp_sendmsg", "kprobe:tcp_cleanup_rbuf", recv_sk="arg0",
                           recv_len="(int32)arg1", ready_probe="kprobe:sock_def_readable", ready_sk="arg0")
DEVICES_ONLY = Flavour("devices-only", None, None)
FLAVOURS = (TRACEPOINTS, KFUNCS, KPROBES, KPROBES_READABLE, DEVICES_ONLY)

_DEVICES = ("tracepoint:net:net_dev_queue { $s = (struct sk_buff *)args->skbaddr; @x = count(); }\n"
            "tracepoint:net:netif_receive_skb { $s = (struct sk_buff *)args->skbaddr; @r = count(); }\n")


def probe_program(f: Flavour) -> str:
    """A program that attaches to every probe flavour ``f`` uses, then exits."""
    ends = "" if f.send_probe is None else (f"{f.send_probe} {{ @a = count(); }}\n{f.recv_probe} {{ @b = count(); }}\n"
                                            f"{f.ready_probe} {{ @c = count(); }}\n")
    return _DEVICES + ends + "BEGIN { exit(); }\n"


def probe(run: Callable[[list[str]], tuple[int, str]]) -> tuple[Flavour | None, str]:
    """The best flavour a kernel attaches (found by trying: ``run(argv)`` gives rc and
    output there), and a line saying what was found."""
    rc, out = run([BPFTRACE, "--version"])
    m = VERSION_RE.search(out)
    if rc != 0 or not m:
        return None, "bpftrace not installed (Debian package bpftrace)"
    found = m.group(1)
    tried = []
    for f in FLAVOURS:
        rc, out = run([BPFTRACE, "-e", probe_program(f)])
        if rc == 0:
            why = f"; socket probes: {'; '.join(tried)}" if tried else ""
            what = "device tracepoints only, no socket probes" if f is DEVICES_ONLY else \
                f"device tracepoints and socket {f.name}"
            return f, f"bpftrace {found}: {what}{why}"
        tried.append(f"{f.name}: {last_error(out)}")
    return None, f"bpftrace {found} attaches none of its probes here: {'; '.join(tried)}"


def last_error(out: str) -> str:
    """The line of bpftrace's output that says what went wrong."""
    lines = [ln.strip() for ln in out.splitlines() if ln.strip() and "RLIMIT_MEMLOCK" not in ln]
    errs = [ln for ln in lines if "ERROR" in ln or "FATAL" in ln] or lines
    return (errs[-1] if errs else "no output")[:200]


def version(run: Callable[[list[str]], tuple[int, str]]) -> str | None:
    rc, out = run([BPFTRACE, "--version"])
    m = VERSION_RE.search(out)
    return m.group(1) if rc == 0 and m else None


def run_local(argv: list[str]) -> tuple[int, str]:
    try:
        res = proc.run(argv, check=False, timeout=60, env=ENV)
    except CommandError as e:
        return 127 if e.rc is None else e.rc, str(e)
    return res.rc, res.stdout + res.stderr


_HOST: list[tuple[Flavour | None, str]] = []


def host_flavour() -> tuple[Flavour | None, str]:
    """This host's best flavour and what was found, once per process (tracefs mounted for
    the try when it was not, and unmounted after)."""
    if not _HOST:
        with tracefs.available() as why:
            _HOST.append((None, f"tracefs: {why}") if why else probe(run_local))
    return _HOST[0]


__all__ = ["BPFTRACE", "DEVICES_ONLY", "ENV", "FLAVOURS", "Flavour", "KFUNCS", "KPROBES", "TRACEPOINTS", "host_flavour",
           "last_error", "probe", "probe_program", "run_local", "version"]
