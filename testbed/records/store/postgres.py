"""The shared backend: PostgreSQL through psycopg 3, for many hosts' runs in one place.

The schema and migrations are the SQLite ones. The dialect shim is two lines: ``?``
placeholders become ``%s``, and migrations take an advisory lock (SQLite's BEGIN IMMEDIATE
does that job there).
"""
from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator, Sequence
from typing import Any

from testbed.records.store.schema import StoreError

#: pg_advisory_xact_lock key that serializes schema migrations (any constant will do)
MIGRATION_LOCK = 0x7E57BED


def redact(url: str) -> str:
    """The URL without its password, for error messages and logs."""
    return re.sub(r"(://[^:/@]*):[^@]*@", r"\1:***@", url)


class PostgresBackend:
    name = "postgresql"

    def __init__(self, url: str) -> None:
        self.where = redact(url)
        try:
            import psycopg
        except ImportError:
            raise StoreError("PostgreSQL index needs psycopg 3 (pip install psycopg); "
                             "it is in the project's dependencies") from None
        self.errors: tuple[type[BaseException], ...] = (psycopg.Error,)
        try:
            # autocommit: no implicit transactions; `transaction()` says where they are.
            self.conn = psycopg.connect(url, autocommit=True, connect_timeout=10)
        except psycopg.Error as e:
            raise StoreError(f"cannot connect to {self.where}: {str(e).strip()}") from None

    @staticmethod
    def _sql(sql: str) -> str:
        # Our statements never contain a literal ? or %, so this is the whole shim.
        return sql.replace("?", "%s")

    @contextlib.contextmanager
    def transaction(self) -> Iterator[None]:
        with self.conn.transaction():
            yield

    def lock_for_migration(self) -> None:
        self.conn.execute("SELECT pg_advisory_xact_lock(%s)", (MIGRATION_LOCK,))

    def execute(self, sql: str, params: Sequence[Any] = ()) -> None:
        self.conn.execute(self._sql(sql), tuple(params) or None)

    def executemany(self, sql: str, rows: Sequence[Sequence[Any]]) -> None:
        if not rows:
            return
        with self.conn.cursor() as cur:
            cur.executemany(self._sql(sql), [tuple(r) for r in rows])

    def query(self, sql: str, params: Sequence[Any] = ()) -> list[tuple]:
        return [tuple(r) for r in self.conn.execute(self._sql(sql), tuple(params) or None).fetchall()]

    def go_live(self) -> None:
        """Nothing to do: a PostgreSQL connection always reads the live database."""

    def close(self) -> None:
        self.conn.close()
