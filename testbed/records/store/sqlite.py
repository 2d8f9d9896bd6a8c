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
        # A read-only open of a store with no -wal beside it starts on an immutable view:
        # SQLite opens a WAL database's -wal and -shm even to read it, and would leave
        # both beside a foreign or damaged file before refusing it. No -wal means no
        # writer holds the file, so its main file has every committed row. go_live()
        # swaps to the live view once the Store has checked the file is a store.
        self._probing = readonly and not Path(self.where + "-wal").exists()
        try:
            self.conn = self._connect(immutable=self._probing)
            if not readonly:
                # WAL: a report can read the index while a nightly job is writing to it.
                self.conn.execute("PRAGMA journal_mode = WAL")
            self.conn.execute("SELECT count(*) FROM sqlite_master").fetchall()
        except sqlite3.Error as e:
            raise StoreError(f"{self.where}: not a usable SQLite index: {e}") from None

    def _connect(self, immutable: bool) -> sqlite3.Connection:
        if not self.readonly:
            # isolation_level=None: no implicit transactions; `transaction()` says where.
            conn = sqlite3.connect(self.where, timeout=30.0, isolation_level=None)
        else:
            # mode=ro: a read never changes the database.
            uri = ("file:" + urllib.parse.quote(str(Path(self.where).absolute())) + "?mode=ro"
                   + ("&immutable=1" if immutable else ""))
            conn = sqlite3.connect(uri, uri=True, timeout=30.0, isolation_level=None)
        conn.execute("PRAGMA foreign_keys = ON")
        return conn

    def go_live(self) -> None:
        """The file is a store this testbed reads: read it live from here on, so rows a
        writer commits meanwhile are seen and its checkpoints cannot tear a read."""
        if self._probing:
            self.conn.close()
            try:
                self.conn = self._connect(immutable=False)
            except sqlite3.Error as e:
                raise StoreError(f"{self.where}: not a usable SQLite index: {e}") from None
            self._probing = False

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
                head = f.read(100)
        except OSError as e:
            raise StoreError(f"{where}: {e.strerror}") from None
        if head[:16] != cls.MAGIC:
            raise StoreError(f"{where}: not a SQLite database")
        if problem := cls._header_problem(head):
            raise StoreError(f"{where}: a damaged SQLite header ({problem})")

    @staticmethod
    def _header_problem(head: bytes) -> str:
        """What is wrong with a 100-byte database header whose magic is right, or "".

        Checked here because SQLite acts on a damaged header before it refuses it: a
        header whose version bytes say WAL makes even a read-only open create -wal and
        -shm files beside the file. The fields are fixed by SQLite's file format."""
        if len(head) < 100:
            return f"{len(head)} bytes, shorter than the 100-byte header"
        size = int.from_bytes(head[16:18], "big")
        if not (size == 1 or (512 <= size <= 32768 and size & (size - 1) == 0)):
            return f"page size {size}"
        if head[18] not in (1, 2) or head[19] not in (1, 2):
            return f"file format versions {head[18]}/{head[19]}"
        if tuple(head[21:24]) != (64, 32, 32):
            return f"payload fractions {tuple(head[21:24])}"
        return ""

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
