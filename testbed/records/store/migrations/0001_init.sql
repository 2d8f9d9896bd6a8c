-- 0001: runs, cells and samples. Shared by SQLite and PostgreSQL, so only portable types:
-- TEXT, INTEGER, DOUBLE PRECISION. Timestamps stay ISO 8601 text exactly as run.json has
-- them (they sort correctly, all in UTC); JSON documents are text (sorted keys) so both
-- backends hold byte-identical rows. Booleans are INTEGER 0/1.
-- The migration runner splits on semicolons: none inside comments or literals.

CREATE TABLE runs (
    run_id            TEXT PRIMARY KEY,
    dir               TEXT NOT NULL,
    format_version    INTEGER NOT NULL,
    status            TEXT NOT NULL,
    started           TEXT,
    ended             TEXT,
    accelerator       TEXT,
    comparable_class  TEXT,
    cpu_model         TEXT,
    cpu_mhz           DOUBLE PRECISION,
    cpus              INTEGER,
    host              TEXT,
    kernel            TEXT,
    environment       TEXT NOT NULL,
    topology          TEXT NOT NULL,
    counts            TEXT NOT NULL
);

CREATE INDEX runs_started ON runs (started);

CREATE TABLE cells (
    run_id       TEXT NOT NULL REFERENCES runs (run_id) ON DELETE CASCADE,
    cell_id      TEXT NOT NULL,
    attachment   TEXT NOT NULL,
    backend      TEXT NOT NULL,
    mtu          INTEGER NOT NULL,
    connections  INTEGER NOT NULL,
    profile      TEXT NOT NULL,
    tool         TEXT,
    status       TEXT NOT NULL,
    reason       TEXT,
    converged    INTEGER,
    summary      TEXT NOT NULL,
    PRIMARY KEY (run_id, cell_id)
);

-- seq is the sample's line number in samples.jsonl: unique within a run even if a future
-- runner repeats (cell, rep, warmup), and it keeps the order the samples were taken in.
CREATE TABLE samples (
    run_id              TEXT NOT NULL REFERENCES runs (run_id) ON DELETE CASCADE,
    seq                 INTEGER NOT NULL,
    cell_id             TEXT NOT NULL,
    attachment          TEXT NOT NULL,
    backend             TEXT NOT NULL,
    mtu                 INTEGER NOT NULL,
    connections         INTEGER NOT NULL,
    profile             TEXT NOT NULL,
    tool                TEXT,
    rep                 INTEGER NOT NULL,
    warmup              INTEGER NOT NULL,
    status              TEXT NOT NULL,
    reason              TEXT,
    started             TEXT,
    ended               TEXT,
    throughput_mbps     DOUBLE PRECISION,
    transactions_per_s  DOUBLE PRECISION,
    latency_mean_us     DOUBLE PRECISION,
    latency_p50_us      DOUBLE PRECISION,
    latency_p90_us      DOUBLE PRECISION,
    latency_p99_us      DOUBLE PRECISION,
    host_cores          DOUBLE PRECISION,
    guest_cores         DOUBLE PRECISION,
    qemu_cores          DOUBLE PRECISION,
    metrics             TEXT NOT NULL,
    cpu                 TEXT NOT NULL,
    PRIMARY KEY (run_id, seq)
);

CREATE INDEX samples_cell ON samples (run_id, cell_id);
