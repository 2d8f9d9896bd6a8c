"""Hostile and careless input to the fleet, history, capacity, bench and resume surfaces,
through the real CLI entry (testbed.cli.main): each is exit 2 with one stderr line naming the
file or argument, within seconds, with nothing created (no results folder, no fleet folder,
no acknowledgement written) and no playbook started.
"""
from __future__ import annotations

import json
import os
import shutil
import tarfile
import time
from pathlib import Path

import pytest

from testbed import cli
from testbed.host.safeio import UserFileError

pytestmark = pytest.mark.unit
pytest.importorskip("ansible_runner", reason="ansible-runner not installed (extra: fleet)")

from test_fleet_units import TOPOLOGY  # noqa: E402  (the fleet's one-cell namespace topology)

RUN = Path(__file__).resolve().parent / "fixtures" / "runs" / "format2"
#: a well-formed ed25519 public key (the known_hosts lines' good key)
KEY = "AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl"


@pytest.fixture
def env(tmp_path, monkeypatch):
    """A results folder that must stay absent, a topology, and a playbook that must never run."""
    from testbed.fleet import engine
    monkeypatch.setenv("TESTBED_RESULTS", str(tmp_path / "results"))
    monkeypatch.setenv("TESTBED_STATE", str(tmp_path / "state"))
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)

    def never(*_a, **_k):
        raise AssertionError("the playbook was started with bad input")
    monkeypatch.setattr(engine, "execute", never)
    (tmp_path / "topology.yaml").write_text(TOPOLOGY)
    return tmp_path


def refused(capsys, argv: list[str], names: str, seconds: float = 30) -> str:
    t0 = time.monotonic()
    try:
        rc = cli.main(argv)
    except SystemExit as e:         # argparse: one line, exit 2
        rc = e.code
    took = time.monotonic() - t0
    err = capsys.readouterr().err
    lines = err.strip("\n").split("\n")
    assert rc == 2, (rc, err)
    assert len(lines) == 1 and "Traceback" not in err, err
    assert names in err, err
    assert took < seconds, f"took {took:.1f} s: {err}"
    return err


def nothing_made(d: Path) -> None:
    assert not (d / "results").exists() and not (d / "state").exists(), sorted(os.listdir(d))


# --------------------------------------------------------------------------- inventories

def _fifo(p: Path) -> Path:
    os.mkfifo(p)
    return p


INVENTORY_FILES = {
    # name -> (make(tmp) -> inventory path, words)
    "fifo": (lambda d: _fifo(d / "inv.yml"), "is a FIFO"),
    "device": (lambda d: Path("/dev/zero"), "is a character device"),
    "missing": (lambda d: d / "nope.yml", "no such inventory"),
    "fifo_in_folder": (lambda d: (d / "inv").mkdir() or _fifo(d / "inv" / "hosts") and d / "inv", "is a FIFO"),
    "fifo_group_vars": (lambda d: (d / "group_vars").mkdir() or _fifo(d / "group_vars" / "all.yml")
                        and (d / "inv.ini").write_text("h1\n") and d / "inv.ini", "is a FIFO"),
    "fifo_host_vars_folder": (lambda d: (d / "host_vars" / "h1").mkdir(parents=True)
                              or _fifo(d / "host_vars" / "h1" / "x.yml")
                              and (d / "inv.ini").write_text("h1\n") and d / "inv.ini", "is a FIFO"),
    "one_line_20mb": (lambda d: (d / "big.ini").write_text("h1 x=" + "a" * 20_000_000) and d / "big.ini",
                      "more than the 1048576 allowed"),
    "alias_bomb": (lambda d: (d / "bomb.yml").write_text(
        "a: &a [x, x, x, x, x, x, x, x, x, x]\n" + "".join(
            f"{c}: &{c} [{', '.join(['*' + p] * 10)}]\n" for p, c in zip("abcdefg", "bcdefgh"))
        + "all: {hosts: {h1: {v: *h}}}\n") and d / "bomb.yml", "aliases expand"),
    "host_range_billion": (lambda d: (d / "r.ini").write_text("h[0:999999999] ansible_host=198.18.0.1\n")
                           and d / "r.ini", "expand to"),
    "link_loop": (lambda d: (d / "inv").mkdir() or os.symlink(d / "inv", d / "inv" / "again") or d / "inv",
                  "contains itself"),
}


@pytest.mark.parametrize("case", sorted(INVENTORY_FILES))
def test_inventory_files_that_cannot_be_read_are_refused_unread(capsys, env, case):
    make, words = INVENTORY_FILES[case]
    inv = make(env)
    refused(capsys, ["fleet", "run", str(inv), str(env / "topology.yaml")], words, seconds=10)
    nothing_made(env)


def test_an_executable_inventory_is_never_run(capsys, env):
    script = env / "inv.sh"
    script.write_text(f"#!/bin/sh\ntouch {env / 'ran'}\necho '{{}}'\n")
    script.chmod(0o755)
    refused(capsys, ["fleet", "run", str(script), str(env / "topology.yaml")], "Ansible cannot read it")
    assert not (env / "ran").exists()
    nothing_made(env)


HOST_CASES = {
    "group_vars_turn_checking_off": ({"group_vars/all.yml": "ansible_ssh_common_args: -o StrictHostKeyChecking=no\n"},
                                     "h1\n", "ansible_ssh_common_args"),
    "path_like_name": ({}, "'../../../x' ansible_host=198.18.0.1\n", "is a path"),
    "option_as_host": ({}, "h1 ansible_host=-oProxyCommand=id\n", "begins with '-'"),
    "inline_key": ({}, "all:\n  hosts:\n    h1: {ansible_ssh_private_key_file: \"-----BEGIN OPENSSH PRIVATE KEY-----\\nb3Bl\\n\"}\n",
                   "key material"),
    "ssh_config_pointed_at": ({"cfg": "Host *\n  UserKnownHostsFile /dev/null\n"}, "h1 testbed_ssh_config=cfg\n",
                              "UserKnownHostsFile"),
    "template": ({}, "all:\n  hosts:\n    h1: {ansible_user: \"{{ lookup('pipe', 'id') }}\"}\n", "Jinja2 template"),
    "joined_o": ({}, "h1 ansible_ssh_extra_args=-oStrictHostKeyChecking=no\n", "StrictHostKeyChecking"),
    "ssh_args": ({}, "h1 ansible_ssh_args='-o UserKnownHostsFile=/dev/null'\n", "ansible_ssh_args"),
    "identity_fifo": ({"group_vars/all.yml": "ansible_ssh_common_args: -i /dev/stdin\n"}, "h1\n", "regular file"),
    "identity_in_config": ({"cfg": "Host *\n  IdentityFile /dev/zero\n"}, "h1 testbed_ssh_config=cfg\n",
                           "character device"),
    # a known_hosts line's fields reach the run as values Ansible renders on the controller
    "known_hosts_template": ({"kh": f"198.18.0.1 ssh-ed25519 {KEY}\n198.18.0.1 ssh-ed25519 "
                                    "{{lookup('pipe','id>/tmp/x')}}\n"},
                             "h1 ansible_host=198.18.0.1 testbed_known_hosts=kh\n", "line 2: holds control"),
    "known_hosts_not_a_key": ({"kh": "198.18.0.1 ssh-ed25519 $(id)\n"},
                              "h1 ansible_host=198.18.0.1 testbed_known_hosts=kh\n", "not base64"),
    "known_hosts_odd_marker": ({"kh": f"@trusted 198.18.0.1 ssh-ed25519 {KEY}\n"},
                               "h1 ansible_host=198.18.0.1 testbed_known_hosts=kh\n", "not a known_hosts marker"),
    # ssh splits UserKnownHostsFile on blanks and unquotes '...' and backslashes: the file
    # checked would not be the file read
    "known_hosts_path_with_blank": ({"kh a": f"198.18.0.1 ssh-ed25519 {KEY}\n"},
                                    'h1 ansible_host=198.18.0.1 testbed_known_hosts="kh a"\n', "blanks, quotes"),
    "identity_backslash_in_config": ({"cfg": "Host *\n  IdentityFile k\\ 1\n", "k\\ 1": "key\n"},
                                     "h1 testbed_ssh_config=cfg\n", "IdentityFile: value"),
    "identity_single_quotes_in_config": ({"cfg": "Host *\n  IdentityFile 'k 1'\n"},
                                         "h1 testbed_ssh_config=cfg\n", "IdentityFile: value"),
    # stat() calls it a regular file of 0 bytes; it is no key
    "identity_in_proc": ({}, "h1 ansible_ssh_private_key_file=/proc/self/status\n", "kernel interface file"),
    "identity_empty": ({"k": ""}, "h1 ansible_ssh_private_key_file=k\n", "is empty"),
    "package_with_newline": ({}, 'all:\n  hosts:\n    h1: {testbed_packages: ["vim\\n"]}\n',
                             "not a Debian package name"),
    "scope_with_shell": ({}, "h1 ansible_host=fe80::1%$(id)\n", "not a host name or an IP address"),
}


@pytest.mark.parametrize("case", sorted(HOST_CASES))
def test_hostile_hosts_are_refused_naming_host_and_variable(capsys, env, case):
    files, text, words = HOST_CASES[case]
    for name, content in files.items():
        (env / name).parent.mkdir(parents=True, exist_ok=True)
        (env / name).write_text(content)
    inv = env / ("inv.yml" if text.startswith("all:") else "inv.ini")
    inv.write_text(text)
    err = refused(capsys, ["fleet", "run", str(inv), str(env / "topology.yaml")], words)
    assert err.startswith(f"testbed: {inv}: host ")
    nothing_made(env)


@pytest.mark.parametrize("name,text,words", [
    ("inv.yml", "all:\n  hosts:\n    h1: !!python/object/apply:os.system [id]\n", "line 3: a YAML tag that builds"),
    ("inv.yml", "plugin: amazon.aws.aws_ec2\nregions: [x]\n", "plugin: names an inventory plugin"),
])
def test_inventories_ansible_cannot_read_are_refused_saying_why(capsys, env, name, text, words):
    (env / name).write_text(text)
    refused(capsys, ["fleet", "run", str(env / name), str(env / "topology.yaml")], words)
    nothing_made(env)


PAIR = ("ha ansible_host=198.18.0.1 testbed_peer=hb testbed_data_address=198.19.0.1 testbed_data_interface=eth1 "
        "testbed_known_hosts=kh\n"
        "hb ansible_host=198.18.0.2 testbed_data_address=198.19.0.2 testbed_data_interface=eth1 testbed_known_hosts=kh\n")


@pytest.mark.parametrize("override,words", [
    ('{hosts: "ab"}', "hosts: a pair runs a topology of two hosts"),
    ("{hosts: [1, 2]}", "hosts[0]: expected a mapping with a name"),
    ("{hosts: [{}, {}]}", "hosts[0]: expected a mapping with a name"),
    ("{tunnel: 5}", "tunnel: must be a mapping"),
])
def test_a_pairs_overrides_that_break_its_topology_are_refused(capsys, env, override, words):
    (env / "kh").write_text(f"198.18.0.1 ssh-ed25519 {KEY}\n198.18.0.2 ssh-ed25519 {KEY}\n")
    (env / "host_vars").mkdir()
    (env / "host_vars" / "ha.yml").write_text(f"testbed_topology_overrides: {override}\n")
    (env / "inv.ini").write_text(PAIR)
    two = Path(__file__).resolve().parents[2] / "examples" / "two-hosts" / "emulated.yaml"
    err = refused(capsys, ["fleet", "run", str(env / "inv.ini"), str(two)], words)
    assert "ha's testbed_topology_overrides" in err, err
    nothing_made(env)


@pytest.mark.parametrize("var,value,words", [
    ("ANSIBLE_HOST_KEY_CHECKING", "False", "HOST_KEY_CHECKING"),
    # a password or vault "file" that is executable is run; these name programs to run
    ("ANSIBLE_VAULT_PASSWORD_FILE", "/tmp/vault.sh", "runs a program"),
    ("ANSIBLE_CONNECTION_PASSWORD_FILE", "/tmp/pw.sh", "runs a program"),
    ("ANSIBLE_BECOME_EXE", "/tmp/evil", "runs a program"),
    ("ANSIBLE_SUDO_EXE", "/tmp/evil", "runs a program"),
    ("ANSIBLE_BECOME_FLAGS", "-H -S; id", "runs a program"),
    ("ANSIBLE_SSH_CONTROL_PATH_DIR", "/tmp/other", "control_path_dir"),
    ("ANSIBLE_PYTHON_INTERPRETER", "/bin/sh -c id", "INTERPRETER_PYTHON"),
    # code from folders the fleet does not check
    ("ANSIBLE_COLLECTIONS_PATH", "/tmp/coll", "loads plugins"),
    ("ANSIBLE_JINJA2_EXTENSIONS", "os.system", "loads plugins"),
    ("ANSIBLE_STRATEGY", "ev.il.x", "Ansible's own"),
    ("ANSIBLE_STRATEGY", "debug", "Ansible's own"),
    ("ANSIBLE_SSH_EXTRA_ARGS", "-o UserKnownHostsFile=/dev/null", "UserKnownHostsFile"),
    ("ANSIBLE_SSH_EXECUTABLE", "/tmp/ssh", "another program"),
    ("ANSIBLE_SSH_ARGS", "-oStrictHostKeyChecking=no", "StrictHostKeyChecking"),
    ("ANSIBLE_CONNECTION_PLUGINS", "/nonexistent", "loads plugins"),
    ("ANSIBLE_CALLBACKS_ENABLED", "profile_tasks", "loads plugins"),
])
def test_the_users_ansible_environment_is_checked_too(capsys, env, monkeypatch, var, value, words):
    (env / "inv.ini").write_text("h1 ansible_host=198.18.0.1\n")
    monkeypatch.setenv(var, value)
    err = refused(capsys, ["fleet", "run", str(env / "inv.ini"), str(env / "topology.yaml")], words)
    assert err.startswith(f"testbed: {var}: ")
    nothing_made(env)


def test_an_ansible_cfg_that_turns_checking_off_is_named(capsys, env, monkeypatch):
    cfg = env / "ansible.cfg"
    cfg.write_text("[defaults]\nhost_key_checking = False\n")
    monkeypatch.setenv("ANSIBLE_CONFIG", str(cfg))
    (env / "inv.ini").write_text("h1\n")
    refused(capsys, ["fleet", "run", str(env / "inv.ini"), str(env / "topology.yaml")], f"{cfg}: HOST_KEY_CHECKING")
    monkeypatch.setenv("ANSIBLE_CONFIG", str(_fifo(env / "fifo.cfg")))
    refused(capsys, ["fleet", "run", str(env / "inv.ini"), str(env / "topology.yaml")], "is a FIFO", seconds=10)
    nothing_made(env)


@pytest.mark.parametrize("argv,words", [
    (["--limit", "@hosts.retry"], "--limit"),
    (["--limit", "-x"], "--limit"),
    (["--wheel", "/dev/zero"], "--wheel"),
    (["--forks", "0"], "--forks"),
    (["--db", "mysql://db/x"], "--db"),
])
def test_fleet_run_arguments(capsys, env, argv, words):
    (env / "inv.ini").write_text("h1\n")
    refused(capsys, ["fleet", "run", str(env / "inv.ini"), str(env / "topology.yaml"), *argv], words)
    nothing_made(env)


def test_a_peer_that_is_not_in_the_run_or_a_one_host_topology_is_refused(capsys, env):
    (env / "inv.ini").write_text("h1 testbed_peer=h2 testbed_data_address=198.19.0.1 testbed_data_interface=eth1\n"
                                 "h2 testbed_data_address=198.19.0.2 testbed_data_interface=eth1\n")
    refused(capsys, ["fleet", "run", str(env / "inv.ini"), str(env / "topology.yaml")], "one host")
    nothing_made(env)


# --------------------------------------------------------------------------- fleet runs on disk

def _fleet(d: Path, **host) -> Path:
    f = d / "results" / "fleet-x"
    (f / "hosts").mkdir(parents=True)
    h = {"name": "h1", "status": "done", **host}
    (f / "fleet.json").write_text(json.dumps({
        "format_version": 1, "fleet_id": "fleet-x", "dir": str(f), "inventory": str(d / "inv.ini"),
        "topology": "topology.yaml", "limit": None, "forks": 5, "db": None, "started": "now",
        "ended": None, "hosts": [h]}))
    return f


def test_a_fleet_report_reads_only_inside_its_fleet_folder(capsys, env):
    (env / "outside").mkdir()
    f = _fleet(env, run_dir="../../outside")
    refused(capsys, ["fleet", "report", str(f)], "leads outside")
    f2 = _fleet(env / "b", run_dir="hosts/h1/r1")
    (f2 / "hosts" / "h1" / "r1").mkdir(parents=True)
    os.symlink(env / "outside", f2 / "hosts" / "h1" / "r1" / "run.json")
    refused(capsys, ["fleet", "report", str(f2)], "a link out of the run directory")


def test_retry_of_a_fleet_without_its_wheel_is_refused(capsys, env):
    f = _fleet(env, status="failed", reason="x")
    refused(capsys, ["fleet", "run", "--retry-failed", str(f)], "wheel")


@pytest.mark.parametrize("edit,words", [
    (lambda r: r.update(hosts=[{"name": "h1", "status": "done", "folder": "../x"}]), "folder"),
    (lambda r: r.update(hosts=[{"name": "h1", "status": "weird"}]), "status"),
    (lambda r: r.update(forks=10**9), "forks"),
    (lambda r: r.update(topology="../../etc/passwd"), "topology"),
    (lambda r: r.update(hosts="h1"), "hosts"),
    # a host listed twice would be counted twice in its class's outliers and capacity
    (lambda r: r.update(hosts=[{"name": "h1", "status": "done"}, {"name": "h1", "status": "done"}]),
     "host 'h1' is listed twice"),
    (lambda r: r.update(hosts=[{"name": "h1", "status": "done", "folder": "h"},
                               {"name": "h2", "status": "done", "folder": "h"}]), "folder 'h' is another host's"),
    (lambda r: r.update(hosts=[{"name": "h1", "status": "done", "peer": "h9", "role": "first"}]),
     "its pair's other host 'h9' is not listed as its peer"),
    (lambda r: r.update(hosts=[{"name": "h1", "status": "done", "peer": "h2", "role": "first"},
                               {"name": "h2", "status": "done", "peer": "h1", "role": "first"}]),
     "is not listed as its peer"),
    (lambda r: r.update(hosts=[{"name": "h1", "status": "done", "peer": "h1", "role": "first"}]),
     "is not listed as its peer"),
    (lambda r: r.update(hosts=[{"name": "h1", "status": "done", "peer": "h2", "role": "leader"},
                               {"name": "h2", "status": "done", "peer": "h1", "role": "second"}]), "role 'leader'"),
])
def test_a_damaged_fleet_record_is_refused(capsys, env, edit, words):
    f = _fleet(env)
    raw = json.loads((f / "fleet.json").read_text())
    edit(raw)
    (f / "fleet.json").write_text(json.dumps(raw))
    refused(capsys, ["fleet", "report", str(f)], words)


def test_a_fleet_json_fifo_does_not_hang(capsys, env):
    f = env / "results" / "fleet-y"
    f.mkdir(parents=True)
    _fifo(f / "fleet.json")
    refused(capsys, ["fleet", "report", str(f)], "not a fleet run", seconds=10)


# --------------------------------------------------------------------------- fetched archives

def _tar(path: Path, members: list[tuple[str, str, str]]) -> Path:
    """members: (name, kind, payload): kind file, dir, sym, link, fifo, chr."""
    import io
    with tarfile.open(path, "w:gz") as t:
        for name, kind, payload in members:
            ti = tarfile.TarInfo(name)
            data = b""
            if kind == "file":
                data = payload.encode()
                ti.size = len(data)
            else:
                ti.type = {"dir": tarfile.DIRTYPE, "sym": tarfile.SYMTYPE, "link": tarfile.LNKTYPE,
                           "fifo": tarfile.FIFOTYPE, "chr": tarfile.CHRTYPE}[kind]
                ti.linkname = payload
            t.addfile(ti, io.BytesIO(data) if data else None)
    return path


GOOD = [("run-1", "dir", ""), ("run-1/run.json", "file", "{}")]
TARS = {
    "absolute": GOOD + [("/tmp/x", "file", "x")],
    "dotdot": GOOD + [("run-1/../../x", "file", "x")],
    "symlink_out": GOOD + [("run-1/l", "sym", "/etc/passwd")],
    "symlink_in": GOOD + [("run-1/l", "sym", "run.json")],
    "hardlink": GOOD + [("run-1/h", "link", "/etc/passwd")],
    "device": GOOD + [("run-1/d", "chr", "")],
    "fifo": GOOD + [("run-1/f", "fifo", "")],
    "two_tops": GOOD + [("other/x", "file", "x")],
    "top_not_a_run_id": [("..x", "dir", ""), ("..x/run.json", "file", "{}")],
    "control_char": GOOD + [("run-1/a\nb", "file", "x")],
}


@pytest.mark.parametrize("case", sorted(TARS))
def test_an_archive_with_a_hostile_member_unpacks_nothing(tmp_path, case):
    from testbed.fleet import fetched
    archive = _tar(tmp_path / "run.tgz", TARS[case])
    fleet = tmp_path / "fleet"
    fleet.mkdir()
    with pytest.raises(UserFileError):
        fetched.unpack(archive, fleet, "h1")
    assert not (fleet / "hosts" / "h1").exists() and not (tmp_path / "x").exists()
    assert not [p for p in (fleet / "hosts").glob("*")] if (fleet / "hosts").exists() else True


def test_a_plain_archive_unpacks_into_the_hosts_folder(tmp_path):
    from testbed.fleet import fetched
    archive = _tar(tmp_path / "run.tgz", GOOD + [("run-1/samples.jsonl", "file", "")])
    fleet = tmp_path / "fleet"
    fleet.mkdir()
    d = fetched.unpack(archive, fleet, "h1")
    assert d == fleet / "hosts" / "h1" / "run-1" and (d / "run.json").read_text() == "{}"
    with pytest.raises(UserFileError):
        fetched.unpack(_tar(tmp_path / "b.tgz", GOOD), fleet, "../x")


def test_host_folders_are_plain_and_unique():
    from testbed.fleet import hostvars
    names = ["hv1", "HV1", "hv1.example.com", "fe80::1", "a b", "x/y", "x_y", "..", "-o"]
    folders = [hostvars.host_folder(n) for n in names]
    assert len(set(folders)) == len(folders)
    assert all("/" not in f and f not in (".", "..") and not f.startswith("-") for f in folders)
    assert folders[:4] == names[:4]


# --------------------------------------------------------------------------- history, capacity, bench, resume

def test_history_acknowledgements(capsys, env):
    root = env / "results"
    refused(capsys, ["history", "--ack", "c@r", "--who", "a\x1b[2Jb", "--why", "x"], "--who")
    refused(capsys, ["history", "--ack", "c@r", "--who", "ann", "--why", "line\nbreak"], "--why")
    refused(capsys, ["history", "--ack", "c/../x@r", "--who", "ann", "--why", "known"], "--ack")
    refused(capsys, ["history", "--who", "ann"], "--who")
    nothing_made(env)
    root.mkdir()
    _fifo(root / "history-acks.jsonl")
    refused(capsys, ["history", "--ack", "c@r", "--who", "ann", "--why", "known"], "is a FIFO", seconds=10)
    refused(capsys, ["history"], "is a FIFO", seconds=10)
    (root / "history-acks.jsonl").unlink()
    (root / "history-acks.jsonl").write_text('{"cell": "c", "run": "r"}\ngarbage\n{"cell": "d", "run": "s"}\n')
    refused(capsys, ["history", "--ack", "c@r", "--who", "ann", "--why", "known"], "history-acks.jsonl:2")
    refused(capsys, ["history"], "history-acks.jsonl:2")
    assert (root / "history-acks.jsonl").read_text().count("\n") == 3          # nothing appended


def test_a_good_acknowledgement_is_written_and_read_back(capsys, env):
    from testbed.analysis import history
    assert cli.main(["history", "--ack", "bridge-qemu-mtu1500-conn1-tcp_rr@20261127T000000Z-ab12",
                     "--who", "Ann O'Neil", "--why", "kernel 6.1.5 fixed it"]) == 0
    (a,) = history.read_acks(env / "results")
    assert a["by"] == "Ann O'Neil" and a["cell"] == "bridge-qemu-mtu1500-conn1-tcp_rr"


@pytest.mark.parametrize("argv,arg", [
    (["capacity", "r", "--slo", "p99<1ms@1tps", "--slo", "p99<2ms@1tps"], "--slo"),
    (["capacity", "r", "--slo", "p99<" + "9" * 400 + "ms@1tps"], "--slo"),
    (["capacity", "r", "--profile", "rr:1ktps", "--profile", "rr:2ktps"], "--profile"),
    (["capacity", str(RUN), "--profile", "rr:" + "9" * 400 + "tps"], "--profile"),
    (["capacity", "r", "--slo", "p99<1ms@" + "9" * 400 + "tps"], "--slo"),
    (["capacity", "r", "--slo", "loss<0.1%@" + "9" * 400 + "gbit"], "--slo"),
    (["capacity", "r" * 300], "RUN"),
    (["report", "r", "-o", "x.html", "--slo", "p99<1ms@1tps", "--slo", "p99<1ms@1tps"], "--slo"),
    (["bench", "gate", "--pairs", "nan"], "--pairs"),
    (["bench", "gate", "--pairs", "2"], "--pairs"),
    (["bench", "density", "--pairs", "²"], "--pairs"),
    (["bench", "density", "--pairs", "1,,2"], "--pairs"),
    (["bench", "density", "--pairs", "٣"], "--pairs"),
    (["bench", "density", "--pairs", "1" * 30], "--pairs"),
    (["bench", "boot", "--rounds", "²"], "--rounds"),
    (["bench", "boot", "--cells", "5"], "--cells"),
    (["bench", "soak", "--cells", "1e3"], "--cells"),
    (["bench", "soak", "--rounds", "2"], "--rounds"),
    (["fleet", "report", "x", "--z", "inf"], "--z"),
    (["fleet", "report", "x", "--z", "nan"], "--z"),
    (["fleet", "report", "x", "--z", "-1"], "--z"),
    (["run", "t.yaml", "--resume", ""], "--resume"),
    (["run", "t.yaml", "--resume", "r" * 5000], "--resume"),
    (["run", "t.yaml", "--resume", "run\x1b"], "--resume"),
    # an option that takes one value, given twice: argparse would keep the last, silently
    (["history", "--ack", "c@r", "--who", "ann", "--who", "bob", "--why", "known"], "--who"),
    (["history", "--ack", "c@r", "--ack", "d@s", "--who", "ann", "--why", "known"], "--ack"),
    (["fleet", "report", "x", "--z", "3", "--z", "4"], "--z"),
    (["run", "t.yaml", "--resume", "a", "--resume", "b"], "--resume"),
    (["bench", "gate", "--seed", "1", "--seed", "2"], "--seed"),
    (["bench", "gate", "--seed", "nan"], "--seed"),
    (["bench", "gate", "--cells", "19"], "--cells"),
    (["bench", "boot", "--seed", "3"], "--seed"),
])
def test_arguments_are_refused_naming_themselves(capsys, env, argv, arg):
    refused(capsys, argv, arg)
    nothing_made(env)


@pytest.mark.parametrize("opt", [["--budget", "3"], ["--extra", "2"], ["--fdr", "0.1"], ["--spending", "pocock"],
                                 ["--junit", "x.xml"], ["--threshold", "0.1"]])
def test_gate_options_without_the_gate_are_refused(capsys, env, opt):
    refused(capsys, ["run", str(env / "topology.yaml"), *opt], opt[0])
    nothing_made(env)


def test_a_resume_run_that_is_a_fifo_does_not_hang(capsys, env):
    (env / "r").mkdir()
    _fifo(env / "r" / "run.json")
    refused(capsys, ["run", str(env / "topology.yaml"), "--resume", str(env / "r")], "not a run directory",
            seconds=10)
    nothing_made(env)


@pytest.mark.parametrize("value", ["0", "-0.05", "0.6", "nan", "5%"])
def test_a_gate_threshold_out_of_range_is_refused_before_anything_runs(capsys, env, value):
    refused(capsys, ["run", str(env / "topology.yaml"), "--decide-against", str(env / "base"),
                     "--threshold", value], "--threshold")
    nothing_made(env)


def test_the_gate_threshold_given_is_the_designs():
    import argparse

    from testbed.measure import decide
    design = decide.design_from_args(argparse.Namespace(seq_threshold=0.12, seq_extra=None, seq_fdr=None))
    assert design.threshold == 0.12 and "unchanged only within +-12%" in design.describe(0.75, 0.01, 0.02)
    assert decide.design_from_args(argparse.Namespace()).threshold == 0.05


# --------------------------------------------------------------------------- results commands

def _runs(d: Path) -> Path:
    root = d / "results"
    for name in ("run-a", "run-b"):
        shutil.copytree(RUN, root / name)
    return root


@pytest.mark.parametrize("argv,words", [
    # a path part longer than a file name may be: one line, not the file system's traceback
    (["compare", "run-a", "r" * 300], "not a run directory"),
    (["report", "r" * 300], "not a run directory"),
    (["export-csv", "r" * 300], "not a run directory"),
    (["index", "r" * 300], "not a run directory"),
    # the statistics take levels in (0, 1): 0 passed the parser and failed in them
    (["compare", "run-a", "run-b", "--fdr", "0"], "--fdr"),
    (["compare", "run-a", "run-b", "--alpha", "-0"], "--alpha"),
    # a run compared with itself passes whatever it holds
    (["compare", "run-a", "run-a"], "BASE itself"),
    # ASCII digits only: float() reads '٣' as 3
    (["capacity", "run-a", "--profile", "rr:٣tps"], "--profile"),
])
def test_results_commands_refuse_in_one_line(capsys, env, argv, words):
    _runs(env)
    refused(capsys, argv, words)


@pytest.mark.parametrize("db", ["mysql://db/x", "SQLITE:///tmp/x.sqlite", "file:x.sqlite?mode=rwc", "-"])
def test_index_refuses_a_store_it_cannot_use_and_creates_nothing(capsys, env, db):
    _runs(env)
    before = sorted(p.name for p in env.iterdir())
    refused(capsys, ["index", "run-a", "--db", db], "--db")
    assert sorted(p.name for p in env.iterdir()) == before


def test_an_acknowledgement_is_not_glued_to_a_torn_last_line(capsys, env):
    root = env / "results"
    root.mkdir()
    torn = '{"cell": "c1", "run": "r1", "by": "a", "why": "b"}\n{"cell": "c2", "ru'
    (root / "history-acks.jsonl").write_text(torn)
    refused(capsys, ["history", "--ack", "c3@r3", "--who", "ann", "--why", "known"], "last line is torn")
    assert (root / "history-acks.jsonl").read_text() == torn


def test_cleanup_reads_its_hosts_file_before_removing_anything(capsys, env, monkeypatch):
    from testbed.admin import cleanup
    monkeypatch.setattr(cleanup, "find", lambda *a, **k: pytest.fail("looked for objects before the file was read"))
    refused(capsys, ["cleanup", "--hosts", str(env / "nope.yaml")], "nope.yaml")


def test_compare_prints_no_terminal_escape_or_forged_line_from_a_runs_files(capsys, env):
    root = _runs(env)
    for name in ("run-a", "run-b"):
        p = root / name / "run.json"
        raw = json.loads(p.read_text())
        raw["environment"]["cpu_model"] = "AMD EPYC\x1b]0;pwned\x07\nFAKE LINE: 0 regressed"
        p.write_text(json.dumps(raw))
    cli.main(["compare", "run-a", "run-b"])
    out = capsys.readouterr().out
    assert "\x1b" not in out and "\x07" not in out
    assert not any(line.startswith("FAKE LINE") for line in out.splitlines()), out


@pytest.mark.parametrize("argv,arg", [
    (["export-csv", "run-a", "-o", "results/run-a/samples.jsonl"], "--output"),
    (["compare", "run-a", "run-b", "--junit", "results/run-a/run.json"], "--junit"),
    (["report", "run-b", "--baseline", "run-a", "-o", "results/run-a/run.json"], "--output"),
    (["history", "-o", "results/index.sqlite"], "--output"),
    (["history", "-o", "results/history-acks.jsonl"], "--output"),
])
def test_an_output_never_replaces_an_input(capsys, env, argv, arg):
    """Written over, the run, the store or the acknowledgements were lost at exit 0."""
    root = _runs(env)
    assert cli.main(["index", "run-a", "run-b"]) == 0
    (root / "history-acks.jsonl").write_text('{"cell": "c1", "run": "r1", "by": "a", "why": "b"}\n')
    capsys.readouterr()
    before = {p: p.read_bytes() for p in root.rglob("*") if p.is_file()}
    refused(capsys, argv, f"{arg}: ")
    assert {p: p.read_bytes() for p in root.rglob("*") if p.is_file()} == before


@pytest.mark.parametrize("argv,arg", [
    # an option its command would drop without a word
    (["bench", "boot", "--threshold", "0.3"], "--threshold"),
    (["bench", "boot", "--added", "0.5"], "--added"),
    (["bench", "gate", "--duration", "100"], "--duration"),
    (["bench", "density", "--gate-samples", "3"], "--gate-samples"),
    (["history", "--ack", "c1@r1", "--who", "a", "--why", "b", "--metric", "nope"], "--metric"),
    (["history", "--ack", "c1@r1", "--who", "a", "--why", "b", "-o", "f.html"], "--output"),
])
def test_an_option_the_command_would_drop_is_refused(capsys, env, argv, arg):
    refused(capsys, argv, f"{arg}: ")
    nothing_made(env)


def test_a_base_with_no_sample_left_decides_nothing(capsys, env):
    """Its every cell is new to BASE: nothing was compared, so the gate cannot say "fine"."""
    root = _runs(env)
    (root / "run-a" / "samples.jsonl").write_text("")
    assert cli.main(["compare", "run-a", "run-b"]) == 5, capsys.readouterr()


def test_cleanup_with_a_hosts_file_cleans_its_remote_hosts_too(capsys, env, monkeypatch):
    """The local clean-up first, then each remote host of the file over its own shell."""
    from testbed.admin import cleanup
    from testbed.host import remote
    seen = []
    monkeypatch.setattr(cleanup, "find", lambda uri: seen.append(("local", uri)))
    monkeypatch.setattr(cleanup, "remove", lambda found, uri: None)
    monkeypatch.setattr(remote, "shell", lambda h: f"shell-of-{h.name}")
    monkeypatch.setattr(cleanup, "find_on", lambda sh, uri: seen.append((sh, uri)))
    monkeypatch.setattr(cleanup, "remove_on", lambda sh, found, uri: None)
    monkeypatch.setattr("testbed.cli._clean", lambda label, find, remove: find() or 0)
    two = Path(__file__).resolve().parents[2] / "examples" / "two-hosts" / "ssh.yaml"
    assert cli.main(["cleanup", "--hosts", str(two)]) == 0, capsys.readouterr().err
    assert seen[0][0] == "local" and [s for s, _ in seen[1:]] == ["shell-of-hb"], seen
