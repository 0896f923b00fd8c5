"""DualPI2's coupling law checked against packets and sampled xstats (pure; used by test_dualpi2.py).

sch_dualpi2.c marks an L packet when one roll against prob·k succeeds (dualpi2_scalable_marking) and a classic
packet when two rolls against prob succeed (dualpi2_classic_marking), at dequeue. With p'(t) = prob / (2^32-1)
the expected marks are Σ min(k·p'(t), 1) over the L packets and Σ p'(t)² over the classic ones, t being each
packet's dequeue (≈ its egress capture time).

p' is known only where the guest sampled it (`dualpi2_nl watch`, every ~0.1 s). Under TCG the guest's one
vCPU stalls when the host is loaded: the watcher then samples late, queues build behind the stall and p'
jumps. So the law is checked only inside *steady intervals*: between two consecutive samples that came on
time (gap ≤ `max_gap_s`; a sample itself costs the guest ~50 ms) with the classic queue's delay below
3 × target at both ends. Inside such an
interval p' is taken as the linear interpolation of the two samples, and the L queue's coupled marks are
counted from the sampled counters: Δecn_mark − Δstep_marks − the classic CE packets seen leaving in the
interval (ecn_mark counts every mark, step_marks the L queue's step marks, which may hit a packet the
coupling marked already).

must_drop() marks nothing while the qdisc's backlog (after taking the packet out) is below 2 MTU: the
expectation counts only packets dequeued with at least 2 × 1514 bytes still queued, the backlog being
reconstructed from the paired captures (bytes arrived at the ingress and not yet left at the egress).
"""
from __future__ import annotations

import numpy as np


def steady_intervals(samples: list[dict], max_gap_s: float, target_us: int) -> np.ndarray:
    """Indices i of the sample pairs (i, i+1) that bound a steady interval."""
    t = np.array([s["t"] for s in samples])
    delay_c = np.array([s["xstats"]["delay_c_us"] for s in samples])
    ok_gap = np.diff(t) <= max_gap_s
    ok_delay = (delay_c[:-1] < 3 * target_us) & (delay_c[1:] < 3 * target_us)
    return np.flatnonzero(ok_gap & ok_delay)


MIN_BACKLOG = 2 * 1514  # bytes: psched_mtu of the aqm's to-client (MTU 1500 + Ethernet header), twice


def backlog_at_dequeue(ts_in: np.ndarray, ts_out: np.ndarray, size: np.ndarray) -> np.ndarray:
    """Bytes still queued when each packet leaves: arrived (ts_in <= its ts_out) and not yet gone (ts_out
    later than its own); `size` as the qdisc counts it (IP length + 14)."""
    order_in, order_out = np.argsort(ts_in, kind="stable"), np.argsort(ts_out, kind="stable")
    arrived = np.concatenate([[0], np.cumsum(size[order_in])])[np.searchsorted(ts_in[order_in], ts_out, "right")]
    gone = np.concatenate([[0], np.cumsum(size[order_out])])[np.searchsorted(ts_out[order_out], ts_out, "right")]
    return arrived - gone


def coupling(samples: list[dict], ts_out_l: np.ndarray, ts_out_c: np.ndarray, ce_c: np.ndarray, k: int,
             max_gap_s: float, target_us: int, eligible_l: np.ndarray, eligible_c: np.ndarray) -> dict:
    """Observed and expected marks inside the steady intervals. `ts_out_l`/`ts_out_c`: egress times (ns) of the
    L and classic packets that left; `ce_c`: 1 where a classic packet left with CE it did not arrive with;
    `eligible_*`: dequeued with at least MIN_BACKLOG still queued (backlog_at_dequeue)."""
    t = np.array([s["t"] * 1e9 for s in samples])
    p = np.array([s["xstats"]["p_prime"] for s in samples])
    marks = np.array([s["xstats"]["ecn_mark"] for s in samples])
    steps = np.array([s["xstats"]["step_marks"] for s in samples])
    steady = steady_intervals(samples, max_gap_s, target_us)
    il, ic = np.searchsorted(t, ts_out_l, side="right") - 1, np.searchsorted(t, ts_out_c, side="right") - 1
    in_l, in_c = np.isin(il, steady), np.isin(ic, steady)
    p_l = np.interp(ts_out_l[in_l & eligible_l], t, p)
    p_c = np.interp(ts_out_c[in_c & eligible_c], t, p)
    ce_c_per = np.bincount(ic[in_c], weights=ce_c[in_c], minlength=len(t))
    coupled_l = float(sum(marks[i + 1] - marks[i] - (steps[i + 1] - steps[i]) - ce_c_per[i] for i in steady))
    return {"steady_intervals": int(len(steady)), "intervals": len(samples) - 1,
            "steady_s": round(float(sum(t[i + 1] - t[i] for i in steady)) / 1e9, 1),
            "l_packets": int(in_l.sum()), "c_packets": int(in_c.sum()),
            "l_eligible": int((in_l & eligible_l).sum()), "c_eligible": int((in_c & eligible_c).sum()),
            "coupled_l": coupled_l, "expected_l": float(np.minimum(k * p_l, 1).sum()),
            "ce_c": int(ce_c[in_c].sum()), "expected_c": float((p_c ** 2).sum()),
            "expected_c_if_linear": float(p_c.sum()), "mean_p_prime": float(p_c.mean()) if len(p_c) else None}
