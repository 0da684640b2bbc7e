#!/usr/bin/env python3
"""test_python_layout.py — a process's parallel layout from Python: attnstat._layout's checks,
attnstat.torch's detection (torch.distributed's ranks as replicas, Megatron-core's groups, a
DeviceMesh by its dimension names, a pipeline stage's layer offset that must be given) against
stand-ins of those libraries, the hello's devices (CUDA ordinals, "cuda:N", torch.devices and
UUIDs, on a stand-in of the library's call), and end to end: two tensor-parallel ranks of one job
(Client(layout=...) and monitor(layout=...)) storing global head numbers and their ranks in a
real attnstatd. No PyTorch needed (tests/pyhelpers.py's stand-ins).
"""
import os
import sys
import types
import time
import unittest
import warnings

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from pyhelpers import DaemonCase, FakeTensor, FakeTorch, need_daemon, np_sdpa, randn  # noqa: E402

import attnstat  # noqa: E402
import attnstat.torch  # noqa: E402
from attnstat import _args, _layout, _lib  # noqa: E402
from attnstat.torch import _layout as tl  # noqa: E402
from test_python_monitor import (DOOR_MODULES, FakeReplicate, FakeShard,  # noqa: E402
                                 FakeTPMesh, FakeTPModel, RecordingClient)


class TestLayoutDict(unittest.TestCase):
    def test_defaults_and_sources(self):
        d = _layout.as_dict()
        self.assertEqual(d, dict(_layout.DEFAULTS))
        self.assertEqual(_layout.as_dict({"tp_rank": 1, "tp_size": 2})["tp_rank"], 1)
        obj = types.SimpleNamespace(dp_rank=3, dp_size=4, unrelated=7)
        self.assertEqual(_layout.as_dict(obj)["dp_rank"], 3)
        self.assertEqual(_layout.as_dict({"tp_rank": 1, "tp_size": 2}, tp_rank=0)["tp_rank"], 0)

    def test_refusals(self):
        for bad, says in (({"tp_rank": 2, "tp_size": 2}, "tp_rank 2 of tp_size 2"),
                          ({"pp_size": 0}, "pp_size 0"), ({"cp_rank": -1}, "cp_rank -1"),
                          ({"layer_offset": -1}, "layer_offset"), ({"dp": 1}, "unknown"),
                          ({"tp_rank": "x"}, "an integer")):
            with self.assertRaises(attnstat.AttnstatError) as cm:
                _layout.as_dict(bad)
            self.assertIn(says, str(cm.exception))


class TestDevices(unittest.TestCase):
    def test_device_uuids(self):
        """The hello's devices: a UUID string as it is, an ordinal, "cuda:N" or a torch.device
        asked of the library (a stand-in here: the real call needs a GPU), its error passed on."""
        asked = []

        class Lib(object):
            @staticmethod
            def attnstat_cuda_device_uuid(ordinal, buf, n, err):
                asked.append(ordinal)
                if ordinal == 7:
                    err._obj.msg = b"no device 7"
                    return _lib.EINVAL
                buf.value = b"GPU-%d" % ordinal
                return _lib.OK

        dev = types.SimpleNamespace(type="cuda", index=3)
        got = _args.device_uuids(Lib(), ["GPU-abc", 2, "cuda:5", dev, b"GPU-def"])
        self.assertEqual(got, [b"GPU-abc", b"GPU-2", b"GPU-5", b"GPU-3", b"GPU-def"])
        self.assertEqual(asked, [2, 5, 3])
        with self.assertRaises(attnstat.AttnstatError) as e:
            _args.device_uuids(Lib(), [7])
        self.assertIn("no device 7", str(e.exception))
        with self.assertRaises(attnstat.AttnstatError):
            _args.device_uuids(Lib(), [types.SimpleNamespace(type="cpu", index=None)])
        self.assertEqual(_args.device_uuids(object(), ["GPU-x"]), [b"GPU-x"])


class FakeDist(object):
    def __init__(self, rank, world, up=True):
        self.r, self.w, self.up = rank, world, up

    def is_available(self):
        return True

    def is_initialized(self):
        return self.up

    def get_rank(self):
        return self.r

    def get_world_size(self):
        return self.w


class FakeMesh(object):
    def __init__(self, names, shape, local):
        self.mesh_dim_names, self.shape, self._local = names, shape, local

    def get_local_rank(self, name):
        return self._local[name]


class TestDetection(unittest.TestCase):
    def setUp(self):
        self.saved = sys.modules.get(tl._MEGATRON)
        sys.modules.pop(tl._MEGATRON, None)

    def tearDown(self):
        sys.modules.pop(tl._MEGATRON, None)
        if self.saved is not None:
            sys.modules[tl._MEGATRON] = self.saved

    def test_nothing_running(self):
        torch = types.SimpleNamespace()
        self.assertIsNone(tl.resolve("auto", torch))
        self.assertIsNone(tl.resolve(None, torch))
        torch.distributed = FakeDist(0, 1, up=False)
        self.assertIsNone(tl.resolve("auto", torch))

    def test_torch_distributed_replicas(self):
        torch = types.SimpleNamespace(distributed=FakeDist(5, 16))
        d = tl.resolve("auto", torch)
        self.assertEqual((d["dp_rank"], d["dp_size"], d["tp_size"]), (5, 16, 1))

    def test_megatron_groups(self):
        ps = types.ModuleType(tl._MEGATRON)
        ps.model_parallel_is_initialized = lambda: True
        vals = {"tensor": (3, 8), "pipeline": (0, 1), "data": (2, 4), "context": (1, 2)}
        for g, (r, n) in vals.items():
            tp = "tensor_model" if g == "tensor" else "pipeline_model" if g == "pipeline" else g
            setattr(ps, "get_%s_parallel_rank" % tp, lambda r=r: r)
            setattr(ps, "get_%s_parallel_world_size" % tp, lambda n=n: n)
        sys.modules[tl._MEGATRON] = ps
        d = tl.resolve("auto", types.SimpleNamespace(distributed=FakeDist(99, 128)))
        self.assertEqual((d["tp_rank"], d["tp_size"], d["dp_rank"], d["dp_size"], d["cp_rank"],
                          d["cp_size"]), (3, 8, 2, 4, 1, 2))
        ps.model_parallel_is_initialized = lambda: False  # not set up yet: torch.distributed's
        self.assertEqual(tl.resolve("auto", types.SimpleNamespace(
            distributed=FakeDist(99, 128)))["dp_rank"], 99)

    def test_mesh(self):
        m = FakeMesh(("dp_replicate", "dp_shard", "tp"), (2, 4, 8),
                     {"dp_replicate": 1, "dp_shard": 3, "tp": 5})
        d = tl.resolve(m, None)
        self.assertEqual((d["dp_rank"], d["dp_size"], d["tp_rank"], d["tp_size"]), (7, 8, 5, 8))
        m = FakeMesh(("pp", "dp", "cp", "tp", "ep"), (2, 2, 2, 2, 4),
                     {"pp": 1, "dp": 0, "cp": 1, "tp": 1, "ep": 3})
        with self.assertRaises(ValueError) as cm:  # a pipeline stage: its layer offset is needed
            tl.resolve(m, None)
        self.assertIn("layer_offset", str(cm.exception))
        d = tl.resolve(m, None, layer_offset=16)
        self.assertEqual((d["pp_rank"], d["pp_size"], d["cp_rank"], d["layer_offset"]),
                         (1, 2, 1, 16))
        with self.assertRaises(ValueError):
            tl.resolve(FakeMesh((), (4,), {}), None)

    def test_apply(self):
        said = []

        class C(object):
            layout = None

            def set_layout(self, d):
                said.append(d)
                self.layout = d
        c = C()
        torch = types.SimpleNamespace(distributed=FakeDist(1, 2))
        self.assertEqual(tl.apply(c, "auto", None, torch, None)["dp_rank"], 1)
        self.assertEqual(len(said), 1)
        tl.apply(c, "auto", None, torch, None)  # the client has one: "auto" keeps it
        self.assertEqual(len(said), 1)
        tl.apply(c, {"tp_rank": 1, "tp_size": 2}, None, torch, None)  # given: said
        self.assertEqual(len(said), 2)

        class Old(object):
            def set_layout(self, d):
                raise attnstat.AttnstatError(11, "this attnstatd takes no parallel layout")
        warned = []
        self.assertIsNone(tl.apply(Old(), {"tp_size": 2}, None, torch,
                                   lambda k, m: warned.append(m)))
        self.assertIn("local numbers", warned[0])


class FSDPModel(FakeTPModel):
    """A model under fully_shard: its class is FSDP<name>, as fully_shard makes it; fsdp_ndim:
    the dimensions of the mesh its state says it shards over (None: a state without it)."""
    fsdp_ndim = None

    def _get_fsdp_state(self):
        if self.fsdp_ndim is None:
            raise AttributeError("_fsdp_param_group")
        mesh = types.SimpleNamespace(ndim=self.fsdp_ndim)
        return types.SimpleNamespace(_fsdp_param_group=types.SimpleNamespace(
            mesh_info=types.SimpleNamespace(mesh=mesh)))


class FullyShardedDataParallel(FakeTPModel):
    """The FSDP wrapper with use_orig_params: between forwards a query projection's weight is
    a view of this process's flat shard (no rows here)."""


class TestFSDP(unittest.TestCase):
    """FSDP's shards are not tensor parallelism: fully_shard's Shard(0) of a query projection (on
    a mesh dimension named for data parallelism, or unnamed) is gathered for each forward, so
    every process computes every head; the wrapper's flat shards say nothing of the heads. Each
    process is a data-parallel replica, and the monitor pushes every head. With tensor
    parallelism beside fully_shard (a 2-D mesh), the innermost dimension is TP's. Before, FSDP's
    Shard(0) was read as tensor parallelism over the data-parallel ranks (every call then skipped
    for its heads), and the wrapper's empty views refused to start."""

    def setUp(self):
        self.fake = FakeTorch(np_sdpa, extra=DOOR_MODULES)

    def tearDown(self):
        attnstat.torch.uninstall()
        self.fake.restore()

    def run_monitor(self, model, rank, world):
        self.fake.torch.distributed = FakeDist(rank, world)
        c = RecordingClient()
        c.layout = None
        got = {}
        c.set_layout = got.update
        with attnstat.torch.monitor(c, model=model) as mon:
            model(None)
        return got, mon

    def test_fully_shard_alone(self):
        for names in ((), ("dp_shard",), ("fsdp",), ("data_parallel",), ("world",)):
            model = FSDPModel(self.fake.F, 16, 16, (FakeShard(0),), FakeTPMesh(names, (4,), (2,)))
            got, mon = self.run_monitor(model, 2, 4)
            self.assertEqual((got.get("tp_size", 1), got["dp_rank"], got["dp_size"]), (1, 2, 4),
                             names)
            self.assertEqual((mon.pushed, mon.skipped), (2, 0), names)

    def test_fully_shard_with_tensor_parallelism(self):
        model = FSDPModel(self.fake.F, 16, 4, (FakeShard(0), FakeShard(0)),
                          FakeTPMesh((), (2, 4), (1, 3)))
        got, mon = self.run_monitor(model, 7, 8)
        self.assertEqual((got["tp_rank"], got["tp_size"]), (3, 4))
        self.assertEqual(mon.pushed, 2)

    def test_names_and_fsdp_state(self):
        """Lightning's names (data_parallel x tensor_parallel): TP is the tensor-parallel
        dimension; HSDP over dimensions named for nothing: fully_shard's state says its mesh has
        both, so neither is TP; torchtitan's HSDP mesh with context parallelism folded into the
        shard dimension ('dp_shard_cp'): every process its own data-parallel rank."""
        model = FSDPModel(self.fake.F, 16, 4, (FakeShard(0), FakeShard(0)),
                          FakeTPMesh(("data_parallel", "tensor_parallel"), (2, 4), (1, 3)))
        got, mon = self.run_monitor(model, 7, 8)
        self.assertEqual((got["tp_rank"], got["tp_size"]), (3, 4))
        model = FSDPModel(self.fake.F, 16, 16, (FakeReplicate(), FakeShard(0)),
                          FakeTPMesh(("inter_node", "intra_node"), (2, 4), (1, 2)))
        model.fsdp_ndim = 2
        got, mon = self.run_monitor(model, 6, 8)
        self.assertEqual((got.get("tp_size", 1), got["dp_rank"], got["dp_size"]), (1, 6, 8))
        self.assertEqual(mon.pushed, 2)
        # the same HSDP where fully_shard's state cannot be read (a private attribute that may
        # move), its dimensions named for nothing or not at all: (Replicate, Shard) is HSDP's
        for names in (("inter_node", "intra_node"), ()):
            model = FSDPModel(self.fake.F, 16, 16, (FakeReplicate(), FakeShard(0)),
                              FakeTPMesh(names, (2, 4), (1, 2)))
            got, mon = self.run_monitor(model, 6, 8)
            self.assertEqual((got.get("tp_size", 1), got["dp_rank"], got["dp_size"]), (1, 6, 8),
                             names)
            self.assertEqual((mon.pushed, mon.skipped), (2, 0), names)
        # HSDP beside TP, no state, no names: the shard dimension is FSDP's, the one after TP's
        model = FSDPModel(self.fake.F, 16, 8, (FakeReplicate(), FakeShard(0), FakeShard(0)),
                          FakeTPMesh((), (2, 2, 2), (1, 0, 1)))
        got, mon = self.run_monitor(model, 5, 8)
        self.assertEqual((got["tp_rank"], got["tp_size"]), (1, 2))
        self.assertEqual(mon.pushed, 2)
        seen = set()
        for r in range(2):
            for s in range(2):
                for t in range(2):
                    d = tl.from_mesh(FakeTPMesh(("dp_replicate", "dp_shard_cp", "tp"), (2, 2, 2),
                                                (r, s, t)))
                    self.assertEqual((d["dp_size"], d["tp_rank"]), (4, t))
                    seen.add((d["dp_rank"], d["tp_rank"]))
        self.assertEqual(len(seen), 8)

    def test_fsdp_wrapper_with_a_shard_of_the_heads(self):
        """The FSDP wrapper beside tensor parallelism by hand (plain 2-D weights holding 4 of
        16 heads) and no layout: refused, as without FSDP."""
        model = FullyShardedDataParallel(self.fake.F, 16, 4)
        with self.assertRaises(ValueError) as cm:
            self.run_monitor(model, 1, 4)
        self.assertIn("holds 4", str(cm.exception))

    def test_fsdp_wrapper_flat_shards(self):
        model = FullyShardedDataParallel(self.fake.F, 16, 16)
        model.q.weight = types.SimpleNamespace(shape=(0,))
        got, mon = self.run_monitor(model, 1, 4)
        self.assertEqual((got.get("tp_size", 1), got["dp_rank"], got["dp_size"]), (1, 1, 4))
        self.assertEqual(mon.pushed, 2)

    def test_without_fsdp_an_unnamed_shard_is_tensor_parallelism(self):
        model = FakeTPModel(self.fake.F, 16, 4, (FakeShard(0),), FakeTPMesh((), (4,), (2,)))
        got, mon = self.run_monitor(model, 2, 4)
        self.assertEqual((got["tp_rank"], got["tp_size"]), (2, 4))
        self.assertEqual(mon.pushed, 2)


@need_daemon
class TestEndToEnd(DaemonCase):
    H, N, D = 3, 24, 16

    def test_clients_as_tensor_parallel_ranks(self):
        run = self.run_name()
        for rank in range(2):
            with self.d.client(run, rank=rank, layout={"tp_rank": rank, "tp_size": 2,
                                                       "layer_offset": 10}) as c:
                self.assertEqual(c.layout["tp_rank"], rank)
                q = randn(1, self.H, self.N, self.D)
                self.assertTrue(c.push(0, 1, q, randn(1, self.H, self.N, self.D), causal=True))
                self.assertTrue(c.flush())
        got = self.d.query("SELECT layer, head FROM samples JOIN runs ON runs.id = run_id WHERE "
                           "runs.name = ? ORDER BY head", run)
        self.assertEqual(got, [(11, h) for h in range(2 * self.H)])
        ranks = self.d.query("SELECT rank, tp_rank, tp_size, layer_offset FROM runs WHERE name = ? "
                             "ORDER BY rank", run)
        self.assertEqual(ranks, [(0, 0, 2, 10), (1, 1, 2, 10)])

    def test_monitor_auto_from_torch_distributed(self):
        run = self.run_name()
        fake = FakeTorch(np_sdpa)
        fake.torch.distributed = FakeDist(1, 4)
        try:
            with self.d.client(run, rank=1) as c:
                with attnstat.torch.monitor(c, layout={"tp_rank": 1, "tp_size": 2}) as mon:
                    q = FakeTensor(randn(1, self.H, self.N, self.D))
                    k = FakeTensor(randn(1, self.H, self.N, self.D))
                    fake.F.scaled_dot_product_attention(q, k, k, is_causal=True)
                self.assertEqual(mon.pushed, 1)
                self.assertEqual(c.layout["tp_rank"], 1)
                self.assertTrue(c.flush())
            with self.d.client(run + "-auto", rank=1) as c:
                with warnings.catch_warnings():
                    warnings.simplefilter("error")  # detection is quiet
                    with attnstat.torch.monitor(c):
                        pass
                self.assertEqual((c.layout["dp_rank"], c.layout["dp_size"]), (1, 4))
        finally:
            fake.restore()
        got = self.d.query("SELECT min(head), max(head) FROM samples JOIN runs ON runs.id = run_id "
                           "WHERE runs.name = ?", run)
        self.assertEqual(got, [(self.H, 2 * self.H - 1)])
        # No push waited for a commit on that run: the layout's row is written within a commit
        # interval, so wait for it (a generous deadline, not a margin).
        deadline = time.monotonic() + 30
        while True:
            got = self.d.query("SELECT dp_rank, dp_size FROM runs WHERE name = ?", run + "-auto")
            if got == [(1, 4)] or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        self.assertEqual(got, [(1, 4)])


if __name__ == "__main__":
    unittest.main(verbosity=2)
