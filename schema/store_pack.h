/* store_pack.h — the compact sample format of the store: every head of one (run, step, layer) in
 * one BLOB, 24 bytes and one bit per head plus a few bytes per row (version 2; version 1, which
 * this code still reads, took 18). Private to schema/ (the store's compact tier and its buckets:
 * store_rows.c, store_compact.c, store_downsample.c) and to the tests;
 * client/python/attnstat/_history.py decodes the same bytes by the same rule. The fields and their
 * encodings are vocab/vocab.h's VOCAB_STATS rows (columns pack and since): nothing here lists them.
 * Pure functions: no SQLite, no allocation, no global state. Includes kernels/stats.h, vocab.h.
 *
 * Precision: what each encoding (the `pack` column) keeps, and why that is enough
 *   F32 (entropy_mean, max_logit, distance)
 *                      IEEE binary32, round to nearest: relative error <= 2^-24 (6.0e-8). The value
 *                      the trend plots and the entropy_drop rule compares; the GPU kernel agrees with
 *                      the double reference to 1e-4 relative, 1700x coarser (max_logit: 1e-5).
 *                      Magnitudes beyond 3.4e38 read back as +-inf; -inf (max_logit of a head with no
 *                      counted row) stays -inf. A distance is in positions, up to the keys (< 2^31):
 *                      binary32 keeps it to 128 positions in 2^31, 1 in 2^24 everywhere.
 *   NAT16 (entropy_std, entropy_min, entropy_max)
 *                      unsigned 16-bit fixed point in units of 1/2048 nat: absolute error <= 2.5e-4
 *                      nat, range [0, 31.9995]. An entropy lies in [0, ln(keys)] and keys < 2^31, so
 *                      <= 21.5 nats; the kernel is held to 1e-3 nat on these three against the
 *                      reference, 4x coarser than this step. Values outside the range are clamped.
 *   UNIT16 (entropy_norm_mean, collapsed_frac, sink_mass)
 *                      unsigned 16-bit fixed point in units of 1/65534: absolute error <= 7.7e-6,
 *                      range [0, 1] (all three are fractions by definition; outside values are
 *                      clamped). The entropy_floor rule's default threshold is 0.1: 1.3e4 steps
 *                      above zero; a sink_mass_ceiling is compared at the same 7.7e-6.
 *   rows, rows_norm, rows_empty, nonfinite_rows
 *                      exact (64-bit, zigzag varints; stored once per row when the heads agree).
 *   sampled            one bit: 0 or 1 (any non-zero value reads back as 1).
 *   time_ms, head      exact.
 * Missing values: NaN in any field reads back as NaN (one canonical NaN; the fixed-point fields
 * reserve 0xFFFF for it). -0.0 reads back as +0.0, as in the exact tier. A field that a row's
 * version does not carry (since > version: sink_mass and distance in a version-1 row) reads as NaN.
 *
 * The fixed columns of version v (the rule, applied to the VOCAB_STATS rows with since <= v):
 *   first the F32 fields, in table order, f32[n] each; then the 16-bit fields (NAT16, UNIT16), in
 *   table order, u16[n] each. One column per field, a head's value at its index in the row.
 *   version 1 (since 1): f32 entropy_mean, f32 max_logit, u16 entropy_std, u16 entropy_min,
 *                        u16 entropy_max, u16 entropy_norm_mean, u16 collapsed_frac   (18 per head)
 *   version 2 (since <= 2): f32 entropy_mean, f32 max_logit, f32 distance, u16 entropy_std,
 *                        u16 entropy_min, u16 entropy_max, u16 entropy_norm_mean,
 *                        u16 collapsed_frac, u16 sink_mass                            (24 per head)
 *   Version 1 is what version-1 code wrote, byte for byte (tests/test_store_pack.c builds such a
 *   row by hand from this list); a new row is always written as STORE_PACK_VERSION.
 *
 * The bytes (little-endian; varint = unsigned LEB128 of 64 bits, zigzag maps signed to unsigned)
 *   u8      version, 1 or 2
 *   varint  n, the number of heads (>= 1)
 *   u8      flags: 1 head ids listed (else the heads are 0 .. n-1), 2 count exceptions,
 *                  4 time exceptions
 *   the fixed columns of the version (above)
 *   u8[(n+7)/8] sampled, bit h%8 of byte h/8 for the h-th head of the row
 *   zigzag x4  rows, rows_norm, rows_empty, nonfinite_rows of the first head
 *   flag 2: u8[(n+7)/8] bitmap of the heads whose counts differ from the first's; then, for each
 *           of them in order, its four counts (zigzag)
 *   flag 1: varint id of the first head, then for each next head (id - previous id - 1)
 *   flag 4: u8[(n+7)/8] bitmap of the heads whose time differs from the row's time; then, for each
 *           of them in order, zigzag (time - row time)
 * The row's time lives beside the blob (a column of its table), so a row of one push costs nothing
 * for times; rows that merge pushes of different times list the exceptions.
 */
#ifndef ATTNSTAT_STORE_PACK_H
#define ATTNSTAT_STORE_PACK_H

#include <stddef.h>
#include <stdint.h>

#include "stats.h"
#include "vocab.h"

#define STORE_PACK_VERSION 2 /* the version written; 1 .. STORE_PACK_VERSION are read */

/* The statistics and counts of a stats_head by their row index in vocab.h (VOCAB_STATS,
 * VOCAB_COUNTS), for the code of schema/ that loops over the table. */
#define STORE_OFF_(name, ...) offsetof(stats_head, name),
static inline double *store_stat(stats_head *h, int i)
{
    static const size_t off[VOCAB_NSTATS] = {VOCAB_STATS(STORE_OFF_)};
    return (double *)(void *)((char *)h + off[i]);
}
static inline double store_stat_get(const stats_head *h, int i)
{
    return *store_stat((stats_head *)h, i);
}
static inline int64_t *store_count(stats_head *h, int i)
{
    static const size_t off[VOCAB_NCOUNTS] = {VOCAB_COUNTS(STORE_OFF_)};
    return (int64_t *)(void *)((char *)h + off[i]);
}
#undef STORE_OFF_

/* One head of a compact row: its id, its time and its statistics. */
typedef struct {
    int32_t head;
    int64_t time_ms;
    stats_head s;
} store_pack_head;

/* Bytes that encoding n heads may take at most. */
size_t store_pack_bound(int32_t n);

/* Encode heads[0 .. n-1] (n >= 1, head ids >= 0 and strictly ascending) for a row whose time is
 * row_time into out (store_pack_bound(n) bytes). Returns the number of bytes written. */
size_t store_pack_encode(const store_pack_head *heads, int32_t n, int64_t row_time, uint8_t *out);

/* The number of heads of an encoded row; -1 when the bytes are not a valid compact row. */
int32_t store_pack_count(const uint8_t *blob, size_t len);

/* Decode every head of a row into out (store_pack_count() entries). 0, or -1 when the bytes are not
 * a valid compact row (then out is partly written). */
int store_pack_decode(const uint8_t *blob, size_t len, int64_t row_time, store_pack_head *out);

/* Decode the one head whose id is `head`: 1 found, 0 not in the row, -1 not a valid row. */
int store_pack_decode_one(const uint8_t *blob, size_t len, int64_t row_time, int32_t head,
                          store_pack_head *out);

/* The fixed columns of version `version` (1 .. STORE_PACK_VERSION), by the rule above: col[i] is
 * the byte offset of VOCAB_STATS row i's column in units of n (the column starts at n * col[i]
 * after the flags byte), or -1 when the version lacks the row. Returns the bytes per head. */
size_t store_pack_layout(int version, long col[VOCAB_NSTATS]);

/* Round every field of h to what it reads back as once packed (the precision above). */
void store_pack_round(stats_head *h);

/* A list of non-negative 64-bit counts as varints (a bucket's per-head sample counts).
 * store_pack_counts_encode writes n varints (10 * n bytes at most) and returns the length;
 * store_pack_counts_decode reads exactly n of them: 0, or -1 when the bytes do not hold n. */
size_t store_pack_counts_encode(const int64_t *v, int32_t n, uint8_t *out);
int store_pack_counts_decode(const uint8_t *blob, size_t len, int64_t *v, int32_t n);

#endif /* ATTNSTAT_STORE_PACK_H */
