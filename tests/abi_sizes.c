/* abi_sizes.c — prints the size of every struct of include/attnstat.h and the offset and size of
 * each of its fields, one per line ("struct field offset size"; field "-" is the whole struct).
 * test_python.py compiles it and checks the ctypes mirrors of the Python binding against it. */
#include <stddef.h>
#include <stdio.h>

#include "attnstat.h"

#define S(s) printf("%s - 0 %zu\n", #s, sizeof(s))
#define F(s, f) printf("%s %s %zu %zu\n", #s, #f, offsetof(s, f), sizeof(((s *)0)->f))

int main(void)
{
    S(attnstat_error);
    F(attnstat_error, code); F(attnstat_error, msg);

    S(attnstat_tensor);
    F(attnstat_tensor, data); F(attnstat_tensor, dtype); F(attnstat_tensor, mem);
    F(attnstat_tensor, device); F(attnstat_tensor, reserved); F(attnstat_tensor, shape);
    F(attnstat_tensor, strides);

    S(attnstat_push_opts);
    F(attnstat_push_opts, step); F(attnstat_push_opts, layer); F(attnstat_push_opts, causal);
    F(attnstat_push_opts, window_left); F(attnstat_push_opts, window_right);
    F(attnstat_push_opts, softcap); F(attnstat_push_opts, scale);
    F(attnstat_push_opts, sample_every); F(attnstat_push_opts, sample_rows);
    F(attnstat_push_opts, sample_seed); F(attnstat_push_opts, cu_seqlens_q);
    F(attnstat_push_opts, cu_seqlens_k); F(attnstat_push_opts, n_seqs);
    F(attnstat_push_opts, want_results); F(attnstat_push_opts, cuda_stream);

    S(attnstat_connect_opts);
    F(attnstat_connect_opts, socket_path); F(attnstat_connect_opts, ring_bytes);
    F(attnstat_connect_opts, queue_bytes); F(attnstat_connect_opts, timeout_ms);

    S(attnstat_thresholds);
    F(attnstat_thresholds, entropy_floor); F(attnstat_thresholds, entropy_drop);
    F(attnstat_thresholds, ema_alpha); F(attnstat_thresholds, logit_ceiling);
    F(attnstat_thresholds, collapse_threshold); F(attnstat_thresholds, raise_after);
    F(attnstat_thresholds, clear_after); F(attnstat_thresholds, sink_mass_ceiling);
    F(attnstat_thresholds, distance_floor);

    S(attnstat_layout);
    F(attnstat_layout, size); F(attnstat_layout, tp_rank); F(attnstat_layout, tp_size);
    F(attnstat_layout, pp_rank); F(attnstat_layout, pp_size); F(attnstat_layout, dp_rank);
    F(attnstat_layout, dp_size); F(attnstat_layout, cp_rank); F(attnstat_layout, cp_size);
    F(attnstat_layout, layer_offset); F(attnstat_layout, head_offset);

    S(attnstat_intervention);
    F(attnstat_intervention, size); F(attnstat_intervention, kind); F(attnstat_intervention, step);
    F(attnstat_intervention, layer); F(attnstat_intervention, heads);
    F(attnstat_intervention, nheads); F(attnstat_intervention, values);
    F(attnstat_intervention, threshold); F(attnstat_intervention, measured);
    F(attnstat_intervention, detail);

    S(attnstat_counters);
    F(attnstat_counters, pushed); F(attnstat_counters, sent); F(attnstat_counters, acked);
    F(attnstat_counters, dropped_local); F(attnstat_counters, dropped_ring);
    F(attnstat_counters, dropped_queue); F(attnstat_counters, dropped_daemon);
    F(attnstat_counters, rejected); F(attnstat_counters, released);
    F(attnstat_counters, in_flight); F(attnstat_counters, errors); F(attnstat_counters, alerts);
    F(attnstat_counters, ring_bytes); F(attnstat_counters, ring_used);
    F(attnstat_counters, queue_bytes); F(attnstat_counters, last_code);
    F(attnstat_counters, reserved); F(attnstat_counters, last_error);
    F(attnstat_counters, cuda_zero_copy); F(attnstat_counters, cuda_staged);
    F(attnstat_counters, dropped_staging); F(attnstat_counters, dropped_events);
    F(attnstat_counters, cuda_buffers); F(attnstat_counters, releases_pending);
    F(attnstat_counters, dropped_disconnected); F(attnstat_counters, abandoned);
    F(attnstat_counters, disconnects); F(attnstat_counters, reconnects);

    S(attnstat_alert);
    F(attnstat_alert, run); F(attnstat_alert, message); F(attnstat_alert, run_id);
    F(attnstat_alert, step); F(attnstat_alert, time_ms); F(attnstat_alert, rank);
    F(attnstat_alert, layer); F(attnstat_alert, head); F(attnstat_alert, rule);
    F(attnstat_alert, state); F(attnstat_alert, reserved); F(attnstat_alert, value);
    F(attnstat_alert, threshold);

    S(attnstat_head_result);
    F(attnstat_head_result, head); F(attnstat_head_result, sampled);
    F(attnstat_head_result, rows); F(attnstat_head_result, rows_norm);
    F(attnstat_head_result, rows_empty); F(attnstat_head_result, nonfinite_rows);
    F(attnstat_head_result, entropy_mean); F(attnstat_head_result, entropy_std);
    F(attnstat_head_result, entropy_min); F(attnstat_head_result, entropy_max);
    F(attnstat_head_result, entropy_norm_mean); F(attnstat_head_result, collapsed_frac);
    F(attnstat_head_result, max_logit); F(attnstat_head_result, sink_mass);
    F(attnstat_head_result, distance);

    S(attnstat_worker_status);
    F(attnstat_worker_status, name); F(attnstat_worker_status, queue_depth);
    F(attnstat_worker_status, queue_capacity); F(attnstat_worker_status, processed);
    F(attnstat_worker_status, dropped); F(attnstat_worker_status, busy_frac);

    S(attnstat_client_status);
    F(attnstat_client_status, id); F(attnstat_client_status, run);
    F(attnstat_client_status, rank); F(attnstat_client_status, pid);
    F(attnstat_client_status, uid); F(attnstat_client_status, reserved);
    F(attnstat_client_status, pushes); F(attnstat_client_status, dropped);
    F(attnstat_client_status, rejected);

    S(attnstat_daemon_status);
    F(attnstat_daemon_status, daemon_version); F(attnstat_daemon_status, db_path);
    F(attnstat_daemon_status, uptime_s); F(attnstat_daemon_status, push_rate);
    F(attnstat_daemon_status, clients); F(attnstat_daemon_status, alerts_active);
    F(attnstat_daemon_status, pushes); F(attnstat_daemon_status, pushes_done);
    F(attnstat_daemon_status, dropped); F(attnstat_daemon_status, rejected);
    F(attnstat_daemon_status, samples_stored); F(attnstat_daemon_status, n_workers);
    F(attnstat_daemon_status, n_client_list); F(attnstat_daemon_status, workers);
    F(attnstat_daemon_status, client_list); F(attnstat_daemon_status, n_rejections);
    F(attnstat_daemon_status, reserved2); F(attnstat_daemon_status, rejections);
    S(attnstat_rejection);
    F(attnstat_rejection, code); F(attnstat_rejection, reserved); F(attnstat_rejection, count);
    F(attnstat_rejection, last_message);
    S(attnstat_push_ext);
    F(attnstat_push_ext, size); F(attnstat_push_ext, compute_dtype);
    F(attnstat_push_ext, reserved); F(attnstat_push_ext, mask);
    F(attnstat_push_ext, cu_seqlens_q); F(attnstat_push_ext, cu_seqlens_k);
    F(attnstat_push_ext, sinks); F(attnstat_push_ext, stream_waits);
    F(attnstat_push_ext, reserved2); F(attnstat_push_ext, stats);
    F(attnstat_push_ext, max_logit_out);
    F(attnstat_daemon_status, failed);
    F(attnstat_daemon_status, store_errors); F(attnstat_daemon_status, last_store_error);
    return 0;
}
