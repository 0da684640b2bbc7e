-- 004_layout.sql: the parallel layout of a run (schema version 4). Applied by schema/store_core.c
-- in the same transaction as any earlier migration; no row is lost and no value changes.
--
-- A run is one process of a training job: (name, rank). With tensor, pipeline, data or context
-- parallelism the processes of one job share its name and each says where its heads and layers
-- sit in the whole model (proto/attnstat.proto, ParallelLayout). From this version on:
--   samples, history, coarse and alerts hold GLOBAL layer and head numbers (the daemon adds the
--     offsets before it stores a push), so the rows of every process of a job, in every node's
--     database, sit on one layer x head map;
--   runs holds the ranks that produced the run's samples: tensor-parallel (tp), pipeline stage
--     (pp), data-parallel replica (dp), context-parallel (cp), each with its group's size, and the
--     offsets that were applied. NULL: the process said no layout (a run of one process, or one
--     recorded before this version): its local numbers are its global ones.
-- Rows stored before this version keep the numbers they were pushed with.
ALTER TABLE runs ADD COLUMN tp_rank INTEGER;
ALTER TABLE runs ADD COLUMN tp_size INTEGER;
ALTER TABLE runs ADD COLUMN pp_rank INTEGER;
ALTER TABLE runs ADD COLUMN pp_size INTEGER;
ALTER TABLE runs ADD COLUMN dp_rank INTEGER;
ALTER TABLE runs ADD COLUMN dp_size INTEGER;
ALTER TABLE runs ADD COLUMN cp_rank INTEGER;
ALTER TABLE runs ADD COLUMN cp_size INTEGER;
ALTER TABLE runs ADD COLUMN layer_offset INTEGER;
ALTER TABLE runs ADD COLUMN head_offset INTEGER;   -- NULL with a layout: tp_rank x a push's heads
