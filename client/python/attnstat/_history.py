"""attnstat.history: read the history database that attnstatd writes, with Python's own sqlite3
module: no libattnstat, no daemon, nothing beyond the standard library (pandas only for
dataframe()). The file may be read while the daemon writes it (WAL); nothing here writes to it.

    import attnstat
    h = attnstat.history("/var/lib/attnstat/history.db")
    for run in h.runs():
        print(run["id"], run["name"], run["samples"])
    rows = h.samples("gpt-small", layer=3, step_from=1000, step_to=2000)  # a list of dicts
    df = h.dataframe("gpt-small", layer=3)                                # when pandas is installed

A row is one (layer, head, step) sample, or one head of a downsampled bucket, with the keys of the
store's export (STORE_EXPORT_CSV_HEADER in schema/store_read.h): run_id, layer, head, step,
step_last, tier ("exact", "compact" or "bucket"), merged, time_ms, rows, rows_norm, rows_empty,
nonfinite_rows, sampled, then every statistic of vocab/vocab.h's table in its order (entropy_mean,
entropy_std, entropy_min, entropy_max, entropy_norm_mean, collapsed_frac, max_logit, sink_mass,
distance), then <field>_lo / <field>_hi for each of them (a bucket's minimum and maximum; a
sample's own value otherwise). Missing statistics are float("nan") (sink_mass and distance of rows
stored before they were recorded too); max_logit is -inf for a head with no counted row. Rows come
ordered by layer, then step, then head, a bucket before a sample of its first step, as the store
exports them.

The store keeps a run's samples in three tiers (schema/002_compact.sql), read here as one, as the
store reads them (schema/store_read.h): the exact tier (table samples: every value as pushed), the
compact tier (table history: each head of a (layer, step) packed into a BLOB at the precision
schema/store_pack.h states; a head in both tiers is read from the exact one) and downsampled
buckets (table coarse: per head the minimum, mean and maximum over a window of steps). The BLOB
format is decoded here from its description in schema/store_pack.h: versions 1 and 2, each
version's fixed columns laid out from attnstat._vocab.STATS by the header's rule.
"""
import math
import os
import sqlite3
import stat
import struct

from . import _vocab

__all__ = ["history", "History", "HistoryError"]

_APPLICATION_ID = 0x61747374  # 'atst'
_VERSIONS = (1, 2, 3, 4, 5, 6, 7)  # schema versions this reader understands (1: exact rows
                                 # only; 3 and 4 add columns to runs, tiers unchanged; 5 adds
                                 # columns of statistics to samples: those with since > 1 in
                                 # vocab.h; 6 adds the interventions table, which this reader
                                 # does not read; 7 rebuilds alerts and silences, columns as
                                 # they were)
_FIELDS = tuple(r["name"] for r in _vocab.STATS)    # the statistics, in table order
_COUNTS = tuple(r["name"] for r in _vocab.COUNTS)
_TIERS = ("exact", "compact", "bucket")
# compact format versions (schema/store_pack.h): 1 .. the newest `since` of the table (the C
# encoder writes that one: store_pack.c asserts that no row's since is past its STORE_PACK_VERSION)
_PACK_VERSIONS = tuple(range(1, max(r["since"] for r in _vocab.STATS) + 1))
_SCALE = {"VOCAB_PACK_NAT16": 2048.0, "VOCAB_PACK_UNIT16": 65534.0}


class HistoryError(Exception):
    """The file is missing, not an attnstat database, of a schema this reader does not know, or a
    run asked for does not exist (or is ambiguous)."""


def history(db_path):
    """Open the history database at db_path for reading (a History)."""
    return History(db_path)


# ---- the compact format (schema/store_pack.h) ------------------------------------------------------
def _varint(b, i):
    shift = value = 0
    while True:
        if i >= len(b) or shift > 63:
            raise HistoryError("a compact row is damaged (varint)")
        c = b[i]
        i += 1
        value |= (c & 0x7F) << shift
        if not c & 0x80:
            return value, i
        shift += 7


def _unzig(u):
    return (u >> 1) ^ -(u & 1)


def _fix(u, scale):
    return math.nan if u == 0xFFFF else u / scale


def _bits(b, i, n):
    return [bool((b[i + (h >> 3)] >> (h & 7)) & 1) for h in range(n)]


def layout(version):
    """The fixed columns of a compact row of this version, by schema/store_pack.h's rule: the F32
    fields of the statistics with since <= version in table order, then their 16-bit fields
    (NAT16, UNIT16) in table order. A list of (field, struct code, scale or None, offset in units
    of n), and the bytes per head."""
    rows = [r for r in _vocab.STATS if r["since"] <= version]
    cols, at = [], 0
    for r in [r for r in rows if r["pack"] == "VOCAB_PACK_F32"]:
        cols.append((r["name"], "f", None, at))
        at += 4
    for r in [r for r in rows if r["pack"] != "VOCAB_PACK_F32"]:
        cols.append((r["name"], "H", _SCALE[r["pack"]], at))
        at += 2
    return cols, at


_LAYOUTS = {v: layout(v) for v in _PACK_VERSIONS}


def unpack(blob, row_time):
    """Decode a compact row: a list of (head, time_ms, stats dict), heads ascending. Fields its
    version lacks read as NaN."""
    b = bytes(blob)
    if len(b) < 3 or b[0] not in _LAYOUTS:
        raise HistoryError("a compact row is not in the format this reader knows")
    cols, fixed = _LAYOUTS[b[0]]
    n, i = _varint(b, 1)
    flags = b[i]
    i += 1
    if n < 1 or len(b) < i + fixed * n + (n + 7) // 8:
        raise HistoryError("a compact row is damaged (too short)")
    values = {}
    for name, code, scale, off in cols:
        v = struct.unpack_from("<%d%s" % (n, code), b, i + off * n)
        values[name] = v if scale is None else [_fix(u, scale) for u in v]
    i += fixed * n
    sampled = _bits(b, i, n)
    i += (n + 7) // 8
    first = []
    for _ in range(len(_COUNTS)):
        u, i = _varint(b, i)
        first.append(_unzig(u))
    counts = [list(first) for _ in range(n)]
    if flags & 2:
        differ = _bits(b, i, n)
        i += (n + 7) // 8
        for h in range(n):
            if differ[h]:
                for k in range(len(_COUNTS)):
                    u, i = _varint(b, i)
                    counts[h][k] = _unzig(u)
    heads = list(range(n))
    if flags & 1:
        prev = -1
        for h in range(n):
            d, i = _varint(b, i)
            heads[h] = d if h == 0 else prev + 1 + d
            prev = heads[h]
    times = [row_time] * n
    if flags & 4:
        differ = _bits(b, i, n)
        i += (n + 7) // 8
        for h in range(n):
            if differ[h]:
                u, i = _varint(b, i)
                times[h] = row_time + _unzig(u)
    if i != len(b):
        raise HistoryError("a compact row is damaged (trailing bytes)")
    out = []
    for h in range(n):
        s = {f: values[f][h] if f in values else math.nan for f in _FIELDS}
        s["sampled"] = int(sampled[h])
        s.update(zip(_COUNTS, counts[h]))
        out.append((heads[h], times[h], s))
    return out


def _row(run_id, layer, head, step, step_last, tier, merged, time_ms, s, lo=None, hi=None):
    r = {"run_id": run_id, "layer": layer, "head": head, "step": step, "step_last": step_last,
         "tier": tier, "merged": merged, "time_ms": time_ms}
    for k in _COUNTS:
        r[k] = s[k]
    r["sampled"] = s["sampled"]
    for f in _FIELDS:
        r[f] = s[f]
    for f in _FIELDS:
        r[f + "_lo"] = (lo or s)[f]
        r[f + "_hi"] = (hi or s)[f]
    return r


def _num(v):
    return math.nan if v is None else float(v)


# ---- the database ----------------------------------------------------------------------------------
class History:
    """A read-only view of one history database (see the module's text)."""

    def __init__(self, db_path):
        self.path = db_path
        try:  # SQLite's open of a FIFO (or a device) named like a database waits for ever
            mode = os.stat(db_path).st_mode
        except OSError as e:
            raise HistoryError("cannot read %s: %s" % (db_path, e.strerror)) from None
        if not stat.S_ISREG(mode):
            raise HistoryError("%s is %s, not a database file" % (
                db_path, "a FIFO" if stat.S_ISFIFO(mode) else "a directory"
                if stat.S_ISDIR(mode) else "not a regular file"))
        try:
            self._db = sqlite3.connect("file:%s?mode=ro" % db_path, uri=True)
            app = self._db.execute("PRAGMA application_id").fetchone()[0]
            self.version = self._db.execute("PRAGMA user_version").fetchone()[0]
        except sqlite3.Error as e:
            raise HistoryError("cannot read %s: %s" % (db_path, e)) from None
        if app != _APPLICATION_ID or self.version not in _VERSIONS:
            self._db.close()
            raise HistoryError("%s is not an attnstat history database this reader knows "
                               "(application_id %#x, schema version %d; known: %s)"
                               % (db_path, app, self.version, _VERSIONS))

    def close(self):
        self._db.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def runs(self):
        """Every run, ordered by id: a list of dicts (id, name, rank, host, pid, started_ms,
        last_hello_ms, config, thresholds, samples, step_min, step_max, last_time_ms)."""
        cur = self._db.execute(
            "SELECT id, name, rank, host, pid, started, last_hello, config, thresholds, samples, "
            "step_min, step_max, last_time FROM runs ORDER BY id")
        keys = ("id", "name", "rank", "host", "pid", "started_ms", "last_hello_ms", "config",
                "thresholds", "samples", "step_min", "step_max", "last_time_ms")
        return [dict(zip(keys, r)) for r in cur]

    def run_id(self, run, rank=None):
        """A run's id from its id (int) or its name (str; rank when the name has several)."""
        if isinstance(run, int):
            if not self._db.execute("SELECT 1 FROM runs WHERE id = ?", (run,)).fetchone():
                raise HistoryError("no run with id %d in %s" % (run, self.path))
            return run
        q = "SELECT id, rank FROM runs WHERE name = ?" + ("" if rank is None else " AND rank = ?")
        found = self._db.execute(q, (run,) if rank is None else (run, rank)).fetchall()
        if not found:
            raise HistoryError("no run named %r in %s" % (run, self.path))
        if len(found) > 1:
            raise HistoryError("run name %r matches %d runs (ranks %s): give rank=" %
                               (run, len(found), sorted(r[1] for r in found)))
        return found[0][0]

    def alerts(self, run=None, active=False, rank=None):
        """Alert transitions (all runs, or one), ordered by id; active: only each (run, layer,
        head, rule)'s latest one, when it is a raise. A list of dicts."""
        where, args = "", ()
        if run is not None:
            where, args = "WHERE run_id = ?", (self.run_id(run, rank),)
        q = ("SELECT id, run_id, layer, head, step, rule, state, value, threshold, time, message "
             "FROM alerts %s ORDER BY id" % where)
        if active:
            q = ("SELECT id, run_id, layer, head, step, rule, state, value, threshold, time, "
                 "message FROM alerts WHERE id IN (SELECT max(id) FROM alerts %s GROUP BY run_id, "
                 "layer, head, rule) AND state = 'raised' ORDER BY id" % where)
        keys = ("id", "run_id", "layer", "head", "step", "rule", "state", "value", "threshold",
                "time_ms", "message")
        out = []
        for r in self._db.execute(q, args):
            d = dict(zip(keys, r))
            d["value"], d["threshold"] = _num(d["value"]), _num(d["threshold"])
            out.append(d)
        return out

    def samples(self, run, layer=None, head=None, step_from=None, step_to=None, rank=None):
        """The samples of one run (an id, or a name with rank when it has several), optionally
        of one layer, one head, and steps [step_from, step_to] (a bucket is included when its
        window overlaps the range). A list of dicts (see the module's text), in one snapshot."""
        rid = self.run_id(run, rank)
        lo = -(1 << 63) if step_from is None else int(step_from)
        hi = (1 << 63) - 1 if step_to is None else int(step_to)
        lw, la = ("", ()) if layer is None else (" AND layer = ?", (int(layer),))
        out = {}  # (layer, step, kind, head) -> row; kind 0 bucket, 1 sample
        self._db.execute("BEGIN")
        try:
            if self.version >= 2:
                q = ("SELECT layer, step, time, data FROM history WHERE run_id = ? AND step "
                     "BETWEEN ? AND ?" + lw)
                for ly, st, t, data in self._db.execute(q, (rid, lo, hi) + la):
                    for h, tm, s in unpack(data, t):
                        if head is None or h == head:
                            out[(ly, st, 1, h)] = _row(rid, ly, h, st, st, "compact", 1, tm, s)
                q = ("SELECT layer, step_lo, step_hi, time, merged, lo, mean, hi FROM coarse "
                     "WHERE run_id = ? AND step_lo <= ? AND step_hi >= ?" + lw)
                for ly, slo, shi, t, merged, blo, bmean, bhi in self._db.execute(
                        q, (rid, hi, lo) + la):
                    mins, means, maxs = unpack(blo, t), unpack(bmean, t), unpack(bhi, t)
                    counts, i = [], 0
                    for _ in means:
                        c, i = _varint(bytes(merged), i)
                        counts.append(c)
                    for (h, tm, s), (_, _, sl), (_, _, sh), c in zip(means, mins, maxs, counts):
                        if head is None or h == head:
                            out[(ly, slo, 0, h)] = _row(rid, ly, h, slo, shi, "bucket", c, tm, s,
                                                        sl, sh)
            hw, ha = ("", ()) if head is None else (" AND head = ?", (int(head),))
            # the statistics the file has columns for (NaN for the others: before version 5)
            cols = {r[1] for r in self._db.execute("PRAGMA table_info(samples)")}
            have = [f for f in _FIELDS if f in cols]
            q = ("SELECT layer, head, step, time, %s, %s, sampled FROM samples WHERE run_id = ? "
                 "AND step BETWEEN ? AND ?" % (", ".join(_COUNTS), ", ".join(have)) + lw + hw)
            nc = len(_COUNTS)
            for r in self._db.execute(q, (rid, lo, hi) + la + ha):
                s = dict(zip(_COUNTS, r[4:4 + nc]))
                s.update((f, math.nan) for f in _FIELDS)
                s.update((f, _num(v)) for f, v in zip(have, r[4 + nc:4 + nc + len(have)]))
                s["sampled"] = r[4 + nc + len(have)]
                out[(r[0], r[2], 1, r[1])] = _row(rid, r[0], r[1], r[2], r[2], "exact", 1, r[3], s)
        finally:
            self._db.execute("COMMIT")
        return [out[k] for k in sorted(out)]

    def dataframe(self, run, **kw):
        """samples(run, **kw) as a pandas DataFrame (ImportError when pandas is not installed)."""
        try:
            import pandas
        except ImportError:
            raise ImportError("attnstat.history: dataframe() needs pandas; samples() returns "
                              "the same rows as dicts") from None
        return pandas.DataFrame(self.samples(run, **kw))
