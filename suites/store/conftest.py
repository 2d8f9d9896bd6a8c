"""A throwaway PostgreSQL server for the store tier, started by the tests themselves.

No systemd and no running cluster needed: initdb + pg_ctl (Debian 12's postgresql package,
/usr/lib/postgresql/<v>/bin) in a temporary directory, as the ``postgres`` user when run as
root, listening on 127.0.0.1 and a unix socket in that directory, on a free port, with
trust auth. It is stopped and deleted in a finalizer. When the binaries are missing and we
are root, ``apt-get install -y postgresql`` is tried once. Every failure becomes a skip that
names what is missing.

``TESTBED_PG_URL=postgresql://...`` uses an existing server instead (CI with a service).
Each test gets a fresh database on the server, dropped afterwards.

The runs the tests index are written from the real TCG run 20261122T030019Z-a0e9 (kept
here verbatim, since results/ is not in git), with the numbers varied.
"""
from __future__ import annotations

import contextlib
import glob
import json
import os
import pwd
import secrets
import shutil
import socket
import tempfile
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import pytest

from testbed.errors import CommandError
from testbed.host import proc


def _pg_bindir() -> Path | None:
    for d in sorted(glob.glob("/usr/lib/postgresql/*/bin"),
                    key=lambda p: int(Path(p).parent.name) if Path(p).parent.name.isdigit() else 0,
                    reverse=True):
        if os.access(f"{d}/initdb", os.X_OK) and os.access(f"{d}/pg_ctl", os.X_OK):
            return Path(d)
    return None


def _install() -> str | None:
    """Try apt-get once; returns why it could not, or None."""
    if os.geteuid() != 0:
        return "not root, so cannot apt-get install postgresql"
    if not shutil.which("apt-get"):
        return "no apt-get on this machine"
    env = {"DEBIAN_FRONTEND": "noninteractive"}
    try:
        try:
            proc.run(["apt-get", "install", "-y", "-q", "postgresql"], timeout=900, env=env)
        except CommandError:
            proc.run(["apt-get", "update", "-q"], timeout=600, env=env)
            proc.run(["apt-get", "install", "-y", "-q", "postgresql"], timeout=900, env=env)
    except CommandError as e:
        return f"apt-get install postgresql failed: {e}"
    return None


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def throwaway_postgres() -> Iterator[str]:
    """Start a PostgreSQL server; yields its admin URL. Raises RuntimeError with a reason."""
    bindir = _pg_bindir()
    if bindir is None:
        why = _install()
        bindir = _pg_bindir()
        if bindir is None:
            raise RuntimeError("PostgreSQL server binaries (initdb, pg_ctl under /usr/lib/"
                               "postgresql/*/bin) not found; "
                               + (why or "apt-get install postgresql did not provide them"))
    as_user: list[str] = []
    base = Path(tempfile.mkdtemp(prefix="tb-pg-"))
    if os.geteuid() == 0:
        # initdb refuses to run as root; the server runs as the package's postgres user.
        try:
            pw = pwd.getpwnam("postgres")
        except KeyError:
            shutil.rmtree(base, ignore_errors=True)
            raise RuntimeError("running as root but there is no 'postgres' user to run "
                               "the server") from None
        if not shutil.which("runuser"):
            shutil.rmtree(base, ignore_errors=True)
            raise RuntimeError("running as root but runuser (util-linux) is missing")
        os.chown(base, pw.pw_uid, pw.pw_gid)
        as_user = ["runuser", "-u", "postgres", "--"]
    data, log = base / "data", base / "server.log"
    port = _free_port()
    started = False
    try:
        proc.run([*as_user, bindir / "initdb", "-D", data, "-U", "postgres", "--auth=trust",
                  "-E", "UTF8", "--locale=C", "--no-sync"], timeout=180)
        # Appended as root into a postgres-owned file: the owner does not change.
        with (data / "postgresql.conf").open("a") as f:
            f.write(f"\nlisten_addresses = '127.0.0.1'\nport = {port}\n"
                    f"unix_socket_directories = '{base}'\nfsync = off\n"
                    "synchronous_commit = off\nfull_page_writes = off\nmax_connections = 30\n"
                    "shared_buffers = 32MB\n")
        proc.run([*as_user, bindir / "pg_ctl", "-D", data, "-l", log, "-w", "-t", "60", "start"],
                 timeout=90)
        started = True
        yield f"postgresql://postgres@127.0.0.1:{port}/postgres"
    except CommandError as e:
        tail = log.read_text(errors="replace")[-1500:] if log.exists() else ""
        raise RuntimeError(f"could not start PostgreSQL: {e}\n{tail}") from None
    finally:
        if started:
            with contextlib.suppress(CommandError):
                proc.run([*as_user, bindir / "pg_ctl", "-D", data, "-m", "immediate", "-w",
                          "stop"], timeout=60)
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture(scope="session")
def pg_server() -> Iterator[str]:
    """Admin URL of a PostgreSQL server: TESTBED_PG_URL, or one started for this session."""
    if os.environ.get("TESTBED_PG_URL"):
        yield os.environ["TESTBED_PG_URL"]
        return
    try:
        import psycopg  # noqa: F401
    except ImportError:
        pytest.skip("psycopg (3) is not installed: pip install the project's dependencies")
    cm = throwaway_postgres()
    try:
        url = cm.__enter__()
    except RuntimeError as e:
        pytest.skip(str(e))
    try:
        yield url
    finally:
        cm.__exit__(None, None, None)


@pytest.fixture
def pg_url(pg_server: str) -> Iterator[str]:
    """A fresh, empty database on the server, dropped after the test."""
    import psycopg
    name = f"tb_{secrets.token_hex(4)}"
    with psycopg.connect(pg_server, autocommit=True) as admin:
        admin.execute(f"CREATE DATABASE {name}")
    yield urlunsplit(urlsplit(pg_server)._replace(path=f"/{name}"))
    with psycopg.connect(pg_server, autocommit=True) as admin:
        admin.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


# --------------------------------------------------------------------------- runs

#: environment, topology and both samples of the real run 20261122T030019Z-a0e9
REAL_RUN_JSON = (
    '{"environment":{"accelerator":"tcg","comparable_class":"tcg-functional-only","cpu_mhz":2596.'
    '122,"cpu_model":"AMD EPYC","cpus":2,"host":"vm","image":{"digest":"e20ee5c55fe078c0","kernel'
    '":"6.1.0-50-cloud-amd64","name":"debian12"},"kernel":"6.18.44-fc-v657","memory_bytes":252765'
    '10208,"testbed":"0.1.0","testbed_commit":"d6800139120fc68de412c6e70d58b214b39ff809","version'
    's":{"iperf3":"3.12","libvirt":"9.0.0","netperf":"2.7.0","ovs":"3.1.0","qemu":"7.2.22","uperf'
    '":null},"vhost_net":false},"samples":[{"cell":{"attachment":"bridge","backend":"qemu","conne'
    'ctions":1,"id":"bridge-qemu-mtu1500-conn1-tcp_stream","mtu":1500,"profile":"tcp_stream","too'
    'l":"netperf"},"cpu":{"guest":{"g1":{"busy":0.8724,"idle":0.0916,"iowait":0.0,"irq":0.0,"nice'
    '":0.0,"softirq":0.1484,"steal":0.0,"system":0.6796,"user":0.0443},"g2":{"busy":0.6092,"idle"'
    ':0.3056,"iowait":0.0,"irq":0.0,"nice":0.0,"softirq":0.2882,"steal":0.0,"system":0.3152,"user'
    '":0.0058}},"host":{"busy":1.6081,"idle":0.3054,"iowait":0.001,"irq":0.0,"nice":0.0,"softirq"'
    ':0.0019,"steal":0.001,"system":0.4991,"user":1.1061},"host_per_cpu":{"cpu0":{"busy":0.7988,"'
    'idle":0.1763,"iowait":0.0,"irq":0.0,"nice":0.0,"softirq":0.0019,"steal":0.0,"system":0.2939,'
    '"user":0.503},"cpu1":{"busy":0.8103,"idle":0.1291,"iowait":0.0,"irq":0.0,"nice":0.0,"softirq'
    '":0.001,"steal":0.0,"system":0.2062,"user":0.6032}},"named":{"ksoftirqd":0.0,"ovs-vswitchd":'
    '0.0},"per_guest":{"g1":{"emulator":0.2785,"iothread":0.0,"total":0.9202,"vcpu":0.6417,"vhost'
    '":0.0},"g2":{"emulator":0.2197,"iothread":0.0,"total":0.7342,"vcpu":0.5145,"vhost":0.0}},"wi'
    'ndow_s":10.379},"ended":"2026-11-22T03:01:18.904+00:00","extra":{"start_skew_s":0.0355,"tap_'
    'mbps_rx_tx":{"tb-a0e9-t0":[2157.692,0.677],"tb-a0e9-t1":[0.677,2157.692]},"warnings":[]},"me'
    'trics":{"bytes":2793734144.0,"duration_s":10.01,"latency_max_us":20452.0,"latency_mean_us":5'
    '6.79,"latency_min_us":5.0,"latency_p50_us":16.0,"latency_p90_us":64.0,"latency_p99_us":729.0'
    ',"latency_stddev_us":314.18,"local_cpu_pct":92.91,"local_sd_us_per_kb":3.41,"remote_cpu_pct"'
    ':68.87,"remote_sd_us_per_kb":2.527,"retransmits":1.0,"throughput_mbps":2232.23},"placement":'
    '{"g1":"local","g2":"local"},"raw":["raw/bridge-qemu-mtu1500-conn1-tcp_stream/rep0-client0.ou'
    't"],"reason":null,"rep":0,"run_id":"20261122T030019Z-a0e9","started":"2026-11-22T03:01:07.80'
    '6+00:00","status":"ok","warmup":false},{"cell":{"attachment":"bridge","backend":"qemu","conn'
    'ections":1,"id":"bridge-qemu-mtu1500-conn1-tcp_rr","mtu":1500,"profile":"tcp_rr","tool":"net'
    'perf"},"cpu":{"guest":{"g1":{"busy":0.2515,"idle":0.6277,"iowait":0.0,"irq":0.0,"nice":0.0,"'
    'softirq":0.0624,"steal":0.0,"system":0.1637,"user":0.0253},"g2":{"busy":0.2505,"idle":0.6287'
    ',"iowait":0.0,"irq":0.0,"nice":0.0,"softirq":0.0751,"steal":0.0,"system":0.1676,"user":0.007'
    '8}},"host":{"busy":1.3433,"idle":0.7121,"iowait":0.0,"irq":0.0,"nice":0.0,"softirq":0.0019,"'
    'steal":0.0,"system":0.4725,"user":0.8689},"host_per_cpu":{"cpu0":{"busy":0.6566,"idle":0.341'
    '9,"iowait":0.0,"irq":0.0,"nice":0.0,"softirq":0.0,"steal":0.001,"system":0.2708,"user":0.384'
    '8},"cpu1":{"busy":0.6868,"idle":0.3702,"iowait":0.0,"irq":0.0,"nice":0.0,"softirq":0.0019,"s'
    'teal":0.0,"system":0.2016,"user":0.4832}},"named":{"ksoftirqd":0.0,"ovs-vswitchd":0.0},"per_'
    'guest":{"g1":{"emulator":0.2542,"iothread":0.0,"total":0.6555,"vcpu":0.4013,"vhost":0.0},"g2'
    '":{"emulator":0.2133,"iothread":0.0,"total":0.565,"vcpu":0.3517,"vhost":0.0}},"window_s":10.'
    '266},"ended":"2026-11-22T03:01:30.932+00:00","extra":{"start_skew_s":0.0225,"tap_mbps_rx_tx"'
    ':{"tb-a0e9-t0":[0.884,0.884],"tb-a0e9-t1":[0.884,0.884]},"warnings":[]},"metrics":{"bytes":3'
    '3784.0,"duration_s":10.0,"latency_max_us":10886.0,"latency_mean_us":588.97,"latency_min_us":'
    '293.0,"latency_p50_us":545.0,"latency_p90_us":736.0,"latency_p99_us":1322.0,"latency_stddev_'
    'us":358.34,"local_cpu_pct":28.13,"remote_cpu_pct":28.97,"retransmits":0.0,"transactions_per_'
    's":1688.402},"placement":{"g1":"local","g2":"local"},"raw":["raw/bridge-qemu-mtu1500-conn1-t'
    'cp_rr/rep0-client0.out"],"reason":null,"rep":0,"run_id":"20261122T030019Z-a0e9","started":"2'
    '026-11-22T03:01:20.303+00:00","status":"ok","warmup":false}],"topology":{"accelerator":"auto'
    '","client":"g1","guests":[{"host":"local","image":null,"memory_mib":1024,"name":"g1","vcpus"'
    ':1},{"host":"local","image":null,"memory_mib":1024,"name":"g2","vcpus":1}],"hosts":[{"name":'
    '"local","ssh_target":null,"transport":"local","uri":"qemu:///system"}],"matrix":{"attachment'
    's":["bridge"],"backends":["qemu"],"connections":[1],"mtus":[1500],"profiles":[{"duration_s":'
    '10,"message_size":16384,"name":"tcp_stream","pattern":"stream","protocol":"tcp","rate_bps":n'
    'ull,"response_size":null,"tool":"netperf"},{"duration_s":10,"message_size":1,"name":"tcp_rr"'
    ',"pattern":"rr","protocol":"tcp","rate_bps":null,"response_size":1,"tool":"netperf"}],"rando'
    'mize":false,"repetitions":{"max_samples":1,"min_samples":1,"rsd_target":0.05,"warmup":0},"se'
    'ed":0},"name":"default","server":"g2","source":"<builtin default>","subnet":"198.18.0.0/24"}'
    '}'
)


def write_run(root: Path, run_id: str, *, scale: float = 1.0, reps: int = 3,
              mtus: tuple[int, ...] = (1500,), failed: int = 0, warmup: int = 0,
              status: str = "complete", **env: object) -> Path:
    """A run directory in the real format: the real run's environment, topology and samples,
    with MTUs, repetitions, failures and warmups varied and metrics scaled."""
    real = json.loads("".join(REAL_RUN_JSON))
    d = root / run_id
    d.mkdir(parents=True)
    topology = json.loads(json.dumps(real["topology"]))
    topology["matrix"]["mtus"] = list(mtus)
    lines, cells, n_failed = [], [], 0
    for mtu in mtus:
        for tmpl in real["samples"]:
            cell = {**tmpl["cell"], "mtu": mtu,
                    "id": tmpl["cell"]["id"].replace("mtu1500", f"mtu{mtu}")}
            for rep in range(warmup + reps + failed):
                s = json.loads(json.dumps(tmpl))
                s.update(run_id=run_id, cell=cell, warmup=rep < warmup,
                         rep=rep if rep < warmup else rep - warmup)
                if rep >= warmup + reps:
                    s.update(status="failed", reason=f"netperf timed out (rep {s['rep']})",
                             metrics={}, cpu={}, raw=[])
                    n_failed += 1
                else:
                    k = scale * (1 + 0.01 * rep) * (mtu / 1500) ** 0.5
                    s["metrics"] = {m: v * k for m, v in s["metrics"].items()}
                lines.append(json.dumps(s, sort_keys=True))
            cells.append({**cell, "status": "partial" if failed else "ok",
                          "reason": "netperf timed out" if failed else None, "converged": False,
                          "summary": {"throughput_mbps": {"n": reps, "mean": 1.0}}})
    run = {"format_version": 1, "run_id": run_id, "status": status,
           "started": "2026-11-22T03:00:21.896+00:00", "ended": "2026-11-22T03:01:35.333+00:00",
           "topology": topology, "environment": {**real["environment"], **env},
           "counts": {"samples": len(lines), "failed": n_failed, "boots": 2},
           "cells": cells if status != "failed" else [], "notes": [], "guests": {}}
    if status == "failed":
        lines = []
        run["error"] = "guest tb-1a46-g1: hot-plug failed: No more available PCI slots"
    (d / "run.json").write_text(json.dumps(run, indent=2, sort_keys=True))
    (d / "samples.jsonl").write_text("".join(line + "\n" for line in lines))
    return d


@pytest.fixture
def results_root(tmp_path: Path) -> Path:
    """Three runs: the real one as recorded, a varied one (two MTUs, warmups, failures), and
    one that died before its first cell."""
    root = tmp_path / "results"
    write_run(root, "20261122T030019Z-a0e9", reps=1)
    write_run(root, "20261123T030000Z-b1b1", scale=0.9, reps=3, mtus=(1500, 9000), failed=1,
              warmup=1, status="complete-with-failures")
    write_run(root, "20261122T025932Z-1a46", status="failed")
    return root
