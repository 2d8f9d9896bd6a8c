"""`testbed fleet` for real: Ansible (ansible-core through ansible-runner) drives three sshd
targets on this machine, each listening in its own tb- network namespace on an address in
198.18.0.0/15, reached with a generated key and checked against a generated known_hosts.

The controller runs in a namespace of its own, wired to each target's namespace by a veth
pair: nothing gets an address in the root namespace. Each target has its own testbed home
(venv, results) and its own machine id (TESTBED_MACHINE_ID through the inventory's
testbed_machine_id), so one machine stands in for three hosts; the runs share the real host
lock and state folder as shared runs (testbed_shared_host: other tests' runs share the
machine meanwhile), so they run together and each records shared_host.

One fleet run: t0 completes; t1's sshd is killed while it runs, so t1 fails alone with its
reason; "imposter" is t2's sshd on a second port whose known_hosts entry holds another key,
so it is refused before anything runs there. Exit status 6 (some failed). Then the imposter's
known_hosts is put right and --retry-failed brings both in: exit 0. The store keeps one
history series per host; compare refuses two hosts' runs without --across-hosts.
"""
from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest

from testbed.host import proc
from testbed.measure.session import claim_tag, release_tag
from testbed._suite_plugin import sshd_privsep_dir

# alone: real sshd targets and Ansible runs that must not meet other root tests' objects
pytestmark = [pytest.mark.alone, pytest.mark.netns]

SSHD = "/usr/sbin/sshd"
WORKTREE = Path(__file__).resolve().parents[2]
TOPOLOGY = """\
name: fleet-netns
matrix:
  attachments: [netns-veth]
  mtus: [1500]
  connections: [1]
  profiles:
    - {name: tcp_rr, pattern: rr, message_size: 1, response_size: 1, duration: 1}
  repetitions: {warmup: 0, min: 1, max: 1}
"""


@dataclass
class Target:
    name: str
    netns: str
    address: str
    home: Path
    config: Path
    log: Path
    proc: subprocess.Popen | None = None

    def start(self) -> None:
        self.proc = subprocess.Popen(["ip", "netns", "exec", self.netns, SSHD, "-D", "-e", "-f",
                                      str(self.config)], stdout=subprocess.DEVNULL,
                                     stderr=open(self.log, "a"))
        deadline = time.monotonic() + 15
        while proc.run(["ip", "netns", "exec", self.netns, "ss", "-Htln", f"src {self.address}"],
                       timeout=10).stdout.count("LISTEN") < 2:
            if self.proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"sshd {self.name} did not start: {self.log.read_text()[-500:]}")
            time.sleep(0.1)

    def kill(self) -> None:
        """This target's sshd and its sessions, and nothing else: the process tree we started."""
        if self.proc is None or self.proc.poll() is not None:
            return
        tree = [psutil.Process(self.proc.pid)]
        with contextlib.suppress(psutil.Error):
            tree += tree[0].children(recursive=True)
        for p in tree:
            with contextlib.suppress(psutil.Error):
                p.kill()
        self.proc.wait(10)


@dataclass
class Fleet:
    tag: str
    ctl: str
    targets: list[Target]
    known_hosts: Path
    wrong_known_hosts: Path
    right_imposter_line: str
    key: Path
    root: Path
    wheel: Path


def _keygen(path: Path) -> str:
    proc.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(path)], timeout=30)
    return " ".join(path.with_suffix(".pub").read_text().split()[:2])


def needs(*tools: str) -> None:
    """Skip unless root, sshd, ansible-runner and ``tools`` are here."""
    if os.geteuid() != 0:
        pytest.skip("needs root: creates network namespaces and runs sshd")
    if not os.access(SSHD, os.X_OK):
        pytest.skip(f"{SSHD} missing (package openssh-server)")
    for tool in tools:
        if not shutil.which(tool):
            pytest.skip(f"{tool} missing")
    pytest.importorskip("ansible_runner", reason="ansible-runner not installed (extra: fleet)")


def controller(stack: contextlib.ExitStack, root: Path) -> tuple[str, str, Path]:
    """A tag of this session's, the controller's namespace and the client key the targets
    accept (root/authorized_keys), all removed by ``stack``."""
    os.chmod(root, 0o700)
    tag = claim_tag()
    stack.callback(release_tag, tag)
    ctl = f"tb-{tag}-c"
    key = root / "client"
    _keygen(key)
    (root / "authorized_keys").write_text(key.with_suffix(".pub").read_text())
    proc.run(["ip", "netns", "add", ctl], timeout=10)
    stack.callback(proc.run, ["ip", "netns", "del", ctl], timeout=10, check=False)
    return tag, ctl, key


def target_netns(stack: contextlib.ExitStack, tag: str, ctl: str, i: int) -> tuple[str, str]:
    """Target i's namespace and address, wired to the controller's namespace by a veth of
    its own (a /30 each): removed by ``stack``."""
    ns, addr = f"tb-{tag}-t{i}", f"198.19.77.{4 * i + 2}"
    proc.run(["ip", "netns", "add", ns], timeout=10)
    stack.callback(proc.run, ["ip", "netns", "del", ns], timeout=10, check=False)
    a, b = f"tb-{tag}-c{i}", f"tb-{tag}-s{i}"
    proc.run(["ip", "-n", ctl, "link", "add", a, "type", "veth", "peer", "name", b, "netns", ns], timeout=10)
    proc.run(["ip", "-n", ctl, "addr", "add", f"198.19.77.{4 * i + 1}/30", "dev", a], timeout=10)
    proc.run(["ip", "-n", ns, "addr", "add", f"{addr}/30", "dev", b], timeout=10)
    for n, dev in ((ctl, a), (ns, b), (ns, "lo"), (ctl, "lo")):
        proc.run(["ip", "-n", n, "link", "set", dev, "up"], timeout=10)
    return ns, addr


@pytest.fixture(scope="module")
def fleet(tmp_path_factory) -> Iterator[Fleet]:
    needs("netperf", "netserver")
    root = tmp_path_factory.mktemp("fleet")
    with contextlib.ExitStack() as stack:
        tag, ctl, key = controller(stack, root)
        targets, known = [], []
        for i in range(3):
            ns, addr = target_netns(stack, tag, ctl, i)
            d = root / f"t{i}"
            d.mkdir()
            pub = _keygen(d / "hostkey")
            known.append(f"{addr} {pub}")
            (d / "sshd_config").write_text(
                f"Port 22\nPort 2222\nListenAddress {addr}\nHostKey {d / 'hostkey'}\n"
                f"PidFile {d / 'sshd.pid'}\nAuthorizedKeysFile {root / 'authorized_keys'}\n"
                "PermitRootLogin prohibit-password\nPasswordAuthentication no\n"
                "KbdInteractiveAuthentication no\nUsePAM no\nStrictModes no\n"
                "Subsystem sftp internal-sftp\n")
            t = Target(f"t{i}", ns, addr, d / "home", d / "sshd_config", d / "sshd.log")
            targets.append(t)
        stack.enter_context(sshd_privsep_dir())
        for t in targets:
            stack.callback(t.kill)
            t.start()
        kh = root / "known_hosts"
        kh.write_text("\n".join(known) + "\n")
        other = _keygen(root / "otherkey")
        t2 = targets[2]
        wrong = root / "imposter_known_hosts"
        wrong.write_text(f"[{t2.address}]:2222 {other}\n")
        right = f"[{t2.address}]:2222 " + known[2].split(" ", 1)[1] + "\n"
        # Built here, in the root namespace: pip's build isolation fetches setuptools, and the
        # controller's namespace has no way out. `fleet run` builds the same when not given one.
        from testbed.fleet import engine
        wheel = engine.build_wheel(root / "wheel")
        yield Fleet(tag, ctl, targets, kh, wrong, right, key, root, wheel)


def _inventory(f: Fleet) -> Path:
    deps = next(p for p in sys.path if p.endswith("site-packages") and Path(p, "yaml").is_dir())
    common = {"ansible_user": "root", "ansible_ssh_private_key_file": str(f.key),
              "ansible_python_interpreter": "/usr/bin/python3", "ansible_become_method": "su",
              "testbed_python": "/usr/bin/python3", "testbed_deps_site": deps,
              "testbed_host_packages": False, "testbed_host_setup": False,
              "testbed_run_timeout": 1800, "testbed_lock_wait": 1500,
              # the three hosts are one machine, which other tests' runs share meanwhile
              "testbed_shared_host": True}
    hosts = {}
    for i, t in enumerate(f.targets[:2]):
        hosts[t.name] = {"ansible_host": t.address, "testbed_home": str(t.home),
                         "testbed_machine_id": f"fleet-test-{t.name}",
                         # what the topology leaves per host, merged in on the target
                         "testbed_topology_overrides": {"name": f"fleet-netns-{t.name}"},
                         "testbed_known_hosts": str(f.known_hosts)}
    t2 = f.targets[2]
    hosts["imposter"] = {"ansible_host": t2.address, "ansible_port": 2222,
                         "testbed_home": str(t2.home), "testbed_machine_id": "fleet-test-t2",
                         "testbed_host_class": "gen-b",
                         "testbed_known_hosts": str(f.wrong_known_hosts)}
    inv = {"all": {"vars": common, "children": {"gen_a": {"vars": {"testbed_host_class": "gen-a"},
                                                         "hosts": {k: hosts[k] for k in ("t0", "t1")}},
                                                "gen_b": {"hosts": {"imposter": hosts["imposter"]}}}}}
    p = f.root / "inventory.yml"
    p.write_text(json.dumps(inv))           # JSON is YAML
    return p


def _cli(f: Fleet, *argv: str, timeout: float = 1800) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", "netns", "exec", f.ctl, sys.executable, "-m", "testbed", *argv],
                          capture_output=True, text=True, timeout=timeout, cwd=f.root,
                          env={**os.environ, "PYTHONPATH": str(WORKTREE),
                               "TESTBED_RESULTS": str(f.root / "results")})


def _skip_if_another_sessions_leftovers(hosts: dict) -> None:
    """`testbed run` refuses to start beside a dead run's tb- objects (another session's, on
    this shared machine): that is the host's state, not the fleet's fault."""
    for h in hosts.values():
        if "a dead run left testbed objects behind" in (h.get("reason") or ""):
            pytest.skip(f"host {h['name']}: {h['reason']}")


def test_a_fleet_run_fails_hosts_alone_and_retry_brings_them_in(fleet):
    f = fleet
    inv = _inventory(f)
    topo = f.root / "topology.yaml"
    topo.write_text(TOPOLOGY)
    p = subprocess.Popen(["ip", "netns", "exec", f.ctl, sys.executable, "-m", "testbed", "fleet",
                          "run", str(inv), str(topo), "--forks", "3", "--wheel", str(f.wheel)],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=f.root,
                         env={**os.environ, "PYTHONPATH": str(WORKTREE),
                              "TESTBED_RESULTS": str(f.root / "results")})
    err_lines: list[str] = []
    killed = threading.Event()

    def watch() -> None:
        for line in p.stderr:           # type: ignore[union-attr]
            err_lines.append(line.rstrip())
            # t1's sshd dies while its run goes on: the host fails, the others do not
            if line.startswith("fleet: t1 running: testbed run started") and not killed.is_set():
                f.targets[1].kill()
                killed.set()
    reader = threading.Thread(target=watch)
    reader.start()
    try:
        out = p.stdout.read()           # type: ignore[union-attr]
        rc = p.wait(1800)
    finally:
        if p.poll() is None:
            p.kill()
        reader.join(30)
    err = "\n".join(err_lines)
    (f.root / "fleet-run.stderr").write_text(err)          # kept for a look after the session
    assert killed.is_set(), err[-3000:]
    assert rc == 6, err[-3000:]                            # some hosts failed
    fleet_dir = Path(out.strip().splitlines()[-1])
    rec = json.loads((fleet_dir / "fleet.json").read_text())
    hosts = {h["name"]: h for h in rec["hosts"]}
    _skip_if_another_sessions_leftovers(hosts)
    assert hosts["t0"]["status"] == "done", hosts
    assert hosts["t1"]["status"] == "failed" and hosts["t1"]["reason"], hosts
    assert "host key verification failed" in hosts["imposter"]["reason"], hosts
    # progress per host, in order, on stderr
    for phase in ("preparing", "running", "fetching", "done"):
        assert f"fleet: t0 {phase}" in err, err[-3000:]
    # "running cell i of n" shows when a poll (every 2 s) lands while the cell is measured
    assert "fleet: t0 running cell 1 of 1" in err or "fleet: t0 running: testbed run started" in err
    assert err.count("fleet: t0 running\n") == 1 and err.count("fleet: t0 prepared") == 1
    assert "fleet: imposter failed: host key verification failed" in err
    # the refused host's run never started: nothing of this fleet run exists in its home
    assert not (f.targets[2].home / "fleet" / rec["fleet_id"] / "imposter").exists()
    # no credential in the record: the key's path is the inventory's business, never its bytes
    blob = (fleet_dir / "fleet.json").read_text()
    assert "PRIVATE KEY" not in blob and f.key.read_text().split("\n")[1] not in blob
    # t0's run came back whole, with its host's identity
    run0 = json.loads((fleet_dir / hosts["t0"]["run_dir"] / "run.json").read_text())
    env0 = run0["environment"]
    assert run0["status"] == "complete" and run0["topology"]["name"] == "fleet-netns-t0"
    assert env0["machine_id"] == "fleet-test-t0" and env0["machine_id_source"] == "TESTBED_MACHINE_ID"
    assert env0["host_class"] == "gen-a" and env0["inventory_host"] == "t0"
    assert env0["shared_host"] is True              # testbed_shared_host reached the run
    assert env0["host"] and env0["cpu_model"]

    # put things right: t1's sshd back, the imposter's known_hosts corrected; retry the failed
    f.targets[1].start()
    f.wrong_known_hosts.write_text(f.right_imposter_line)
    r = _cli(f, "fleet", "run", "--retry-failed", str(fleet_dir))
    _skip_if_another_sessions_leftovers(
        {h["name"]: h for h in json.loads((fleet_dir / "fleet.json").read_text())["hosts"]})
    assert r.returncode == 0, r.stderr[-3000:]
    assert "retrying 2 failed host(s): t1, imposter" in r.stderr
    assert "fleet: t0" not in r.stderr                     # only the failed hosts ran again
    rec = json.loads((fleet_dir / "fleet.json").read_text())
    hosts = {h["name"]: h for h in rec["hosts"]}
    assert all(h["status"] == "done" for h in hosts.values()), hosts
    assert hosts["t1"]["attempts"] == 2 and hosts["t0"]["attempts"] == 1
    # t1's first run went on after its sshd died; the retry ran in an attempt folder of its
    # own, so the two never wrote into one another's files
    assert len(list((f.targets[1].home / "fleet" / rec["fleet_id"] / "t1").glob("attempt-*"))) == 2
    # preparing is idempotent: t1 was prepared by the first attempt, so nothing changed now;
    # the imposter's home had never been touched (its first attempt was refused)
    assert hosts["t1"]["prepare_changed"] == 0, hosts
    assert hosts["imposter"]["prepare_changed"] > 0 and hosts["t0"]["prepare_changed"] > 0, hosts
    assert "fleet: t1 prepared (0 task(s) changed something)" in r.stderr
    # Ansible's records of the detached runs are gone; t1's first one was cut off before
    async_dir = Path.home() / ".ansible_async"
    left = [p for p in async_dir.glob("j*") if str(f.root) in p.read_text()] if async_dir.is_dir() else []
    assert len(left) <= 1, left
    ids = {json.loads((fleet_dir / h["run_dir"] / "run.json").read_text())["environment"]["machine_id"]
           for h in hosts.values()}
    assert ids == {"fleet-test-t0", "fleet-test-t1", "fleet-test-t2"}

    # the fleet report: hosts side by side with their identities
    r = _cli(f, "fleet", "report", str(fleet_dir))
    assert r.returncode == 0, r.stderr
    assert all(n in r.stdout for n in ("t0", "t1", "imposter", "fleet-test-t1", "gen-a", "gen-b"))
    assert "netns-veth-qemu-mtu1500-conn1-tcp_rr" in r.stdout

    # every run indexed in the store, one history series per host, pooled per class on request
    db = f.root / "results" / "index.sqlite"
    r = _cli(f, "history", "--db", str(db))
    assert r.returncode == 0, r.stderr
    series = [ln for ln in r.stdout.splitlines() if " runs, " in ln]
    assert len(series) == 3 and all(f"host {n}" in r.stdout for n in ("t0", "t1", "imposter")), r.stdout
    r = _cli(f, "history", "--db", str(db), "--by", "class")
    assert "class gen-a: 2 runs" in r.stdout and "class gen-b: 1 runs" in r.stdout, r.stdout
    # two hosts' runs are not compared without --across-hosts
    r = _cli(f, "compare", str(fleet_dir / hosts["t0"]["run_dir"]), str(fleet_dir / hosts["t1"]["run_dir"]))
    assert r.returncode == 2 and "different hosts" in r.stderr, r.stderr
    r = _cli(f, "compare", "--across-hosts", str(fleet_dir / hosts["t0"]["run_dir"]),
             str(fleet_dir / hosts["t1"]["run_dir"]))
    assert r.returncode != 2 and "--across-hosts" in r.stdout, r.stdout + r.stderr


def test_bad_inventories_are_refused_before_any_host_is_touched(fleet, tmp_path):
    f = fleet
    topo = tmp_path / "topology.yaml"
    topo.write_text(TOPOLOGY)
    off = tmp_path / "off.ini"
    off.write_text(f"t0 ansible_host={f.targets[0].address} ansible_host_key_checking=false\n")
    r = _cli(f, "fleet", "run", str(off), str(topo))
    assert r.returncode == 2 and "host key" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    r = _cli(f, "fleet", "run", str(off), str(topo), "--limit", "nosuchhost")
    assert r.returncode == 2 and "--limit nosuchhost" in r.stderr
    bad = tmp_path / "bad.yml"
    bad.write_text("all:\n  hosts:\n    t0:\n      testbed_topology_overrides: {matrix: {mtus: [12]}}\n")
    r = _cli(f, "fleet", "run", str(bad), str(topo))
    assert r.returncode == 2 and "t0" in r.stderr and "mtus" in r.stderr, r.stderr
    assert not (tmp_path / "results").exists() and not list((f.root / "results").glob("fleet-*")) \
        or all((d / "fleet.json").exists() for d in (f.root / "results").glob("fleet-*"))
