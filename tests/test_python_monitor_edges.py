#!/usr/bin/env python3
"""test_python_monitor_edges.py — attnstat.torch.monitor where a job's loop differs from the plain
one: a client busy in another thread when a push is dropped, model= with auto_step=False,
copy_to_host with packed sequences, one-head SDPA with a per-batch mask, and the daemon's late
answers after the monitor left. The fakes of torch and the recording client are
test_python_monitor.py's; no PyTorch is needed.
"""
import threading
import unittest
import warnings

from pyhelpers import (DaemonCase, FakeDevice, FakeTensor, FakeTorch, need_daemon, np,  # noqa: E402
                       np_sdpa, randn)

import attnstat.torch  # noqa: E402
from test_python_monitor import (DOOR_MODULES, FakeModel, RecordingClient,  # noqa: E402
                                 install_flash_attn)


class TestEdges(unittest.TestCase):
    def setUp(self):
        self.fake = FakeTorch(np_sdpa, extra=DOOR_MODULES)
        self.F = self.fake.F

    def tearDown(self):
        attnstat.torch.uninstall()
        self.fake.restore()

    def test_a_drop_never_waits_for_a_busy_client(self):
        """A push dropped while another thread holds the client (status(), a slow callback):
        the monitor counts and says it without calling the client again (its stats() would wait
        for that thread); every drop counted, one warning."""
        busy = threading.Lock()

        class BusyClient(RecordingClient):
            def push(self, step, layer, q, k, **kw):
                return False  # dropped: the library's lock was busy

            def stats(self):  # what Client.stats() does: wait for the client's lock
                if not busy.acquire(timeout=0.2):
                    raise AssertionError("the monitor waited for a client busy elsewhere")
                busy.release()
                return {"last_error": ""}
        c = BusyClient()
        q = FakeTensor(randn(1, 2, 5, 8))
        busy.acquire()  # another thread holds the client for the whole test
        try:
            with warnings.catch_warnings(record=True) as ws:
                warnings.simplefilter("always")
                with attnstat.torch.monitor(c) as mon:
                    for _ in range(4):
                        self.F.scaled_dot_product_attention(q, q, q)
        finally:
            busy.release()
        self.assertEqual((mon.dropped, mon.errors), (4, 0))
        self.assertEqual(sum(1 for w in ws if "dropped" in str(w.message)), 1)

    def test_blind_passes_with_model_and_auto_step_off(self):
        """model= with auto_step=False and mon.step() after each forward: a forward that saw no
        attention call is counted blind (it was never judged: step() forgot it)."""
        class Blind(FakeModel):
            def forward(self, x):
                return x
        model = Blind(self.F)
        with warnings.catch_warnings(record=True) as ws:
            warnings.simplefilter("always")
            with attnstat.torch.monitor(RecordingClient(), model=model, auto_step=False) as mon:
                for _ in range(5):
                    model(FakeTensor(randn(2, 3)))
                    mon.step()
        self.assertEqual(mon.blind, 5)
        self.assertTrue(any("saw no attention call" in str(w.message) for w in ws))
        seen = FakeModel(self.F, n_layers=2)
        with attnstat.torch.monitor(RecordingClient(), model=seen, auto_step=False) as mon:
            for _ in range(3):
                seen(FakeTensor(randn(2, 3)))
                mon.step()
        self.assertEqual((mon.blind, mon.pushed), (0, 6))

    def test_copy_to_host_moves_packed_offsets(self):
        """copy_to_host with packed sequences (flash_attn_varlen_func): the offsets go to the
        host with q and k, so the call is pushed, not refused as CUDA offsets of host tensors."""
        moved = []

        def cpu(t):
            moved.append(t.shape)
            return FakeTensor(t._a, t.dtype.name)
        fl = install_flash_attn()
        cuda = FakeDevice("cuda", 0)
        packed = FakeTensor(randn(10, 4, 8), device=cuda)
        cu = FakeTensor(np.array([0, 4, 10], np.int32), "int32", cuda)
        c = RecordingClient()
        FakeTensor.detach, FakeTensor.cpu = (lambda t: t), cpu  # for this test alone
        try:
            with attnstat.torch.monitor(c, copy_to_host=True) as mon:
                fl.flash_attn_varlen_func(packed, packed, packed, cu, cu, 6, 6, causal=True)
        finally:
            del FakeTensor.detach, FakeTensor.cpu
        self.assertEqual((mon.pushed, mon.errors), (1, 0))
        kw = c.calls[0][4]
        for name in ("cu_seqlens_q", "cu_seqlens_k"):
            self.assertEqual(kw[name].device.type, "cpu")
        self.assertIn((3,), moved)

    def test_one_head_sdpa_with_a_mask_per_batch(self):
        """SDPA on [B, N, D] (one head) with a [B, Nq, Nk] mask: the mask's batch stays the
        batch ([B, 1, Nq, Nk]), not the heads."""
        q = FakeTensor(randn(3, 5, 8))
        m = FakeTensor(np.tril(np.ones((3, 5, 5), bool)), "bool")
        m._a[1, :, 3:] = False
        m._a[1, :, 0] = True
        c = RecordingClient()
        with attnstat.torch.monitor(c) as mon:
            self.F.scaled_dot_product_attention(q, q, q, attn_mask=m)
            self.F.scaled_dot_product_attention(q, q, q, attn_mask=m[0])
        self.assertEqual(mon.pushed, 2)
        self.assertEqual(c.calls[0][4]["attn_mask"].shape, (3, 1, 5, 5))
        self.assertTrue(np.array_equal(c.calls[0][4]["attn_mask"].numpy()[:, 0], m.numpy()))
        self.assertEqual(c.calls[1][4]["attn_mask"].shape, (1, 1, 5, 5))

    def test_late_rejections_count_in_the_last_monitor(self):
        """The daemon's answers to a monitor's last pushes arrive with client.flush(), after the
        with block: counted there. Once another monitor started, the old one counts no more."""
        class AckClient(RecordingClient):
            cbs = None

            def on_rejected(self, cb):
                self.cbs = (self.cbs or []) + [cb]
                return cb

            def reject(self, step, layer):
                for cb in self.cbs:
                    cb(1, step, layer, 9, "the queue is full")
        c = AckClient()
        q = FakeTensor(randn(1, 2, 5, 8))
        with warnings.catch_warnings(record=True):
            warnings.simplefilter("always")
            with attnstat.torch.monitor(c) as first:
                self.F.scaled_dot_product_attention(q, q, q)
            c.reject(0, 0)  # after the with block, before another monitor
            self.assertEqual(first.rejected, 1)
            with attnstat.torch.monitor(c) as second:
                self.F.scaled_dot_product_attention(q, q, q)
                c.reject(0, 0)
        self.assertEqual((first.rejected, second.rejected), (1, 1))

    def test_checkpointed_layers_are_pushed_once(self):
        """Activation checkpointing runs a layer's forward again inside backward: those calls
        (autograd's graph task id is not -1 there) are counted as recomputed, not pushed again
        as the same or as new layers."""
        task = [-1]
        self.fake.torch._C = type("C", (), {"_current_graph_task_id": staticmethod(
            lambda: task[0])})
        model = FakeModel(self.F, n_layers=3)
        c = RecordingClient()
        with attnstat.torch.monitor(c, model=model) as mon:
            for _ in range(2):
                model(FakeTensor(randn(2, 3)))      # the forward
                task[0] = 7
                model.forward(FakeTensor(randn(2, 3)))  # backward's recompute
                task[0] = -1
        self.assertEqual([(s, l) for s, l, *_ in c.calls],
                         [(0, 0), (0, 1), (0, 2), (1, 0), (1, 1), (1, 2)])
        self.assertEqual((mon.pushed, mon.recomputed, mon.stats()["recomputed"]), (6, 6, 6))

    def test_checkpointed_layers_compiled_are_pushed_once(self):
        """The same where a compiled graph observes the calls (its attnstat::observe operator at
        run time): one run inside autograd's backward is a recompute, counted and not pushed."""
        task = [-1]
        self.fake.torch._C = type("C", (), {"_current_graph_task_id": staticmethod(
            lambda: task[0])})
        c = RecordingClient()
        q = FakeTensor(randn(1, 2, 5, 8))
        with attnstat.torch.monitor(c) as mon:
            for t in (-1, 3, -1):
                task[0] = t
                mon._observe_compiled(q, q, None, None, None, None, "sdpa", -1, 0, True, 0.0,
                                      -1, -1, 0.0, "bhnd", "")
        task[0] = -1
        self.assertEqual([(s, l) for s, l, *_ in c.calls], [(0, 0), (0, 1)])
        self.assertEqual((mon.pushed, mon.recomputed, mon.compiled_calls), (2, 1, 2))

    def test_monitors_one_after_another_are_let_go(self):
        """A job that enters a monitor per epoch on one client: each new monitor takes the last
        one's callback off the client (the client held every old monitor and its model), and a
        qk_clip closed takes its own off too."""
        class Client(RecordingClient):
            def __init__(self):
                RecordingClient.__init__(self)
                self.cbs = []

            def on_rejected(self, cb):
                self.cbs.append(cb)
                return cb

            def on_result(self, cb):
                self.cbs.append(cb)
                return cb

            def off(self, cb):
                n = len(self.cbs)
                self.cbs = [c for c in self.cbs if c != cb]
                return len(self.cbs) < n
        c = Client()
        q = FakeTensor(randn(1, 2, 5, 8))
        mons = []
        for _ in range(5):
            with attnstat.torch.monitor(c) as mon:
                self.F.scaled_dot_product_attention(q, q, q)
                self.assertEqual(len(c.cbs), 1)  # its own alone
            mons.append(mon)
        self.assertEqual(c.cbs, [mons[-1]._on_rejected])  # the last keeps its late answers
        from attnstat.torch._qkclip import qk_clip  # noqa: E402
        clip = qk_clip.__new__(qk_clip)
        clip.client, clip._closed, clip.device = c, False, False
        c.on_result(clip.observe)
        clip.close()
        self.assertEqual(c.cbs, [mons[-1]._on_rejected])


@need_daemon
class TestClientOff(DaemonCase):
    """What the monitors above rely on, in the real client: Client.off."""

    def test_a_callback_taken_off_is_not_called(self):
        """Client.off: a callback taken off gets no further result (the one left does)."""
        with self.d.client(self.run_name()) as c:
            kept, gone = [], []

            def keep(seq, step, layer, heads):
                kept.append(step)

            def leave(seq, step, layer, heads):
                gone.append(step)
            c.on_result(keep)
            c.on_result(leave)
            c.push(0, 0, randn(1, 1, 4, 8), randn(1, 1, 4, 8), want_results=True)
            self.assertTrue(c.flush(30))
            self.assertTrue(c.off(leave))
            self.assertFalse(c.off(leave))
            c.push(1, 0, randn(1, 1, 4, 8), randn(1, 1, 4, 8), want_results=True)
            self.assertTrue(c.flush(30))
        self.assertEqual((kept, gone), ([0, 1], [0]))


if __name__ == "__main__":
    unittest.main(verbosity=2)
