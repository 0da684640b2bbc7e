-- 001_init.sql: the first attnstat schema. Runs, per-(run, layer, head, step) samples, alerts.
-- Applied by schema/store_core.c inside one transaction, which then sets PRAGMA user_version = 1.
-- Times are Unix milliseconds. Statistics that are undefined (a head with no counted rows) are NULL.

CREATE TABLE runs (
  id          INTEGER PRIMARY KEY,
  name        TEXT    NOT NULL,
  rank        INTEGER NOT NULL DEFAULT 0,
  host        TEXT,
  pid         INTEGER,
  started     INTEGER NOT NULL,          -- first Hello of this (name, rank)
  last_hello  INTEGER NOT NULL,          -- latest Hello (reconnects reuse the run)
  config      TEXT,                      -- free text from the Hello (JSON)
  thresholds  TEXT,                      -- effective alert thresholds (JSON)
  -- Summary kept up to date by every batch, so listing runs never scans the samples.
  samples     INTEGER NOT NULL DEFAULT 0,
  step_min    INTEGER,
  step_max    INTEGER,
  last_time   INTEGER,
  UNIQUE (name, rank)
);

CREATE TABLE samples (
  run_id            INTEGER NOT NULL REFERENCES runs(id) ON DELETE CASCADE,
  layer             INTEGER NOT NULL CHECK (layer >= 0),
  head              INTEGER NOT NULL CHECK (head >= 0),
  step              INTEGER NOT NULL,
  time              INTEGER NOT NULL,
  rows              INTEGER NOT NULL,
  rows_norm         INTEGER NOT NULL,
  rows_empty        INTEGER NOT NULL,
  nonfinite_rows    INTEGER NOT NULL,
  entropy_mean      REAL,
  entropy_std       REAL,
  entropy_min       REAL,
  entropy_max       REAL,
  entropy_norm_mean REAL,
  collapsed_frac    REAL,
  max_logit         REAL,
  sampled           INTEGER NOT NULL DEFAULT 0,
  PRIMARY KEY (run_id, layer, head, step)
) WITHOUT ROWID;

-- The layer x head grid of one step, and step ranges across every head of a run.
CREATE INDEX samples_step ON samples (run_id, step);

CREATE TABLE alerts (
  id         INTEGER PRIMARY KEY,
  run_id     INTEGER NOT NULL REFERENCES runs(id) ON DELETE CASCADE,
  layer      INTEGER NOT NULL,
  head       INTEGER NOT NULL,
  step       INTEGER NOT NULL,
  rule       TEXT    NOT NULL,           -- entropy_floor, entropy_drop, logit_ceiling, nonfinite
  state      TEXT    NOT NULL CHECK (state IN ('raised', 'cleared')),
  value      REAL,
  threshold  REAL,
  time       INTEGER NOT NULL,
  message    TEXT
);

-- Latest state per (run, layer, head, rule): the active-alert query walks this index.
CREATE INDEX alerts_key ON alerts (run_id, layer, head, rule, id);
