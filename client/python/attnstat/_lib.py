"""Finding and loading libattnstat.so (candidates(): the wheel's copy, the source tree's build, the
installed soname), and ctypes mirrors of the structs in include/attnstat.h.

Every Structure here has the same fields, in the same order and with the same C types, as its
counterpart in the header; tests/test_python.py compares sizes and offsets with a C compiler's.
"""
import ctypes
import glob
import os
import warnings

from . import _vocab
from ._version import __version__

# ---- Codes and enums (attnstat.h) -----------------------------------------------------------------
OK = 0
DROPPED = 1
EINVAL = 2
ENOMEM = 3
ECONNECT = 4
ECLOSED = 5
EIO = 6
EPROTO = 7
EREFUSED = 8
ETIMEDOUT = 9
ESTATE = 10
ENOTSUP = 11
ELOST = 12

CODE_NAMES = {
    OK: "OK", DROPPED: "DROPPED", EINVAL: "EINVAL", ENOMEM: "ENOMEM", ECONNECT: "ECONNECT",
    ECLOSED: "ECLOSED", EIO: "EIO", EPROTO: "EPROTO", EREFUSED: "EREFUSED",
    ETIMEDOUT: "ETIMEDOUT", ESTATE: "ESTATE", ENOTSUP: "ENOTSUP", ELOST: "ELOST",
}

# attnstat_connect2's flags: a daemon not there yet is not an error (ATTNSTAT_CONNECT_BACKGROUND).
CONNECT_BACKGROUND = 1

# attnstat_link: where a client stands with the daemon (attnstat_link_state).
LINK_UP = 0
LINK_RECONNECTING = 1
LINK_CLOSED = 2
LINK_NAMES = {LINK_UP: "up", LINK_RECONNECTING: "reconnecting", LINK_CLOSED: "closed"}

# The protocol's Ack/Error codes (proto/attnstat.proto, enum Code): what the daemon answered.
PROTO_CODE_NAMES = {
    0: "OK", 1: "DROPPED", 2: "BAD_REQUEST", 3: "UNKNOWN_BUFFER", 4: "OUT_OF_BOUNDS",
    5: "UNSUPPORTED", 6: "INTERNAL", 7: "VERSION", 8: "PERMISSION", 9: "FRAME", 10: "NO_HELLO",
    11: "BUSY",
}

F32 = 0
F16 = 1
BF16 = 2
BOOL = 3
I32 = 4
DTYPE_SIZES = {F32: 4, F16: 2, BF16: 2, BOOL: 1, I32: 4}
DTYPE_NAMES = {F32: "float32", F16: "float16", BF16: "bfloat16", BOOL: "bool", I32: "int32"}

MEM_HOST = 0
MEM_CUDA = 1

STATUS_MAX_WORKERS = 16
STATUS_MAX_CLIENTS = 64


# ---- Structs ----------------------------------------------------------------------------------------
class Error(ctypes.Structure):
    """attnstat_error"""
    _fields_ = [("code", ctypes.c_int32), ("msg", ctypes.c_char * 256)]


class Tensor(ctypes.Structure):
    """attnstat_tensor"""
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("dtype", ctypes.c_int32),
        ("mem", ctypes.c_int32),
        ("device", ctypes.c_int32),
        ("reserved", ctypes.c_int32),
        ("shape", ctypes.c_int64 * 4),
        ("strides", ctypes.c_int64 * 4),
    ]


class PushOpts(ctypes.Structure):
    """attnstat_push_opts"""
    _fields_ = [
        ("step", ctypes.c_int64),
        ("layer", ctypes.c_uint32),
        ("causal", ctypes.c_int32),
        ("window_left", ctypes.c_int32),
        ("window_right", ctypes.c_int32),
        ("softcap", ctypes.c_float),
        ("scale", ctypes.c_float),
        ("sample_every", ctypes.c_uint32),
        ("sample_rows", ctypes.c_uint32),
        ("sample_seed", ctypes.c_uint64),
        ("cu_seqlens_q", ctypes.POINTER(ctypes.c_int32)),
        ("cu_seqlens_k", ctypes.POINTER(ctypes.c_int32)),
        ("n_seqs", ctypes.c_int32),
        ("want_results", ctypes.c_int32),
        ("cuda_stream", ctypes.c_void_p),
    ]


class PushExt(ctypes.Structure):
    """attnstat_push_ext"""
    _fields_ = [
        ("size", ctypes.c_uint32),
        ("compute_dtype", ctypes.c_int32),
        ("reserved", ctypes.c_int32),
        ("mask", ctypes.POINTER(Tensor)),
        ("cu_seqlens_q", ctypes.POINTER(Tensor)),
        ("cu_seqlens_k", ctypes.POINTER(Tensor)),
        ("sinks", ctypes.POINTER(Tensor)),
        ("stream_waits", ctypes.c_int32),
        ("reserved2", ctypes.c_int32),
        ("stats", ctypes.c_uint32),
        ("max_logit_out", ctypes.c_void_p),
    ]


# attnstat_push_ext up to its sinks field, up to stream_waits and up to stats: a libattnstat whose
# attnstat_push_ext_init sets a smaller size reads none of them, so none may be given to it.
PUSH_EXT_SIZE_SINKS = PushExt.sinks.offset + ctypes.sizeof(ctypes.POINTER(Tensor))
PUSH_EXT_SIZE_WAITS = PushExt.stream_waits.offset + ctypes.sizeof(ctypes.c_int32)
PUSH_EXT_SIZE_STATS = PushExt.stats.offset + ctypes.sizeof(ctypes.c_uint32)
PUSH_EXT_SIZE_MAXOUT = PushExt.max_logit_out.offset + ctypes.sizeof(ctypes.c_void_p)


class ConnectOpts(ctypes.Structure):
    """attnstat_connect_opts"""
    _fields_ = [
        ("socket_path", ctypes.c_char_p),
        ("ring_bytes", ctypes.c_uint64),
        ("queue_bytes", ctypes.c_uint64),
        ("timeout_ms", ctypes.c_int32),
    ]


# Thresholds the daemon keeps to itself (its own option only: not in attnstat_thresholds, the
# hello or Client's keywords); libattnstat marks the same rows (proto/wire_vocab.h, DAEMON_ONLY),
# and tests/test_vocab.c checks the mark against the protocol.
DAEMON_ONLY_THRESHOLDS = ("ema_warmup",)
_TH_CTYPE = {"VOCAB_D": ctypes.c_double, "VOCAB_U": ctypes.c_uint32}


def _threshold_fields():
    """attnstat_thresholds: vocab.h's thresholds in table order, the daemon-only ones left out,
    with collapse_threshold (the kernels' parameter, not an alert threshold) where the header
    places it, after logit_ceiling."""
    out = []
    for row in _vocab.THRESHOLDS:
        if row["name"] in DAEMON_ONLY_THRESHOLDS:
            continue
        out.append((row["name"], _TH_CTYPE[row["type"]]))
        if row["name"] == "logit_ceiling":
            out.append(("collapse_threshold", ctypes.c_double))
    return out


class Thresholds(ctypes.Structure):
    """attnstat_thresholds"""
    _fields_ = _threshold_fields()


class Layout(ctypes.Structure):
    """attnstat_layout"""
    _fields_ = [
        ("size", ctypes.c_uint32),
        ("tp_rank", ctypes.c_int32),
        ("tp_size", ctypes.c_int32),
        ("pp_rank", ctypes.c_int32),
        ("pp_size", ctypes.c_int32),
        ("dp_rank", ctypes.c_int32),
        ("dp_size", ctypes.c_int32),
        ("cp_rank", ctypes.c_int32),
        ("cp_size", ctypes.c_int32),
        ("layer_offset", ctypes.c_int32),
        ("head_offset", ctypes.c_int32),
    ]


class Intervention(ctypes.Structure):
    """attnstat_intervention"""
    _fields_ = [
        ("size", ctypes.c_uint32),
        ("kind", ctypes.c_char_p),
        ("step", ctypes.c_int64),
        ("layer", ctypes.c_int32),
        ("heads", ctypes.POINTER(ctypes.c_uint32)),
        ("nheads", ctypes.c_int32),
        ("values", ctypes.POINTER(ctypes.c_double)),
        ("threshold", ctypes.c_double),
        ("measured", ctypes.c_double),
        ("detail", ctypes.c_char_p),
    ]


class Counters(ctypes.Structure):
    """attnstat_counters (filled by attnstat_stats)"""
    _fields_ = [
        ("pushed", ctypes.c_uint64),
        ("sent", ctypes.c_uint64),
        ("acked", ctypes.c_uint64),
        ("dropped_local", ctypes.c_uint64),
        ("dropped_ring", ctypes.c_uint64),
        ("dropped_queue", ctypes.c_uint64),
        ("dropped_daemon", ctypes.c_uint64),
        ("rejected", ctypes.c_uint64),
        ("released", ctypes.c_uint64),
        ("in_flight", ctypes.c_uint64),
        ("errors", ctypes.c_uint64),
        ("alerts", ctypes.c_uint64),
        ("ring_bytes", ctypes.c_uint64),
        ("ring_used", ctypes.c_uint64),
        ("queue_bytes", ctypes.c_uint64),
        ("last_code", ctypes.c_int32),
        ("reserved", ctypes.c_int32),
        ("last_error", ctypes.c_char * 256),
        ("cuda_zero_copy", ctypes.c_uint64),
        ("cuda_staged", ctypes.c_uint64),
        ("dropped_staging", ctypes.c_uint64),
        ("dropped_events", ctypes.c_uint64),
        ("cuda_buffers", ctypes.c_uint64),
        ("releases_pending", ctypes.c_uint64),
        ("dropped_disconnected", ctypes.c_uint64),
        ("abandoned", ctypes.c_uint64),
        ("disconnects", ctypes.c_uint64),
        ("reconnects", ctypes.c_uint64),
    ]


class Alert(ctypes.Structure):
    """attnstat_alert"""
    _fields_ = [
        ("run", ctypes.c_char_p),
        ("message", ctypes.c_char_p),
        ("run_id", ctypes.c_int64),
        ("step", ctypes.c_int64),
        ("time_ms", ctypes.c_int64),
        ("rank", ctypes.c_int32),
        ("layer", ctypes.c_uint32),
        ("head", ctypes.c_uint32),
        ("rule", ctypes.c_int32),
        ("state", ctypes.c_int32),
        ("reserved", ctypes.c_int32),
        ("value", ctypes.c_double),
        ("threshold", ctypes.c_double),
    ]


class HeadResult(ctypes.Structure):
    """attnstat_head_result: head, sampled, then vocab.h's counts and statistics in table order."""
    _fields_ = ([("head", ctypes.c_uint32), ("sampled", ctypes.c_int32)]
                + [(row["name"], ctypes.c_uint64) for row in _vocab.COUNTS]
                + [(row["name"], ctypes.c_double) for row in _vocab.STATS])


class WorkerStatus(ctypes.Structure):
    """attnstat_worker_status"""
    _fields_ = [
        ("name", ctypes.c_char * 64),
        ("queue_depth", ctypes.c_uint32),
        ("queue_capacity", ctypes.c_uint32),
        ("processed", ctypes.c_uint64),
        ("dropped", ctypes.c_uint64),
        ("busy_frac", ctypes.c_double),
    ]


class ClientStatus(ctypes.Structure):
    """attnstat_client_status"""
    _fields_ = [
        ("id", ctypes.c_uint64),
        ("run", ctypes.c_char * 128),
        ("rank", ctypes.c_int32),
        ("pid", ctypes.c_int32),
        ("uid", ctypes.c_uint32),
        ("reserved", ctypes.c_uint32),
        ("pushes", ctypes.c_uint64),
        ("dropped", ctypes.c_uint64),
        ("rejected", ctypes.c_uint64),
    ]


STATUS_MAX_REJECTIONS = 16


class Rejection(ctypes.Structure):
    """attnstat_rejection"""
    _fields_ = [
        ("code", ctypes.c_int32),
        ("reserved", ctypes.c_uint32),
        ("count", ctypes.c_uint64),
        ("last_message", ctypes.c_char * 192),
    ]


class DaemonStatus(ctypes.Structure):
    """attnstat_daemon_status"""
    _fields_ = [
        ("daemon_version", ctypes.c_char * 32),
        ("db_path", ctypes.c_char * 256),
        ("uptime_s", ctypes.c_double),
        ("push_rate", ctypes.c_double),
        ("clients", ctypes.c_uint32),
        ("alerts_active", ctypes.c_uint32),
        ("pushes", ctypes.c_uint64),
        ("pushes_done", ctypes.c_uint64),
        ("dropped", ctypes.c_uint64),
        ("rejected", ctypes.c_uint64),
        ("samples_stored", ctypes.c_uint64),
        ("n_workers", ctypes.c_uint32),
        ("n_client_list", ctypes.c_uint32),
        ("workers", WorkerStatus * STATUS_MAX_WORKERS),
        ("client_list", ClientStatus * STATUS_MAX_CLIENTS),
        ("n_rejections", ctypes.c_uint32),
        ("reserved2", ctypes.c_uint32),
        ("rejections", Rejection * STATUS_MAX_REJECTIONS),
        ("failed", ctypes.c_uint64),
        ("store_errors", ctypes.c_uint64),
        ("last_store_error", ctypes.c_char * 256),
    ]


# The C names of the mirrors, for the ABI test.
C_NAMES = {
    "attnstat_error": Error,
    "attnstat_tensor": Tensor,
    "attnstat_push_opts": PushOpts,
    "attnstat_connect_opts": ConnectOpts,
    "attnstat_thresholds": Thresholds,
    "attnstat_counters": Counters,
    "attnstat_alert": Alert,
    "attnstat_head_result": HeadResult,
    "attnstat_worker_status": WorkerStatus,
    "attnstat_client_status": ClientStatus,
    "attnstat_daemon_status": DaemonStatus,
    "attnstat_rejection": Rejection,
    "attnstat_push_ext": PushExt,
    "attnstat_layout": Layout,
    "attnstat_intervention": Intervention,
}

# ---- Callback types ---------------------------------------------------------------------------------
ALERT_FN = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.POINTER(Alert))
RESULT_FN = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_uint64, ctypes.c_int64,
                             ctypes.c_uint32, ctypes.POINTER(HeadResult), ctypes.c_size_t)
ACK_FN = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_uint64, ctypes.c_int64, ctypes.c_uint32,
                          ctypes.c_int32, ctypes.c_char_p)
# GPU path: called when the daemon no longer reads the caller's memory of seq.
RELEASE_FN = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_uint64)


# ---- Locating the library ---------------------------------------------------------------------------
class LibraryNotFound(OSError):
    pass


def _sanitized(lib_path):
    cache = os.path.join(os.path.dirname(os.path.dirname(lib_path)), "CMakeCache.txt")
    try:
        with open(cache) as f:
            return any(line.startswith("ATTNSTAT_SANITIZE:") and line.strip().endswith("=ON")
                       for line in f)
    except OSError:
        return False


# The soname of the library this binding mirrors: its major version (include/attnstat.h).
SONAME = "libattnstat.so.%s" % __version__.split(".")[0]


def _source_root():
    """The source tree this package sits in (client/python/attnstat/ of a checkout), or None."""
    root = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
    if (os.path.isfile(os.path.join(root, "include", "attnstat.h")) and
            os.path.isfile(os.path.join(root, "client", "python", "attnstat", "_lib.py"))):
        return root
    return None


def candidates():
    """Where load() looks, in order: [(description, path or name, or None)].

    $ATTNSTAT_LIB; the copy a wheel carries (attnstat/libattnstat.so); when this package is the
    one of a source tree, that tree's build*/client/libattnstat.so (the newest first, sanitized
    builds last); the installed library by its soname (the dynamic loader's search: the Debian
    package libattnstat0, or a cmake --install followed by ldconfig)."""
    out = []
    env = os.environ.get("ATTNSTAT_LIB")
    if env:
        out.append(("$ATTNSTAT_LIB", env))
    packaged = os.path.join(os.path.dirname(os.path.abspath(__file__)), "libattnstat.so")
    if os.path.exists(packaged):
        out.append(("the package's own copy", packaged))
    root = _source_root()
    if root:
        pattern = os.path.join(root, "build*", "client", "libattnstat.so")
        # The newest first, sanitized builds last (their library needs the sanitizer runtimes
        # preloaded into the interpreter).
        built = sorted(glob.glob(pattern), key=lambda p: (_sanitized(p), -os.path.getmtime(p)))
        if built:
            for p in built:
                out.append(("build tree", p))
        else:
            out.append(("build tree", pattern))
    out.append(("installed library (soname)", SONAME))
    return out


def load(path=None):
    """Loads libattnstat: path, else the first of candidates() that loads. A path that was asked
    for ($ATTNSTAT_LIB or the argument) and fails is not silently replaced by another."""
    if path is not None:
        tried = [("argument", os.fspath(path))]
    else:
        tried = candidates()
    notes = []
    for what, p in tried:
        if not p:
            notes.append("%s: nothing found" % what)
            continue
        if os.sep in p and not os.path.exists(p):
            notes.append("%s: %s does not exist" % (what, p))
            if what in ("$ATTNSTAT_LIB", "argument"):
                break  # an explicit choice that fails is not silently replaced
            continue
        try:
            lib = ctypes.CDLL(p)
        except OSError as e:
            notes.append("%s: %s: %s" % (what, p, e))
            if what in ("$ATTNSTAT_LIB", "argument"):
                break
            continue
        _declare(lib)
        lib._attnstat_path = _loaded_path(p)
        _check_version(lib)
        return lib
    raise LibraryNotFound(
        "libattnstat not found; looked at:\n  " + "\n  ".join(notes) +
        "\nInstall the wheel (it carries the library), the Debian package libattnstat0, or build "
        "it (cmake -S . -B build && cmake --build build); or set ATTNSTAT_LIB to its path.")


def _loaded_path(p):
    """The file the dynamic loader loaded for p (a soname is resolved through /proc/self/maps)."""
    if os.sep in p:
        return p
    try:
        with open("/proc/self/maps") as f:
            for line in f:
                fields = line.split(None, 5)
                if len(fields) == 6 and os.path.basename(fields[5].strip()).startswith(p):
                    return fields[5].strip()
    except OSError:
        pass
    return p


def _check_version(lib):
    """Warns when the library's major.minor version is not this binding's: the struct mirrors
    above are those of this version's header (a patch release changes no struct)."""
    f = getattr(lib, "attnstat_version", None)
    have = (f() or b"").decode(errors="replace").split("+")[0] if f else "?"
    if have.split(".")[:2] != __version__.split(".")[:2]:
        warnings.warn("libattnstat %s (%s) is not the version of this attnstat package (%s): "
                      "install matching versions" % (have, lib._attnstat_path, __version__),
                      RuntimeWarning, stacklevel=3)


def _fn(lib, name, restype, argtypes, required=True):
    try:
        f = getattr(lib, name)
    except AttributeError:
        if required:
            raise LibraryNotFound("%s has no symbol %s: an older or foreign libattnstat"
                                  % (getattr(lib, "_name", "libattnstat"), name))
        return None
    f.restype = restype
    f.argtypes = argtypes
    return f


def _declare(lib):
    P = ctypes.POINTER
    c = ctypes.c_void_p  # attnstat_client *
    i32 = ctypes.c_int32
    code = ctypes.c_int
    _fn(lib, "attnstat_strerror", ctypes.c_char_p, [code])
    _fn(lib, "attnstat_dtype_size", ctypes.c_size_t, [code])
    _fn(lib, "attnstat_rule_name", ctypes.c_char_p, [i32])
    _fn(lib, "attnstat_state_name", ctypes.c_char_p, [i32])
    _fn(lib, "attnstat_push_opts_init", None, [P(PushOpts)])
    _fn(lib, "attnstat_connect_opts_init", None, [P(ConnectOpts)])
    _fn(lib, "attnstat_thresholds_init", None, [P(Thresholds)])
    _fn(lib, "attnstat_default_socket", ctypes.c_char_p, [ctypes.c_char_p, ctypes.c_size_t])
    _fn(lib, "attnstat_connect_ex", code, [P(ConnectOpts), P(c), P(Error)])
    _fn(lib, "attnstat_hello", code, [c, ctypes.c_char_p, i32, P(Thresholds), ctypes.c_char_p])
    _fn(lib, "attnstat_run_id", ctypes.c_int64, [c])
    _fn(lib, "attnstat_push", code, [c, P(PushOpts), P(Tensor), P(Tensor), P(Tensor)])
    _fn(lib, "attnstat_stats", None, [c, P(Counters)])
    _fn(lib, "attnstat_set_alert_callback", None, [c, ALERT_FN, ctypes.c_void_p])
    _fn(lib, "attnstat_set_result_callback", None, [c, RESULT_FN, ctypes.c_void_p])
    _fn(lib, "attnstat_set_ack_callback", None, [c, ACK_FN, ctypes.c_void_p])
    _fn(lib, "attnstat_subscribe", code, [c, ctypes.c_int, ctypes.c_int])
    _fn(lib, "attnstat_poll", code, [c, ctypes.c_int])
    _fn(lib, "attnstat_flush", code, [c, ctypes.c_int])
    _fn(lib, "attnstat_status", code, [c, P(DaemonStatus), ctypes.c_int])
    _fn(lib, "attnstat_last_error", ctypes.c_char_p, [c])
    _fn(lib, "attnstat_fd", ctypes.c_int, [c])
    _fn(lib, "attnstat_close", None, [c])
    # GPU path: the push's seq, and a notification when its memory may be reused.
    _fn(lib, "attnstat_push_ex", code,
        [c, P(PushOpts), P(Tensor), P(Tensor), P(Tensor), P(ctypes.c_uint64)], required=False)
    _fn(lib, "attnstat_set_release_callback", None, [c, RELEASE_FN, ctypes.c_void_p],
        required=False)
    _fn(lib, "attnstat_version", ctypes.c_char_p, [], required=False)
    _fn(lib, "attnstat_cuda_device_uuid", code,
        [i32, ctypes.c_char_p, ctypes.c_size_t, P(Error)], required=False)
    _fn(lib, "attnstat_hello_ex", code,
        [c, ctypes.c_char_p, i32, P(Thresholds), ctypes.c_char_p, P(ctypes.c_char_p), i32],
        required=False)
    # Masks, the precision of the logits, device offsets.
    _fn(lib, "attnstat_push_ext_init", None, [P(PushExt)], required=False)
    _fn(lib, "attnstat_proto_code_name", ctypes.c_char_p, [i32], required=False)
    _fn(lib, "attnstat_push2", code,
        [c, P(PushOpts), P(PushExt), P(Tensor), P(Tensor), P(Tensor), P(ctypes.c_uint64)],
        required=False)
    # The parallel layout of a process of a job.
    _fn(lib, "attnstat_layout_init", None, [P(Layout)], required=False)
    _fn(lib, "attnstat_set_layout", code, [c, P(Layout)], required=False)
    # What the job did to the model because of what was measured (qk_clip's scaled heads).
    _fn(lib, "attnstat_intervention_init", None, [P(Intervention)], required=False)
    _fn(lib, "attnstat_record_intervention", code, [c, P(Intervention)], required=False)
    # Daemon restarts: where the client stands, and why.
    _fn(lib, "attnstat_link_state", i32, [c, ctypes.c_char_p, ctypes.c_size_t], required=False)
    # Local mode: CUDA pushes computed in this process.
    _fn(lib, "attnstat_set_local_compute", code, [c, i32], required=False)
    _fn(lib, "attnstat_local_wait", code, [c, ctypes.c_void_p], required=False)
    # A client that starts before its daemon (connect="background").
    _fn(lib, "attnstat_connect2", code, [P(ConnectOpts), ctypes.c_uint32, P(c), P(Error)],
        required=False)


def optional(lib, name):
    """The function name of lib, or None when this libattnstat does not have it."""
    try:
        return getattr(lib, name)
    except AttributeError:
        return None


def trampoline(ref, name):
    """A C callback that calls ref().<name>(...) while the client lives, and nothing after."""
    def callback(*args):
        obj = ref()
        if obj is not None:
            getattr(obj, name)(*args)
    return callback
