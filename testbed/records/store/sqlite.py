"""The embedded backend: one SQLite file (default results/index.sqlite)."""
from __future__ import annotations

import contextlib
import os
import sqlite3
import stat
import urllib.parse
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from testbed.records.store.schema import StoreError


class SqliteBackend:
    """SQL is written with ``?`` placeholders, SQLite's own style."""

    name = "sqlite"
    errors: tuple[type[BaseException], ...] = (sqlite3.Error,)

    #: the first bytes of every SQLite 3 database file
    MAGIC = b"SQLite format 3\x00"

    def __init__(self, path: str | Path, readonly: bool = False) -> None:
        self.where = str(path)
        self.readonly = readonly
        if readonly:
            self._check_existing(Path(path))
        elif self.where != ":memory:":
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            if Path(path).exists():
                self._check_existing(Path(path))
        try:
            if readonly:
                # mode=ro: a read never creates or changes the file (nor its -wal/-shm).
                uri = "file:" + urllib.parse.quote(str(Path(path).absolute())) + "?mode=ro"
                self.conn = sqlite3.connect(uri, uri=True, timeout=30.0, isolation_level=None)
            else:
                # isolation_level=None: no implicit transactions; `transaction()` says where.
                self.conn = sqlite3.connect(self.where, timeout=30.0, isolation_level=None)
            self.conn.execute("PRAGMA foreign_keys = ON")
            if not readonly:
                # WAL: a report can read the index while a nightly job is writing to it.
                self.conn.execute("PRAGMA journal_mode = WAL")
            self.conn.execute("SELECT count(*) FROM sqlite_master").fetchall()
        except sqlite3.Error as e:
            raise StoreError(f"{self.where}: not a usable SQLite index: {e}") from None

    def _check_existing(self, p: Path) -> None:
        self._check_file(p, self.where, self.readonly)

    @classmethod
    def _check_file(cls, p: Path, where: str, readonly: bool) -> None:
        """A store file must be a regular SQLite file: a text file, random bytes or a device
        is refused before SQLite touches it."""
        from testbed.host import safeio
        try:
            st = os.stat(p)
        except FileNotFoundError:
            raise StoreError(f"{where}: no results store here (create one with "
                             f"`testbed index`)") from None
        except OSError as e:
            raise StoreError(f"{where}: {e.strerror}") from None
        if not stat.S_ISREG(st.st_mode):
            raise StoreError(f"{where}: is {safeio.kind(st.st_mode)}, not a SQLite file")
        if st.st_size == 0:
            if readonly:
                raise StoreError(f"{where}: an empty file, not a results store "
                                 f"(create one with `testbed index`)")
            raise StoreError(f"{where}: an empty file, not a SQLite results store; "
                             f"remove it or name another")
        try:
            with open(p, "rb") as f:
                head = f.read(16)
        except OSError as e:
            raise StoreError(f"{where}: {e.strerror}") from None
        if head != cls.MAGIC:
            raise StoreError(f"{where}: not a SQLite database")

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
