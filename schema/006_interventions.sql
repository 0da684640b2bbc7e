-- 006_interventions.sql: what a training job did to its model because of what was measured
-- (schema version 6). Applied by schema/store_core.c in the same transaction as any earlier
-- migration; no existing row changes.
--
-- One row per Intervention the daemon accepted (proto/attnstat.proto, Intervention): qk_clip
-- sends one per layer it clipped. The numbers are GLOBAL, as the samples' are: the daemon applies
-- the process's ParallelLayout (layer_offset, head_offset or tp_rank x its pushes' query heads)
-- before it stores them.
--   rank         the process's rank (its Hello's), as in runs
--   step         the step whose measurements it acted on (>= 0)
--   time_ms      when the daemon received it (Unix ms)
--   kind         what was done: 1..32 of [a-z0-9_.-] ("qk_clip")
--   layer        global layer; NULL when the intervention named none
--   heads        the global query heads it acted on, as a JSON array of integers in the order
--                sent ('[]' when none): '[8,11,13]'
--   head_values  one number per head, as a JSON array in the same order ('[0.5,0.25,1]', each
--                written with 17 significant digits, so it reads back bit for bit); NULL when
--                none were sent. qk_clip: the factor each head's logits scale by, in (0, 1].
--   threshold    qk_clip: tau; NULL when none
--   measured     qk_clip: the largest measured max logit among its heads; NULL when none
--   detail       free text (JSON) from the job, <= 1024 bytes; NULL when none
-- SQLite's JSON functions read the arrays: SELECT value FROM interventions, json_each(heads).
-- The rows go with their run (delete-run: foreign key, ON DELETE CASCADE); the retention step
-- never touches them, as it never touches alerts.
CREATE TABLE interventions (
  id           INTEGER PRIMARY KEY,
  run_id       INTEGER NOT NULL REFERENCES runs(id) ON DELETE CASCADE,
  rank         INTEGER NOT NULL,
  step         INTEGER NOT NULL CHECK (step >= 0),
  time_ms      INTEGER NOT NULL,
  kind         TEXT    NOT NULL,
  layer        INTEGER CHECK (layer >= 0),
  heads        TEXT    NOT NULL DEFAULT '[]',
  head_values  TEXT,
  threshold    REAL,
  measured     REAL,
  detail       TEXT
);
CREATE INDEX interventions_run ON interventions (run_id, step);
