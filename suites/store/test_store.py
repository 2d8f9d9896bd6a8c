"""The results index on SQLite and on a real PostgreSQL server: same schema, same rows.

PostgreSQL tests use the throwaway server from conftest.py (skipped, with the reason, when
it cannot be installed or started).
"""
from __future__ import annotations

import argparse
import json
import sqlite3
import threading
from pathlib import Path

import pytest

from testbed.cli import results as cli_results
from testbed.records import store
from testbed.records.store import schema

pytestmark = pytest.mark.store

REAL = "20261122T030019Z-a0e9"
VARIED = "20261123T030000Z-b1b1"
DEAD = "20261122T025932Z-1a46"


def index_all(st: store.Store, root: Path) -> None:
    for d in sorted(root.iterdir()):
        st.index_run(d)


def snapshot(st: store.Store) -> dict[str, tuple]:
    return {table: st.rows(table) for table in schema.TABLES}


# --------------------------------------------------------------------------- schema

def test_migrations_are_numbered_from_one_and_split_into_statements():
    migs = schema.migrations()
    assert [m.version for m in migs] == list(range(1, len(migs) + 1))
    assert migs[0].name == "init"
    first = migs[0].statements()
    assert any(s.startswith("CREATE TABLE samples") for s in first)
    assert not any("--" in s or ";" in s for s in first)


def test_row_models_name_exactly_the_tables_columns(tmp_path):
    with store.open(tmp_path / "i.sqlite"):
        pass
    con = sqlite3.connect(tmp_path / "i.sqlite")
    for table, (model, key) in schema.TABLES.items():
        cols = [r[1] for r in con.execute(f"PRAGMA table_info({table})")]
        assert tuple(cols) == schema.columns(model), table
        pk = [r[1] for r in sorted(con.execute(f"PRAGMA table_info({table})"), key=lambda r: r[5]) if r[5]]
        assert tuple(pk) == key, table


# --------------------------------------------------------------------------- SQLite

def test_index_is_idempotent(results_root, tmp_path):
    db = tmp_path / "index.sqlite"
    with store.open(db) as st:
        index_all(st, results_root)
        first = snapshot(st)
        index_all(st, results_root)
        assert snapshot(st) == first
    with store.open(f"sqlite://{db}") as st:            # reopened: no new migration, same rows
        assert st.migrate() == 0 and st.schema_version() == schema.latest_version()
        assert snapshot(st) == first
    assert [r.run_id for r in first["runs"]] == [DEAD, REAL, VARIED]
    assert len(first["samples"]) == 2 + 2 * 2 * (1 + 3 + 1)


def test_rows_carry_the_run_and_the_sample(results_root, tmp_path):
    with store.open(tmp_path / "i.sqlite") as st:
        index_all(st, results_root)
        (run,) = [r for r in st.runs() if r.run_id == REAL]
        assert (run.accelerator, run.cpu_model, run.cpus, run.status) == ("tcg", "AMD EPYC", 2, "complete")
        assert json.loads(run.environment)["comparable_class"] == "tcg-functional-only"
        stream, rr = st.samples(REAL)
        assert stream.throughput_mbps == 2232.23 and stream.transactions_per_s is None
        assert rr.transactions_per_s == 1688.402 and rr.latency_p99_us == 1322.0
        assert stream.host_cores == 1.6081
        assert stream.guest_cores == pytest.approx(0.8724 + 0.6092)
        assert stream.qemu_cores == pytest.approx(0.9202 + 0.7342)
        assert json.loads(stream.cpu)["window_s"] == 10.379
        assert {c.cell_id for c in st.cells(REAL)} == {stream.cell_id, rr.cell_id}

        varied = st.samples(VARIED)
        assert sum(s.warmup for s in varied) == 4
        failed = [s for s in varied if s.status == "failed"]
        assert len(failed) == 4 and all(s.reason.startswith("netperf timed out") for s in failed)
        assert all(s.throughput_mbps is None and s.metrics == "{}" for s in failed)
        assert len([s for s in varied if s.ok]) == 12
        assert st.samples(DEAD) == () and st.cells(DEAD) == ()


def test_reindexing_a_growing_run_replaces_its_rows(results_root, tmp_path):
    run = results_root / REAL
    with store.open(tmp_path / "i.sqlite") as st:
        st.index_run(run)
        lines = (run / "samples.jsonl").read_text().splitlines()
        with (run / "samples.jsonl").open("a") as f:
            f.write(lines[0].replace('"rep": 0', '"rep": 1') + "\n")
        st.index_run(run)
        assert [s.seq for s in st.samples(REAL)] == [0, 1, 2]
        assert len(st.rows("runs")) == 1


def test_a_newer_schema_is_refused(tmp_path):
    db = tmp_path / "i.sqlite"
    store.open(db).close()
    con = sqlite3.connect(db)
    con.execute("INSERT INTO schema_version VALUES (999, 'future', 'x')")
    con.commit()
    with pytest.raises(store.StoreError, match="schema version 999"):
        store.open(db)


def test_default_index_lives_in_the_results_directory(monkeypatch, tmp_path):
    monkeypatch.setenv("TESTBED_RESULTS", str(tmp_path))
    assert store.default_target() == str(tmp_path / "index.sqlite")


def test_index_command_indexes_every_run(results_root, tmp_path, capsys):
    parser = argparse.ArgumentParser(prog="testbed")
    cli_results.add_commands(parser.add_subparsers(dest="cmd", required=True))
    args = parser.parse_args(["index", "--results", str(results_root)])
    assert args.func(args) == 0
    out = capsys.readouterr()
    assert f"indexed {VARIED} (complete-with-failures): 4 cells, 20 samples" in out.out
    assert "3 runs" in out.err
    with store.open(results_root / "index.sqlite") as st:
        assert len(st.runs()) == 3


# --------------------------------------------------------------------------- PostgreSQL

def test_sqlite_and_postgres_hold_the_same_rows(results_root, tmp_path, pg_url):
    with store.open(tmp_path / "i.sqlite") as lite, store.open(pg_url) as pg:
        assert (lite.backend, pg.backend) == ("sqlite", "postgresql")
        for st in (lite, pg):
            index_all(st, results_root)
            index_all(st, results_root)          # idempotent on both
        a, b = snapshot(lite), snapshot(pg)
        for table in schema.TABLES:
            assert a[table] == b[table], table
        assert len(b["samples"]) == 22 and lite.schema_version() == pg.schema_version()
        assert lite.runs() == pg.runs()
        assert lite.samples(VARIED) == pg.samples(VARIED)


def test_postgres_migrations_are_idempotent_and_serialized(pg_url):
    errors: list[BaseException] = []

    def opener() -> None:
        try:
            store.open(pg_url).close()
        except BaseException as e:   # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=opener) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert errors == []
    with store.open(pg_url) as st:
        assert st.migrate() == 0
        assert st.schema_version() == schema.latest_version()
        assert st._db.query("SELECT count(*) FROM schema_version")[0][0] == len(schema.migrations())


def test_postgres_connection_errors_name_the_server_not_the_password():
    with pytest.raises(store.StoreError) as e:
        store.open("postgresql://tb:secret@127.0.0.1:1/none")
    assert "secret" not in str(e.value) and "127.0.0.1" in str(e.value)


def test_reading_an_empty_postgres_database_creates_nothing(pg_url, capsys):
    """`history --db URL` on a database that is not a testbed store is refused (exit 2, one
    line) and leaves it without a single table: only `index` creates a store."""
    from testbed import cli
    assert cli.main(["history", "--db", pg_url]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "not a testbed results store" in err
    import psycopg
    with psycopg.connect(pg_url) as c:
        tables = c.execute("SELECT count(*) FROM information_schema.tables "
                           "WHERE table_schema = 'public'").fetchone()[0]
    assert tables == 0
    with store.open(pg_url) as st:                 # index creates it; now it reads
        assert st.schema_version() >= 1
    with store.open(pg_url, readonly=True) as st:
        assert st.runs() == ()
