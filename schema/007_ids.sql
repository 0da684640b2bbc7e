-- 007_ids.sql: an alert's id and a silence's id are never given again (schema version 7). Applied
-- by schema/store_core.c in the same transaction as any earlier migration; no row changes.
--
-- Operators name alerts and silences by id (`attnstat alerts ack --id N`, `alerts unsilence --id
-- N`, and --alert-exec's and Alertmanager's receivers key on it). Both tables had INTEGER PRIMARY
-- KEY alone, so SQLite gave a new row the largest id in the table plus one: after delete-run took
-- the run whose alerts held the largest ids, the next alert got one of theirs, and a stale
-- `alerts ack --id N` acted on an alert its operator had never seen. AUTOINCREMENT keeps the
-- largest id ever given (sqlite_sequence), so a new row's id is always above every earlier one.
-- The columns cannot change in place, so both tables are rebuilt as 003_lifecycle.sql made them,
-- ids and rows kept; the copies set sqlite_sequence to the largest id present. Ids given before
-- this migration and already gone cannot be known: they may be given once more, above none that
-- exists.
CREATE TABLE alerts_v7 (
  id         INTEGER PRIMARY KEY AUTOINCREMENT,
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
INSERT INTO alerts_v7 (id, run_id, layer, head, step, rule, state, value, threshold, time, message,
                       reason, uid, ack_uid, ack_time)
  SELECT id, run_id, layer, head, step, rule, state, value, threshold, time, message, reason, uid,
         ack_uid, ack_time
  FROM alerts ORDER BY id;
DROP TABLE alerts;
ALTER TABLE alerts_v7 RENAME TO alerts;
CREATE INDEX alerts_key ON alerts (run_id, layer, head, rule, id);
CREATE INDEX alerts_step ON alerts (run_id, step);

CREATE TABLE silences_v7 (
  id      INTEGER PRIMARY KEY AUTOINCREMENT,
  run_id  INTEGER NOT NULL REFERENCES runs(id) ON DELETE CASCADE,
  layer   INTEGER NOT NULL,
  head    INTEGER NOT NULL,
  rule    TEXT    NOT NULL,
  uid     INTEGER NOT NULL,                -- who silenced it
  time    INTEGER NOT NULL,                -- when (ms)
  until   INTEGER                          -- ms; NULL: until the run ends
);
INSERT INTO silences_v7 (id, run_id, layer, head, rule, uid, time, until)
  SELECT id, run_id, layer, head, rule, uid, time, until FROM silences ORDER BY id;
DROP TABLE silences;
ALTER TABLE silences_v7 RENAME TO silences;
CREATE INDEX silences_run ON silences (run_id, layer, head, rule);
