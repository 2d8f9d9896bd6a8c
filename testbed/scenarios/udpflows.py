"""Many UDP flows of small datagrams, for study C's flow-cache experiment.

netperf and iperf3 open one socket per stream and cannot make 2048 distinct flows; this
sends round-robin over N connected sockets (N source ports, one destination), as fast as
one core allows, and prints one JSON line. The receiving side only binds the port (so no
ICMP port-unreachable comes back); what the switch delivered is read from the receiving
interface's rx_packets counter by the caller, not from this program.

    python -m testbed.scenarios.udpflows send DST PORT FLOWS SECONDS SIZE
    python -m testbed.scenarios.udpflows sink PORT SECONDS
"""
from __future__ import annotations

import json
import resource
import socket
import sys
import time


def send(dst: str, port: int, flows: int, seconds: float, size: int) -> dict:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    need = flows + 64
    if soft < need:
        resource.setrlimit(resource.RLIMIT_NOFILE, (max(need, soft), max(need, hard)))
    socks = []
    for _ in range(flows):
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        s.setblocking(False)
        s.connect((dst, port))
        socks.append(s)
    payload = b"\0" * size
    sent = errors = 0
    start = time.monotonic()
    end = start + seconds
    while time.monotonic() < end:
        for s in socks:
            try:
                s.send(payload)
                sent += 1
            except OSError:
                errors += 1
    return {"sent": sent, "errors": errors, "seconds": time.monotonic() - start, "flows": flows}


def sink(port: int, seconds: float) -> dict:
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind(("0.0.0.0", port))
    time.sleep(seconds)
    return {"bound": port}


def main(argv: list[str]) -> int:
    if argv[0] == "send":
        out = send(argv[1], int(argv[2]), int(argv[3]), float(argv[4]), int(argv[5]))
    else:
        out = sink(int(argv[1]), float(argv[2]))
    print(json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
