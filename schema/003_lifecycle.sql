-- 003_lifecycle.sql: runs that end and alerts that end (schema version 3). Applied by
-- schema/store_core.c in the same transaction as any earlier migration; no row is lost.

-- 1. A run's owner is a column. attnstatd kept it inside the thresholds text, as "owner_uid":UID
-- after the thresholds (daemon/owners.c, schema version 2): it moves out of the text into the
-- column, and the text keeps the thresholds alone. A run recorded before owners existed has none
-- (NULL: the first uid to say Hello with its name takes it).
ALTER TABLE runs ADD COLUMN owner_uid INTEGER;
UPDATE runs SET owner_uid = json_extract(thresholds, '$.owner_uid'),
                thresholds = json_remove(thresholds, '$.owner_uid')
  WHERE thresholds IS NOT NULL AND json_valid(thresholds)
    AND json_type(thresholds, '$.owner_uid') = 'integer';

-- 2. When a run ended and why ('goodbye', 'disconnected', 'idle', 'deleted', ...); NULL while it
-- runs, or when no daemon saw it end. A new Hello of the same (name, rank) clears both.
ALTER TABLE runs ADD COLUMN ended INTEGER;
ALTER TABLE runs ADD COLUMN end_reason TEXT;

-- 3. Alerts end. A transition is now raised, cleared (its samples became good again) or resolved
-- (its run ended, or an operator resolved it: uid says who). reason says why a cleared or resolved
-- transition happened; ack_uid / ack_time record who acknowledged a raise, and when. The CHECK of
-- version 1 names two states only, so the table is rebuilt (ids and rows kept as they were).
CREATE TABLE alerts_v3 (
  id         INTEGER PRIMARY KEY,
  run_id     INTEGER NOT NULL REFERENCES runs(id) ON DELETE CASCADE,
  layer      INTEGER NOT NULL,
  head       INTEGER NOT NULL,
  step       INTEGER NOT NULL,
  rule       TEXT    NOT NULL,
  state      TEXT    NOT NULL CHECK (state IN ('raised', 'cleared', 'resolved')),
  value      REAL,
  threshold  REAL,
  time       INTEGER NOT NULL,
  message    TEXT,
  reason     TEXT,                       -- cleared / resolved: why
  uid        INTEGER,                    -- resolved by hand: the operator's uid
  ack_uid    INTEGER,                    -- raised: acknowledged by this uid ...
  ack_time   INTEGER                     -- ... at this time (ms)
);
INSERT INTO alerts_v3 (id, run_id, layer, head, step, rule, state, value, threshold, time, message,
                       reason)
  SELECT id, run_id, layer, head, step, rule, state, value, threshold, time, message,
         CASE state WHEN 'cleared' THEN 'samples' END
  FROM alerts ORDER BY id;
DROP TABLE alerts;
ALTER TABLE alerts_v3 RENAME TO alerts;
CREATE INDEX alerts_key ON alerts (run_id, layer, head, rule, id);
CREATE INDEX alerts_step ON alerts (run_id, step);

-- 4. Silences: the transitions of one (run, layer, head, rule) are recorded but not delivered
-- (no --alert-exec, no watcher) until `until` (ms), or, when until is NULL, until the run ends.
CREATE TABLE silences (
  id      INTEGER PRIMARY KEY,
  run_id  INTEGER NOT NULL REFERENCES runs(id) ON DELETE CASCADE,
  layer   INTEGER NOT NULL,
  head    INTEGER NOT NULL,
  rule    TEXT    NOT NULL,
  uid     INTEGER NOT NULL,                -- who silenced it
  time    INTEGER NOT NULL,                -- when (ms)
  until   INTEGER                          -- ms; NULL: until the run ends
);
CREATE INDEX silences_run ON silences (run_id, layer, head, rule);
