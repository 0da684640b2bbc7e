-- 002_compact.sql: history at the scale of real runs (schema version 2). Applied by schema/store_core.c
-- in the same transaction as any earlier migration; no row is lost and no value changes.
-- A run's samples now live in three tiers, which the store reads as one (schema/store_read.c):
--   samples  the exact tier: what was just pushed, every double as it came (version 1's table).
--   history  the compact tier: one row per (run, layer, step), every head packed into one BLOB at
--            the precision of schema/store_pack.h (18 bytes and a bit per head). The retention step
--            (schema/store_retain.c) moves samples here once they are older than a few steps.
--   coarse   downsampled buckets: per (run, layer, window of steps), each head's minimum, mean and
--            maximum, for data older than the retention limits.

-- 1. The exact tier keeps its columns and checks but is keyed step first. Version 1's key
-- (run_id, layer, head, step) put each head of a push on its own B-tree page: a commit rewrote
-- one page per head (37 bytes written per byte stored, measured). Step first, a push appends.
-- The run check moves into the store (one lookup per push instead of a foreign key per row).
CREATE TABLE samples_v2 (
  run_id            INTEGER NOT NULL,
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
  PRIMARY KEY (run_id, step, layer, head)
) WITHOUT ROWID;

INSERT INTO samples_v2 (run_id, layer, head, step, time, rows, rows_norm, rows_empty,
                        nonfinite_rows, entropy_mean, entropy_std, entropy_min, entropy_max,
                        entropy_norm_mean, collapsed_frac, max_logit, sampled)
  SELECT run_id, layer, head, step, time, rows, rows_norm, rows_empty, nonfinite_rows,
         entropy_mean, entropy_std, entropy_min, entropy_max, entropy_norm_mean, collapsed_frac,
         max_logit, sampled
  FROM samples ORDER BY run_id, step, layer, head;
DROP TABLE samples;
ALTER TABLE samples_v2 RENAME TO samples;

-- 2. The compact tier. A rowid table: compaction appends its rows, so pages fill (an index
-- B-tree, as WITHOUT ROWID makes, keeps at most ~1 KB of a row in a 4 KB page and spills the
-- rest of a 64-head row, 1.2 KB, to an overflow page of its own: 4x the bytes, measured).
-- history_key finds a layer's (and so a head's) history as one range of the index, and the
-- retention step writes a block of steps at a time, layer by layer, so a layer's consecutive rows
-- are neighbours in the table too. history_step finds a step across layers (the grid) and covers
-- the time, which the age limit reads.
CREATE TABLE history (
  id      INTEGER PRIMARY KEY,
  run_id  INTEGER NOT NULL,
  layer   INTEGER NOT NULL CHECK (layer >= 0),
  step    INTEGER NOT NULL,
  time    INTEGER NOT NULL,          -- the row's time (ms); heads of another time are listed in data
  heads   INTEGER NOT NULL,          -- heads packed in data
  data    BLOB    NOT NULL           -- schema/store_pack.h
);
CREATE UNIQUE INDEX history_key ON history (run_id, layer, step);
CREATE INDEX history_step ON history (run_id, step, layer, time);

-- 3. Downsampled buckets: the window [step_lo, step_hi] of one layer. lo, mean and hi are rows in
-- the compact format holding, per head, the minimum, the mean and the maximum of each field over
-- the samples merged; merged holds each head's number of samples (varints, heads in the order of
-- mean). Windows are aligned to the bucket width, so one step finds its buckets across layers.
-- A rowid table for the same reason as history (a bucket of 64 heads is ~3.7 KB).
CREATE TABLE coarse (
  id      INTEGER PRIMARY KEY,
  run_id  INTEGER NOT NULL,
  layer   INTEGER NOT NULL CHECK (layer >= 0),
  step_lo INTEGER NOT NULL,
  step_hi INTEGER NOT NULL,
  time    INTEGER NOT NULL,          -- newest time merged
  samples INTEGER NOT NULL,          -- samples merged, all heads together
  merged  BLOB    NOT NULL,
  lo      BLOB    NOT NULL,
  mean    BLOB    NOT NULL,
  hi      BLOB    NOT NULL
);
CREATE UNIQUE INDEX coarse_key ON coarse (run_id, layer, step_lo);
CREATE INDEX coarse_step ON coarse (run_id, step_lo, layer);

-- Alerts by step: downsampling keeps the rows of the steps that raised or cleared an alert.
CREATE INDEX alerts_step ON alerts (run_id, step);

-- 4. Runs: per-run retention limits (NULL: the global ones), where downsampling has reached (steps
-- below coarse_upto are downsampled, except the ones alerts keep), and an estimate of the bytes
-- the run's samples take (110 per exact row, see STORE_EXACT_ROW_BYTES in store_internal.h).
ALTER TABLE runs ADD COLUMN retain_ms INTEGER;
ALTER TABLE runs ADD COLUMN retain_bytes INTEGER;
ALTER TABLE runs ADD COLUMN coarse_upto INTEGER;
ALTER TABLE runs ADD COLUMN bytes INTEGER NOT NULL DEFAULT 0;
UPDATE runs SET bytes = samples * 110;
