-- 005_stats.sql: two more per-head statistics in the exact tier (schema version 5). Applied by
-- schema/store_core.c in the same transaction as any earlier migration; no row is lost and no
-- value changes.
--
-- vocab/vocab.h describes every per-head statistic as a row; from this version on `samples` has
-- a column for each of them:
--   sink_mass  mean over a head's counted rows of the attention on the row's first visible key
--              (the sink token), in [0, 1];
--   distance   mean over a head's counted rows of sum_j p_ij |i - j|, in positions.
-- Rows stored before this version hold NULL in both, which reads back as NaN (not computed), as
-- any NULL statistic does. The compact tier and the buckets need no change of table: their BLOBs
-- carry a format version (schema/store_pack.h); version-1 rows read the two as NaN.
ALTER TABLE samples ADD COLUMN sink_mass REAL;
ALTER TABLE samples ADD COLUMN distance REAL;
