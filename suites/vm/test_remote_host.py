"""A real second host reached over ssh. This machine plays both hosts: host ha is local
(qemu:///system), host hb is reached through an sshd the test starts on 127.0.0.1 with its
own keys and config, so every hb command, file copy and libvirt call really goes through
ssh with the host key checked against a pinned known_hosts file (qemu+libssh2:// for libvirt).

Measured facts: a wrong host key is refused before anything is created; the image staging
copies the cached image through ssh and a second staging copies nothing; a run with guest g1
on ha and g2 on hb over macvtap across the hosts (each guest's macvtap on its own host's
underlay, a tb- veth pair standing in for the cable) gives ok samples, records both hosts'
fingerprints (hb's read over ssh) and each guest's host, and leaves nothing behind: no
domain, no link, no remote guest folder.
"""
from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from testbed.admin import cleanup
from testbed.errors import CapabilityError
from testbed.guests import images
from testbed.host import proc, remote
from testbed.host.executor import Executor
from testbed.host.net import links, ops
from testbed._suite_plugin import run_cli, sshd_privsep_dir
from testbed.records import results
from testbed.topology import config
from testbed.topology.model import HostSpec

pytestmark = [pytest.mark.vm]

SSHD = "/usr/sbin/sshd"


@dataclass(frozen=True)
class Loopback:
    port: int
    key: Path
    known_hosts: Path
    wrong_known_hosts: Path
    tag: str

    def host(self, **kw) -> HostSpec:
        return HostSpec(name="hb", uri=self.uri, transport="ssh", ssh_target="root@127.0.0.1",
                        ssh_port=self.port, known_hosts=str(kw.get("known_hosts", self.known_hosts)),
                        identity=str(self.key))

    @property
    def uri(self) -> str:
        return (f"qemu+libssh2://root@127.0.0.1:{self.port}/system?keyfile={self.key}"
                f"&known_hosts={self.known_hosts}&known_hosts_verify=normal&sshauth=privkey")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def loopback(tmp_path_factory) -> Iterator[Loopback]:
    """An sshd on 127.0.0.1 only, with its own host key, authorized key and config; stopped
    on exit, with sshd's privilege-separation folder (sshd_privsep_dir)."""
    if os.geteuid() != 0:
        pytest.skip("needs root")
    if not os.access(SSHD, os.X_OK):
        pytest.skip(f"{SSHD} missing (package openssh-server)")
    d = tmp_path_factory.mktemp("ssh")
    os.chmod(d, 0o700)
    for name in ("hostkey", "client", "otherkey"):
        proc.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(d / name)], timeout=30)
    port = _free_port()
    (d / "authorized_keys").write_text((d / "client.pub").read_text())
    host_pub = " ".join((d / "hostkey.pub").read_text().split()[:2])
    other_pub = " ".join((d / "otherkey.pub").read_text().split()[:2])
    (d / "known_hosts").write_text(f"[127.0.0.1]:{port} {host_pub}\n")
    (d / "wrong_known_hosts").write_text(f"[127.0.0.1]:{port} {other_pub}\n")
    (d / "sshd_config").write_text(
        f"Port {port}\nListenAddress 127.0.0.1\nHostKey {d / 'hostkey'}\nPidFile {d / 'sshd.pid'}\n"
        f"AuthorizedKeysFile {d / 'authorized_keys'}\nPermitRootLogin prohibit-password\n"
        "PasswordAuthentication no\nKbdInteractiveAuthentication no\nUsePAM no\nStrictModes no\n"
        "Subsystem sftp internal-sftp\n")
    with contextlib.ExitStack() as stack:
        stack.enter_context(sshd_privsep_dir())
        _, tag, _ = stack.enter_context(cleanup.owned_fresh_state(results.new_run_id))
        sshd = subprocess.Popen([SSHD, "-D", "-e", "-f", str(d / "sshd_config")],
                                stdout=subprocess.DEVNULL, stderr=open(d / "sshd.log", "w"))
        stack.callback(sshd.wait, 10)
        stack.callback(sshd.terminate)
        deadline = time.monotonic() + 15
        while True:
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    break
            if sshd.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"sshd did not start: {(d / 'sshd.log').read_text()[-500:]}")
            time.sleep(0.1)
        yield Loopback(port, d / "client", d / "known_hosts", d / "wrong_known_hosts", tag)


def test_ssh_checks_the_host_key(loopback):
    sh = remote.shell(loopback.host())
    sh.reachable()
    assert sh.run(["sh", "-c", "echo $((6 * 7))"]).stdout.strip() == "42"
    assert sh.run(["echo", "a b", "c;d"]).stdout.strip() == "a b c;d"   # arguments keep their boundaries
    bad = remote.shell(loopback.host(known_hosts=loopback.wrong_known_hosts))
    with pytest.raises(CapabilityError, match="(?i)host key"):
        bad.reachable()


def test_image_staging_copies_once_over_ssh(loopback, tmp_path):
    img = images.ensure()
    sh = remote.shell(loopback.host())
    staged = images.stage(sh, img, root=tmp_path)
    assert staged.disk == tmp_path / img.disk.parent.name / img.disk.name
    assert staged.disk.stat().st_size == img.disk.stat().st_size
    assert proc.run(["cmp", str(img.kernel), str(staged.kernel)], timeout=60).rc == 0
    assert not [p for p in tmp_path.iterdir() if p.name.startswith("tb-")]   # no staging folder left
    mtime = staged.disk.stat().st_mtime_ns
    assert images.stage(sh, img, root=tmp_path) == staged
    assert staged.disk.stat().st_mtime_ns == mtime                            # not copied again


TOPOLOGY = """\
name: remote-macvtap
hosts:
  - {{name: ha, underlay: {ula}}}
  - name: hb
    transport: ssh
    uri: "{uri}"
    ssh: root@127.0.0.1
    ssh_port: {port}
    known_hosts: {kh}
    identity: {key}
    underlay: {ulb}
guests:
  - {{name: g1, host: ha}}
  - {{name: g2, host: hb}}
matrix:
  attachments: [macvtap]
  mtus: [1500]
  profiles:
    - {{name: tcp_stream, tool: netperf, protocol: tcp, pattern: stream, message_size: 16384, duration: 3}}
"""


@pytest.mark.attach("macvtap")
def test_run_across_a_remote_host(loopback, accelerator, tmp_path):
    from testbed import attachments
    from testbed.topology.model import Attachment
    why = attachments.unavailable(Attachment("macvtap"))
    if why:
        pytest.skip(f"macvtap unavailable: {why}")
    ula, ulb = f"tb-{loopback.tag}-ula", f"tb-{loopback.tag}-ulb"
    before = cleanup.Baseline.take()      # other tests' runs beside this one are left out
    with links.veth(ula, ulb, 1500):
        topo = tmp_path / "remote.yaml"
        topo.write_text(TOPOLOGY.format(uri=loopback.uri, port=loopback.port, kh=loopback.known_hosts,
                                        key=loopback.key, ula=ula, ulb=ulb))
        t = config.load(topo)
        assert [h.transport for h in t.hosts] == ["local", "ssh"]
        p = run_cli(["run", str(topo)], env={"TESTBED_RESULTS": str(tmp_path / "res")}, timeout=900)
        assert p.returncode == 0, p.stderr[-3000:]
        run_dir = Path(p.stdout.strip().splitlines()[-1])
        run = json.loads((run_dir / "run.json").read_text())
        # a sample the noise guard set aside (host busy with other work) was measured again
        samples = [s for s in map(json.loads, (run_dir / "samples.jsonl").read_text().splitlines())
                   if s["status"] != "noisy"]
        # Both guests' macvtaps sat on their own host's underlay: the cable carried the test.
        rx, tx = links.counters(ulb)
    assert run["status"] == "complete", run
    assert [s["status"] for s in samples] == ["ok"], [s.get("reason") for s in samples]
    s = samples[0]
    assert s["placement"] == {"g1": "ha", "g2": "hb"}
    assert s["extra"]["datapath"] == "macvtap-bridge-underlay"
    assert s["metrics"]["throughput_mbps"] > 0
    assert rx * 8 / 1e6 > 0.5 * s["metrics"]["throughput_mbps"] * 3, (rx, s["metrics"])
    hb = run["hosts"]["hb"]
    assert hb["transport"] == "ssh" and hb["kernel"] == os.uname().release and hb["cpus"] == os.cpu_count()
    assert run["hosts"]["ha"]["transport"] == "local"
    assert run["guests"]["g2"]["host"] == "hb"
    assert any("g2 on hb" in x for x in run["host_cpu_not_measured"])
    # The remote guest's console log came back with the run; its folder on hb is gone.
    assert (run_dir / "guests").is_dir() and any("g2" in f.name for f in (run_dir / "guests").iterdir())
    state = Path(os.environ.get("TESTBED_STATE", "/var/lib/testbed"))
    assert not list(state.glob("tb-*-g2.d"))
    assert before.changes() == []


@pytest.mark.alone      # a dead run's objects, which runs beside it would refuse to start by
def test_cleanup_finds_and_removes_a_dead_runs_objects_on_a_remote_host(loopback):
    """What a SIGKILLed run leaves on a remote host (a link, a guest folder) is found over
    ssh and removed; a live run's objects (this module's own tag) are left alone."""
    sh = remote.shell(loopback.host())
    dead = f"{(int(loopback.tag, 16) + 1) % 0x10000:04x}"   # a tag no live run holds
    link, folder = f"tb-{dead}-x", f"tb-{dead}-g9.d"
    live_link = f"tb-{loopback.tag}-y"
    state = Path(os.environ.get("TESTBED_STATE", "/var/lib/testbed"))
    try:
        for name in (link, live_link):
            sh.run(["ip", "link", "add", name, "type", "veth", "peer", "name", f"{name}p"])
        sh.run(["mkdir", "-p", str(state / folder)])
        found = cleanup.find_on(sh, loopback.uri)
        assert {link, f"{link}p"} <= set(found.links) and folder in found.state
        assert live_link not in found.links and f"{live_link}p" not in found.links
        cleanup.remove_on(sh, found, loopback.uri)
        assert not links.exists(link) and not (state / folder).exists() and links.exists(live_link)
    finally:
        for name in (link, live_link):
            links.delete(name)
        shutil.rmtree(state / folder, ignore_errors=True)


def test_the_ssh_executor_runs_reads_writes_and_kills_on_the_host(loopback, tmp_path):
    """remote.Shell as an executor (testbed.host.executor): files and processes really go through
    ssh, and killing a spawned command kills the remote process, not just the ssh client."""
    sh = remote.shell(loopback.host())
    assert isinstance(sh, Executor)
    f = tmp_path / "written-over-ssh"
    sh.write_file(str(f), "line one\nline two\n")
    assert f.read_text() == "line one\nline two\n"
    assert sh.read_file(str(f)) == "line one\nline two\n"
    pid = sh.spawn(["sh", "-c", "echo out; echo err >&2; exit 4"])
    res = sh.wait(pid, ["sh"], timeout=30)
    assert (res.rc, res.stdout, res.stderr) == (4, "out\n", "err\n")
    # The remote process is the one whose whole command line is `sleep <secs>` (the local
    # ssh client's command line carries those words too, inside its own: it must not count).
    # (`exec -a NAME` is not dash's, so it cannot name the process.)
    secs = f"120.{os.getpid()}"

    def remote_sleepers() -> list[str]:
        return [a for a in proc.run(["ps", "-eo", "args"]).stdout.splitlines() if a.strip() == f"sleep {secs}"]
    pid = sh.spawn(["sleep", secs])
    deadline = time.monotonic() + 15
    while not remote_sleepers():
        assert time.monotonic() < deadline, "the remote sleeper never started"
        time.sleep(0.1)
    sh.kill(pid)
    deadline = time.monotonic() + 10
    while remote_sleepers():
        assert time.monotonic() < deadline, "the remote process outlived kill()"
        time.sleep(0.1)
    sh.stop_all()


def test_link_operations_over_ssh_are_ip_commands_the_kernel_obeys(loopback):
    """hostnet.ops on a remote host runs `ip` through ssh; this machine is that host, so
    the kernel's answer is read back here through pyroute2 (links.mtu_of)."""
    sh = remote.shell(loopback.host())
    on_host = ops.on(sh)
    assert isinstance(on_host, ops.IpCommands)
    a, b, br = (f"tb-{loopback.tag}-{x}" for x in ("sa", "sb", "sbr"))
    try:
        on_host.add_bridge(br)
        on_host.add_veth(a, b, mtu=1400)
        on_host.enslave(a, br)
        ops.set_mtus(sh, [a, br], 1320)
        on_host.set_up(a)
        assert links.mtu_of(a) == 1320 and links.mtu_of(br) == 1320 and links.mtu_of(b) == 1400
        assert on_host.mtu_of(b) == 1400
        with open(f"/sys/class/net/{a}/master/uevent") as u:
            assert f"INTERFACE={br}" in u.read()
    finally:
        for n in (a, br):
            on_host.delete(n)
    assert not links.exists(a) and not links.exists(br) and not links.exists(b)
