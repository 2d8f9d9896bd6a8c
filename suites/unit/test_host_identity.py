"""Which host measured a run: the identity in run.json, history kept apart per host (or pooled
per host class), and compare refusing runs of different hosts unless --across-hosts."""
from __future__ import annotations

import json

import pytest
from test_compare import matrix_run, run_cli

from testbed.analysis import history
from testbed.host import environment, hostid
from testbed.records import results, store

pytestmark = pytest.mark.unit


def test_identity_comes_from_machine_id_and_says_so(tmp_path, monkeypatch):
    (tmp_path / "etc").mkdir()
    (tmp_path / "etc/machine-id").write_text("0123456789abcdef0123456789abcdef\n")
    monkeypatch.delenv(hostid.OVERRIDE, raising=False)
    assert hostid.machine_id(tmp_path) == ("0123456789abcdef0123456789abcdef", "/etc/machine-id")
    monkeypatch.setenv(hostid.OVERRIDE, "fleet-target-a")
    assert hostid.machine_id(tmp_path) == ("fleet-target-a", hostid.OVERRIDE)
    monkeypatch.setenv(hostid.OVERRIDE, "bad id; rm -rf /")
    assert hostid.machine_id(tmp_path) == (None, hostid.OVERRIDE)     # never made up
    monkeypatch.delenv(hostid.OVERRIDE)
    assert hostid.machine_id(tmp_path / "nowhere") == (None, "unreadable")


def test_every_fingerprint_carries_the_identity_and_run_json_reads_back(tmp_path, monkeypatch):
    monkeypatch.setenv(hostid.CLASS, "EPYC gen 3")
    monkeypatch.setenv(hostid.INVENTORY_HOST, "hv07")
    env = environment.fingerprint(None)
    assert env["machine_id"] and env["host"] and env["cpu_model"]
    assert env["host_class"] == "EPYC gen 3" and env["inventory_host"] == "hv07"
    d = matrix_run(tmp_path, "r1", seed=1, **{k: env[k] for k in (
        "machine_id", "machine_id_source", "host_class", "inventory_host")})
    rec = results.read_run(d)            # the one validating reader takes the new keys
    assert rec.environment.machine_id == env["machine_id"]
    assert rec.environment.host_class == "EPYC gen 3"
    raw = json.loads((d / "run.json").read_text())
    assert raw["environment"]["inventory_host"] == "hv07"


def test_a_wrongly_typed_identity_is_refused_naming_the_field(tmp_path):
    d = matrix_run(tmp_path, "r1", seed=1)
    run = json.loads((d / "run.json").read_text())
    run["environment"]["machine_id"] = ["not", "text"]
    (d / "run.json").write_text(json.dumps(run))
    with pytest.raises(results.safeio.UserFileError, match="environment.machine_id"):
        results.read_run(d)


def _two_hosts(root):
    ids = []
    for i in range(8):
        for host, mid, cls in (("hv1", "aaaa1111", "gen3"), ("hv2", "bbbb2222", "gen3")):
            run_id = f"2026110{i}T000000Z-{host}"
            matrix_run(root, run_id, seed=i * 7 + len(host), host=host, machine_id=mid,
                       host_class=cls)
            ids.append(run_id)
    with store.open(root / "index.sqlite") as st:
        for r in ids:
            st.index_run(root / r)
    return ids


def test_history_keeps_hosts_apart_and_pools_a_class_on_request(tmp_path, capsys):
    _two_hosts(tmp_path)
    with store.open(tmp_path / "index.sqlite", readonly=True) as st:
        per_host = history.series(st)
        per_class = history.series(st, by="class")
    cells = {s.cell_id for s in per_host}
    assert len(per_host) == 2 * len(cells)
    assert {s.environment.split(" host ")[1] for s in per_host} == {"hv1 (aaaa1111)", "hv2 (bbbb2222)"}
    assert all(len(s.points) == 8 for s in per_host)
    assert len(per_class) == len(cells) and all(len(s.points) == 16 for s in per_class)
    assert all(s.environment.endswith("class gen3") for s in per_class)
    code, out, _ = run_cli(["history", "--results", str(tmp_path), "--by", "class"], capsys)
    assert code in (0, 1) and "class gen3: 16 runs" in out
    code, _, err = run_cli(["history", "--results", str(tmp_path), "--by", "rack"], capsys)
    assert code == 2 and "--by" in err and len(err.strip().splitlines()) == 1


def test_compare_refuses_runs_of_different_hosts_unless_across_hosts(tmp_path, capsys):
    matrix_run(tmp_path, "base", seed=1, host="hv1", machine_id="aaaa1111")
    matrix_run(tmp_path, "new", seed=2, host="hv2", machine_id="bbbb2222")
    code, out, err = run_cli(["compare", "--results", str(tmp_path), "base", "new"], capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert "different hosts" in err and "hv1 aaaa1111 vs hv2 bbbb2222" in err
    assert "REFUSED" in out
    code, out, err = run_cli(["compare", "--results", str(tmp_path), "base", "new",
                              "--across-hosts"], capsys)
    assert code != 2 and "--across-hosts: BASE and NEW were measured on different hosts" in out
    assert "across-hosts" in err
    code, out, _ = run_cli(["compare", "--results", str(tmp_path), "base", "new",
                            "--across-hosts", "--json"], capsys)
    assert json.loads(out)["across_hosts"] is True


def test_same_host_is_compared_and_old_runs_fall_back_to_the_hostname(tmp_path, capsys):
    matrix_run(tmp_path, "base", seed=1, host="hv1")             # recorded before machine ids
    matrix_run(tmp_path, "new", seed=2, host="hv1", machine_id="aaaa1111")
    code, out, _ = run_cli(["compare", "--results", str(tmp_path), "base", "new"], capsys)
    assert code != 2 and "across-hosts" not in out
    matrix_run(tmp_path, "other", seed=3, host="hv9")
    code, _, err = run_cli(["compare", "--results", str(tmp_path), "base", "other"], capsys)
    assert code == 2 and "hostname" not in err and "hv1 vs hv9" in err
