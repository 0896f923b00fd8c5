"""The DCTCP-flaws study's own kernel modules in real runs, checked from the database: experiments/vm/mark.yaml
and prr.yaml, on any lab whose aqm and server run a kernel the modules were built for.

mark.yaml, four runs through netem 10 ms -> htb 20 Mbit/s -> `mark` (aqm_mark, step at 2 ms of sojourn, at
dequeue):
- the aqm's agent loads sch_aqm_mark, applies the stage over netlink and reads it back (the run fails before
  traffic if the kernel's dump differs); from the ingested per-packet queue delay (orchestrator/ingest/qdelay:
  egress - ingress - netem - the run's minimum forwarding latency), CE is set only on packets that waited
  more than 2 ms, and marks happen;
- the server's agent loads tcp_dctcp_flaws with the plan's dctcp_shift_g and alpha_toggle and reads them
  back: the stored run holds the read-back, and the sender's alpha (ss -ti) follows them: with g = 1/16 it
  settles well above 0; with g = 1/1024 upstream's decay (toggle) empties it in the first window and marks
  cannot lift it above 1/1024; without the toggle the decay is 0 and alpha stays at its initial ~1.
"""
from __future__ import annotations

import json
from pathlib import Path

from sqlalchemy import text

from schemas import protocol
from schemas.qdiscs import mark_netlink as mn

MARK_PLAN = Path(__file__).resolve().parents[2] / "experiments" / "vm" / "mark.yaml"
PRR_PLAN = MARK_PLAN.parent / "prr.yaml"
MODULES = ("sch_aqm_mark", "tcp_dctcp_flaws")
THRESHOLD_NS = 2_000_000
# The stored sojourn is t_out - t_in - netem - the run's minimum forwarding latency, so it includes all that
# aqm_mark saw (its enqueue-to-dequeue time) plus non-negative extras (netem's late release, forwarding above
# the minimum). It is below aqm_mark's own only by how the two captures stamp: µs timestamps taken at different
# points of the path (ingress on receive, egress at transmit), up to tens of µs on an emulated host.
TOLERANCE_NS = 100_000


def evidence(conn, run_id: str) -> dict:
    return {(e.host, e.phase): json.loads(e.data) if isinstance(e.data, str) else e.data
            for e in conn.execute(text("SELECT host, phase, data FROM host_evidence WHERE run_id = :r"),
                                  {"r": run_id})}


def check_mark_runs(engine) -> None:
    """The four runs of experiments/vm/mark.yaml."""
    with engine.connect() as conn:
        runs = conn.execute(text("SELECT run_id, run_key, status, params FROM run ORDER BY run_id")).all()
        assert len(runs) == 4 and {r.status for r in runs} == {"complete"}, runs
        alpha = {}
        for run in runs:
            params = json.loads(run.params) if isinstance(run.params, str) else run.params
            ev = evidence(conn, run.run_id)
            # the aqm: the stage as the kernel dumped it, and no module left behind
            aqm = protocol.Readback.model_validate(ev[("aqm", "apply")])
            (raw,) = aqm.interfaces["to-client"].raw_qdiscs
            assert raw["kind"] == "aqm_mark" and raw["parent"] == "2:1"
            assert mn.decode_options(bytes.fromhex(raw["options_hex"])) == {
                "mode": "step", "metric": "sojourn", "min_ns": THRESHOLD_NS, "max_ns": 0, "limit_packets": 300,
                "on_dequeue": True, "rate_bytes_ps": 0}
            # the server: the module parameter as asked, read back from sysfs after the load
            server = protocol.Readback.model_validate(ev[("server", "apply")])
            assert server.module_params == {"tcp_dctcp_flaws": {"dctcp_shift_g": str(params["dctcp_shift_g"]),
                                                                "alpha_toggle": str(params["alpha_toggle"])}}
            assert all(ev[(h, "reset")]["restored"] is True for h in ("client", "aqm", "server")), ev
            # the packets: CE only above the threshold, and CE happens
            rows = conn.execute(text("SELECT sojourn_ns, ce FROM qdelay WHERE run_key = :k AND dropped = 0"),
                                {"k": run.run_key}).all()
            ce = [r.sojourn_ns for r in rows if r.ce]
            above = [r for r in rows if r.sojourn_ns > THRESHOLD_NS]
            print(f"{params['cc']} g_shift {params['dctcp_shift_g']} toggle {params['alpha_toggle']}: "
                  f"{len(rows)} packets, {len(ce)} CE, "
                  f"smallest CE sojourn {min(ce) / 1e6 if ce else None} ms, "
                  f"CE fraction above 2 ms {sum(r.ce for r in above) / max(1, len(above)):.2f} of {len(above)}")
            assert len(rows) > 1000 and len(ce) > 20
            assert min(ce) >= THRESHOLD_NS - TOLERANCE_NS
            marked = conn.execute(text("SELECT max(packets) FROM qdisc_sample WHERE run_key = :k AND kind = "
                                       "'aqm_mark'"), {"k": run.run_key}).scalar()
            assert marked and marked > 1000        # the poller sampled aqm_mark like any qdisc
            if params["cc"] == "dctcp_flaws":
                # the data socket (iperf3's control connection carries almost nothing), after 2 s
                samples = conn.execute(text(
                    "SELECT dctcp_alpha FROM ss_sample WHERE run_key = :k AND sport = (SELECT sport FROM ss_sample "
                    "WHERE run_key = :k ORDER BY bytes_acked DESC LIMIT 1) AND ts_ns > "
                    "(SELECT min(ts_ns) FROM ss_sample WHERE run_key = :k) + 2000000000"), {"k": run.run_key}
                ).scalars().all()
                assert samples and all(a is not None for a in samples)
                alpha[int(params["dctcp_shift_g"]), int(params["alpha_toggle"])] = samples   # as YAML typed them
    print({g: f"mean {sum(a) / len(a):.4f}, max {max(a):.4f} over {len(a)}" for g, a in alpha.items()})
    assert sum(alpha[4, 1]) / len(alpha[4, 1]) > 0.05     # g = 1/16: the marks keep alpha up
    assert max(alpha[10, 1]) <= 1 / 1024                  # g = 1/1024, toggle: at most one window's 1/1024
    assert min(alpha[10, 0]) >= 1023 / 1024               # no toggle: alpha >> 10 is 0, alpha keeps its start


def check_prr_runs(engine) -> None:
    """The two runs of experiments/vm/prr.yaml. alpha held at ~1, so each CE echo halves: with prr 0 the ACK
    after the echo already shows cwnd at the new ssthresh (the module's cong_control set it at once); with prr 1
    the kernel's PRR is still on its way down (cwnd above the new ssthresh, about one segment less per ACK).
    From tcp_probe on the sender."""
    at_once = {}
    with engine.connect() as conn:
        runs = conn.execute(text("SELECT run_id, run_key, status, params FROM run")).all()
        assert len(runs) == 2 and {r.status for r in runs} == {"complete"}, runs
        for run in runs:
            params = json.loads(run.params) if isinstance(run.params, str) else run.params
            prr = int(params["prr"])
            server = protocol.Readback.model_validate(evidence(conn, run.run_id)[("server", "apply")])
            assert server.module_params == {"tcp_dctcp_flaws": {"dctcp_shift_g": "10", "alpha_toggle": "0",
                                                                "prr": str(prr)}}
            events = conn.execute(text(
                "SELECT snd_cwnd, ssthresh FROM tcp_probe WHERE run_key = :k AND host = 'server' AND sport = "
                "(SELECT sport FROM tcp_probe WHERE run_key = :k AND host = 'server' GROUP BY sport "
                "ORDER BY count(*) DESC LIMIT 1) ORDER BY ts_ns"), {"k": run.run_key}).all()
            # a reduction lowers ssthresh; it also rises, at the same ACK's send path, when the window was not
            # used up (tcp_cwnd_application_limited: ssthresh = max(ssthresh, 3/4 cwnd)), which is no reduction
            cuts = [(cur.snd_cwnd, cur.ssthresh) for prev, cur in zip(events, events[1:], strict=False)
                    if cur.ssthresh < prev.ssthresh]
            at_once[prr] = sum(cwnd <= ssthresh for cwnd, ssthresh in cuts) / max(1, len(cuts))
            print(f"prr {prr}: {len(events)} ACKs, {len(cuts)} reductions, cwnd at ssthresh on the next ACK in "
                  f"{at_once[prr]:.2f} of them; first (cwnd, ssthresh): {cuts[:6]}")
            assert len(cuts) >= 5, cuts
    assert at_once[0] >= 0.9
    assert at_once[1] <= 0.5
