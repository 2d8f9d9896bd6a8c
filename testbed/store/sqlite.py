"""The embedded backend: one SQLite file (default results/index.sqlite)."""
from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from testbed.store.schema import StoreError


class SqliteBackend:
    """SQL is written with ``?`` placeholders, SQLite's own style."""

    name = "sqlite"
    errors: tuple[type[BaseException], ...] = (sqlite3.Error,)

    def __init__(self, path: str | Path) -> None:
        self.where = str(path)
        if self.where != ":memory:":
            Path(path).parent.mkdir(parents=True, exist_ok=True)
        try:
            # isolation_level=None: no implicit transactions; `transaction()` says where they are.
            self.conn = sqlite3.connect(self.where, timeout=30.0, isolation_level=None)
            self.conn.execute("PRAGMA foreign_keys = ON")
            # WAL: a report can read the index while a nightly job is writing to it.
            self.conn.execute("PRAGMA journal_mode = WAL")
        except sqlite3.Error as e:
            raise StoreError(f"cannot open SQLite index {self.where}: {e}") from None

    @contextlib.contextmanager
    def transaction(self) -> Iterator[None]:
        # IMMEDIATE takes the write lock up front, so two indexers (or migrators) serialize
        # instead of one failing half-way with "database is locked".
        self.conn.execute("BEGIN IMMEDIATE")
        try:
            yield
        except BaseException:
            self.conn.execute("ROLLBACK")
            raise
        self.conn.execute("COMMIT")

    def lock_for_migration(self) -> None:
        """Nothing to do: BEGIN IMMEDIATE already holds the database's write lock."""

    def execute(self, sql: str, params: Sequence[Any] = ()) -> None:
        self.conn.execute(sql, tuple(params))

    def executemany(self, sql: str, rows: Sequence[Sequence[Any]]) -> None:
        self.conn.executemany(sql, [tuple(r) for r in rows])

    def query(self, sql: str, params: Sequence[Any] = ()) -> list[tuple]:
        return [tuple(r) for r in self.conn.execute(sql, tuple(params)).fetchall()]

    def close(self) -> None:
        self.conn.close()
