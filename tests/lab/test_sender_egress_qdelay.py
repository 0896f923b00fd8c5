"""M-QDELAY where the bottleneck is the sender's own egress (method (a)): tests/plans/lab_sender_egress.yaml on
a two-host netns lab -- the agent traces the interface's queue tracepoints beside its capture, the ingest
times every captured data packet from its entry into the qdisc chain, and the run's queue delay agrees with the
qdisc's own samples: the backlog a packet found on entering, drained at the rate the qdisc's byte counter
shows (not the configured one: on a loaded machine the shaper may drain slower, and both methods see that)."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from sqlalchemy import text

from orchestrator.lab import netns
from orchestrator.plan import load_plan
from orchestrator.plan.model.topology import plan_graph
from tests.lab.conftest import lab_unavailable, run_lab_plan

PLAN = Path(__file__).resolve().parents[1] / "plans" / "lab_sender_egress.yaml"
PREFIX = "tegress"


@pytest.fixture(scope="module")
def db(tmp_path_factory):
    if reason := lab_unavailable():
        pytest.skip(reason)
    state_dir = tmp_path_factory.mktemp("egress-lab")
    plan = load_plan(PLAN)
    try:
        netns.up(state_dir, PREFIX, graph=plan_graph(plan.roles, plan.topology), timeout_s=60)
        yield run_lab_plan(PLAN, state_dir, tmp_path_factory.mktemp("egress"))
    finally:
        netns.down(state_dir, PREFIX)


def test_every_captured_data_packet_is_timed_from_its_entry_into_the_chain(db):
    with db.connect() as c:
        (pair,) = c.execute(text("SELECT ingress, egress, d_fwd_source, matched, dropped, unmatched_egress "
                                 "FROM qdelay_pair")).all()
        assert pair.ingress == "sender:to-receiver net_dev_queue" and pair.egress == "sender:to-receiver"
        assert pair.d_fwd_source == "tracepoints"
        assert pair.matched > 5000 and pair.unmatched_egress <= 0.01 * pair.matched, pair
        waits = np.array(c.execute(text("SELECT sojourn_ns FROM qdelay WHERE payload_len > 0")).scalars().all())
    assert (waits >= 0).all() and np.median(waits) > 1_000_000     # a standing queue: milliseconds


def test_the_queue_delay_is_the_backlog_found_on_entering_drained_at_the_qdiscs_own_rate(db):
    with db.connect() as c:
        rows = c.execute(text("SELECT ts_in_ns, sojourn_ns FROM qdelay WHERE payload_len > 0 ORDER BY ts_in_ns")).all()
        samples = c.execute(text("SELECT s.ts_ns, s.backlog_bytes, s.bytes FROM qdisc_sample s "
                                 "WHERE s.kind = 'pfifo' ORDER BY s.ts_ns")).all()
    ts_in = np.array([r[0] for r in rows])
    waits_ms = np.array([r[1] for r in rows]) / 1e6
    q_ts, backlog, sent = (np.array([s[i] for s in samples]) for i in range(3))
    inside = (ts_in >= q_ts[0]) & (ts_in <= q_ts[-1])
    found = backlog[np.searchsorted(q_ts, ts_in[inside], side="right") - 1]
    busy = backlog > 0                        # drained while backlogged: the service rate, bytes per ns
    rate = (sent[busy][-1] - sent[busy][0]) / (q_ts[busy][-1] - q_ts[busy][0])
    expected_ms = (found / rate / 1e6).mean()
    assert waits_ms[inside].mean() == pytest.approx(expected_ms, rel=0.15), (waits_ms[inside].mean(), expected_ms)
