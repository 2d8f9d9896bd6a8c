"""The results index: every run directory's run.json and samples.jsonl as SQL rows.

``open(target)`` picks the backend: a ``postgresql://`` URL is PostgreSQL (psycopg 3),
anything else a SQLite file path (``sqlite:///path`` also works). Both hold the same tables,
created by the same versioned migrations, and the same rows after indexing the same runs.

The run directories stay the record; the index can be dropped and rebuilt from them at any
time, which is why re-indexing a run replaces its rows instead of adding to them.
"""
from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, Protocol

from testbed.host import paths
from testbed.records import results
from testbed.records.store import schema
from testbed.records.store.schema import CellRow, IndexedRun, RunRow, SampleRow, StoreError, columns

__all__ = ["Store", "StoreError", "open", "default_target", "RunRow", "CellRow", "SampleRow",
           "IndexedRun"]

_VERSION_TABLE = ("CREATE TABLE IF NOT EXISTS schema_version ("
                  "version INTEGER PRIMARY KEY, name TEXT NOT NULL, applied_at TEXT NOT NULL)")


class Backend(Protocol):
    name: str
    where: str
    errors: tuple[type[BaseException], ...]

    def transaction(self) -> contextlib.AbstractContextManager[None]: ...
    def lock_for_migration(self) -> None: ...
    def go_live(self) -> None: ...
    def execute(self, sql: str, params: Sequence[Any] = ()) -> None: ...
    def executemany(self, sql: str, rows: Sequence[Sequence[Any]]) -> None: ...
    def query(self, sql: str, params: Sequence[Any] = ()) -> list[tuple]: ...
    def close(self) -> None: ...


def default_target() -> str:
    return str(paths.results_dir() / "index.sqlite")


def is_postgres(target: str) -> bool:
    return target.startswith(("postgresql://", "postgres://"))


def open(target: str | Path | None = None, readonly: bool = False) -> Store:  # noqa: A001
    """Open (and migrate) the index at ``target``: a path, sqlite:///path or postgresql://...

    ``readonly``: for commands that only read (history, compare --db). The store must exist
    and be this testbed's, at a schema version it knows; nothing is created or migrated, so
    a missing, foreign, corrupt or newer store is refused (StoreError, exit status 2)."""
    target = str(target) if target is not None else default_target()
    if not target.strip() or "\0" in target:
        raise StoreError(f"--db {target!r}: not a store")
    if is_postgres(target):
        from testbed.records.store.postgres import PostgresBackend
        return Store(PostgresBackend(target), readonly=readonly)
    from testbed.records.store.sqlite import SqliteBackend
    return Store(SqliteBackend(target.removeprefix("sqlite://") if target.startswith("sqlite://")
                               else target, readonly=readonly), readonly=readonly)


def check_target(target: str | Path | None, arg: str = "--db") -> None:
    """A store a command will write at its end (`run`, `scenario run`), checked before any
    work: an existing SQLite path must be a SQLite file, a new one must have a folder to go
    in. A PostgreSQL URL is checked when it is opened."""
    target = str(target) if target is not None else default_target()
    if is_postgres(target):
        return
    if not target.strip() or "\0" in target or target == "-":
        raise StoreError(f"{arg} {target!r}: not a store")
    if ("://" in target or re.match(r"[A-Za-z][A-Za-z0-9+.-]*:", target)) and not target.startswith("sqlite://"):
        # mysql://..., postgres:/x...: a URL of a store this testbed does not speak, not a file name
        raise StoreError(f"{arg} {target[:80]!r}: not a store this testbed can use (a SQLite file, "
                         f"sqlite://FILE or a postgresql:// URL)")
    from testbed.records.store.sqlite import SqliteBackend
    path = Path(target.removeprefix("sqlite://") if target.startswith("sqlite://") else target)
    if path.exists() or path.is_symlink():
        SqliteBackend._check_file(path, f"{arg} {path}", readonly=False)
        return
    parent = path.absolute().parent
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    if not parent.is_dir():
        raise StoreError(f"{arg} {path}: {parent} is not a directory")


class Store:
    """One open index. Use as a context manager, or call close()."""

    def __init__(self, backend: Backend, readonly: bool = False) -> None:
        self._db = backend
        try:
            if readonly:
                self.check_readable()
                self._db.go_live()
            else:
                self.migrate()
        except BaseException:
            backend.close()
            raise

    def check_readable(self) -> None:
        """A store opened for reading must already be this testbed's: its schema_version
        table present, at a version this testbed knows, with every table it reads."""
        known = schema.migrations()[-1].version
        try:
            have = self._db.query("SELECT max(version) FROM schema_version")[0][0]
        except self._db.errors:
            raise StoreError(f"{self._db.where}: not a testbed results store (no schema_version "
                             f"table); create one with `testbed index`") from None
        if not isinstance(have, int) or have < 1:
            raise StoreError(f"{self._db.where}: a results store with no schema applied")
        if have > known:
            raise StoreError(f"{self._db.where}: schema version {have}, newer than this "
                             f"testbed knows ({known}); upgrade testbed")
        for table in schema.TABLES:
            try:
                self._db.query(f"SELECT count(*) FROM {table}")
            except self._db.errors as e:
                raise StoreError(f"{self._db.where}: table {table} unreadable: "
                                 f"{str(e).strip().splitlines()[0]}") from None

    @property
    def backend(self) -> str:
        return self._db.name

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._db.close()

    @contextlib.contextmanager
    def _errors(self, doing: str) -> Iterator[None]:
        try:
            yield
        except self._db.errors as e:
            raise StoreError(f"{self._db.name} index {self._db.where}: {doing}: "
                             f"{str(e).strip()}") from None

    # ----------------------------------------------------------------------- schema

    def migrate(self) -> int:
        """Apply every migration not yet recorded in schema_version, in order, each in its
        own transaction. Idempotent; concurrent callers serialize on a lock. Returns how
        many were applied."""
        known = schema.migrations()
        applied = 0
        with self._errors("migrating"):
            for mg in known:
                with self._db.transaction():
                    self._db.lock_for_migration()
                    self._db.execute(_VERSION_TABLE)
                    have = self._db.query("SELECT max(version) FROM schema_version")[0][0] or 0
                    if have > known[-1].version:
                        raise StoreError(
                            f"{self._db.name} index {self._db.where} has schema version {have}, "
                            f"newer than this testbed knows ({known[-1].version}); upgrade testbed")
                    if self._db.query("SELECT 1 FROM schema_version WHERE version = ?",
                                      (mg.version,)):
                        continue
                    for statement in mg.statements():
                        self._db.execute(statement)
                    self._db.execute(
                        "INSERT INTO schema_version (version, name, applied_at) VALUES (?, ?, ?)",
                        (mg.version, mg.name, results.now()))
                    applied += 1
        return applied

    def schema_version(self) -> int:
        with self._errors("reading schema_version"):
            return int(self._db.query("SELECT max(version) FROM schema_version")[0][0] or 0)

    # ----------------------------------------------------------------------- writing

    def index_run(self, run_dir: str | Path) -> IndexedRun:
        """Index one run directory. Re-indexing replaces that run's rows (a run indexed while
        it was still running gets its later samples), so nothing is ever duplicated."""
        rows = schema.rows_for_run(results.read_run(Path(run_dir)))
        run_id = rows.run.run_id
        with self._errors(f"indexing {run_id}"), self._db.transaction():
            for table in ("samples", "cells", "runs"):
                self._db.execute(f"DELETE FROM {table} WHERE run_id = ?", (run_id,))
            for table, items in (("runs", (rows.run,)), ("cells", rows.cells),
                                 ("samples", rows.samples)):
                model = schema.TABLES[table][0]
                cols = columns(model)
                self._db.executemany(
                    f"INSERT INTO {table} ({', '.join(cols)}) VALUES ({', '.join('?' * len(cols))})",
                    [tuple(getattr(r, c) for c in cols) for r in items])
        return rows

    # ----------------------------------------------------------------------- reading

    def _select(self, table: str, where: str = "", params: Sequence[Any] = ()) -> list:
        model, key = schema.TABLES[table]
        cols = columns(model)
        sql = f"SELECT {', '.join(cols)} FROM {table}"
        if where:
            sql += f" WHERE {where}"
        sql += f" ORDER BY {', '.join(key)}"
        with self._errors(f"reading {table}"):
            return [model(*r) for r in self._db.query(sql, params)]

    def runs(self) -> tuple[RunRow, ...]:
        return tuple(sorted(self._select("runs"), key=lambda r: (r.started or "", r.run_id)))

    def cells(self, run_id: str) -> tuple[CellRow, ...]:
        return tuple(self._select("cells", "run_id = ?", (run_id,)))

    def samples(self, run_id: str) -> tuple[SampleRow, ...]:
        return tuple(self._select("samples", "run_id = ?", (run_id,)))

    def rows(self, table: str) -> tuple[Any, ...]:
        """Every row of a table as row models, in primary-key order: for checking that two
        backends hold the same data, and for export."""
        return tuple(self._select(table))

