"""attnstat: hand a training job's attention tensors to attnstatd, which keeps per-(layer, head)
attention entropy and max-logit statistics, stores their history and raises alerts.

    import attnstat
    with attnstat.Client(run="gpt-small", rank=0) as client:
        client.push(step, layer, q, k, causal=True)   # q, k: [B, H, N, D]; never waits
        client.flush()

CUDA tensors (PyTorch, CuPy) are handed to the daemon without a copy (CUDA IPC) and without
synchronising the device. An unmodified PyTorch model (every call to
torch.nn.functional.scaled_dot_product_attention):

    import attnstat.torch
    with attnstat.torch.monitor(client, every=10, model=model):
        train()

A thin ctypes binding over libattnstat.so: no compile step, and nothing beyond the standard library
is imported (tensors are read through __array_interface__ / __cuda_array_interface__ or PyTorch's
data_ptr() / stride(), duck-typed). The library is found through $ATTNSTAT_LIB, else the copy a
wheel carries, else this source tree's build*/client/libattnstat.so, else the installed library by
its soname (attnstat.load_library() says where it looked).

The history the daemon stores, read with Python's sqlite3 alone (no library, no daemon):

    h = attnstat.history("/var/lib/attnstat/history.db")
    rows = h.samples("gpt-small", layer=3, step_from=1000)   # dicts; h.dataframe(...) with pandas

QK-Clip's per-head rule (MuonClip), from the heads' measured max logits to the factors of their
query and key projection rows (grouped-query attention included; attnstat/_qkclip.py says why):

    q, k = attnstat.qk_clip_factors(max_logits, tau=100.0, group=num_heads // num_kv_heads)
"""
from ._client import Alert, AttnstatError, Client, default_socket
from ._history import History, HistoryError, history
from ._lib import BF16, F16, F32, LibraryNotFound, MEM_CUDA, MEM_HOST, load as load_library
from ._qkclip import qk_clip_factors
from ._version import __version__

__all__ = ["Client", "AttnstatError", "Alert", "LibraryNotFound", "default_socket",
           "load_library", "F32", "F16", "BF16", "MEM_HOST", "MEM_CUDA", "history", "History",
           "HistoryError", "qk_clip_factors"]
