"""A result database for the web tests, written through the real writer (orchestrator/storage/writer.write_run).

- `PHYSICS_RUN`: a quickstart run (the plan's own RunSpec: CUBIC, htb 20 Mbit/s, pfifo 100, 2 flows, 5 s) with
  coherent per-packet data: both aqm captures (egress toward the client, ingress from the server) with TCP
  timestamps, the queue-delay rows of the pair (a sawtooth up to 100 packets, drops at its top), tcp_probe cwnd
  per flow, qdisc samples every 10 ms, and one timed event: `set_rate` to 10 Mbit/s at 2.5 s (the rate halves, so
  goodput halves and queue delay doubles after the red line);
- campaign `nightly-web`: 5 nights of one cell (vanilla and long-queue, 3 repetitions each, ok trials settled by
  write_run with tests/db/dbdata.make_run_ingest runs), per-trial metric values with a step in `qdelay_median`
  of the long-queue variant from night 4, and the verdicts of every night (REGRESSION on the last two);
- plan `other`: EXTRA_RUNS runs (complete, failed, refused; tags smoke / nightly) for filters and paging.
"""
from __future__ import annotations

import datetime as dt
from dataclasses import replace
from pathlib import Path

import numpy as np

from orchestrator.plan import expand, load_plan
from orchestrator.storage import addr, records, trials
from orchestrator.storage.campaign_tables import campaign_verdict
from orchestrator.storage.conns import ConnRegistry
from orchestrator.storage.db import open_db, writer
from orchestrator.storage.run_ingest import RunIngest
from orchestrator.storage.writer import write_run
from tests.db.dbdata import make_run_ingest

ROOT = Path(__file__).resolve().parents[2]
PHYSICS_RUN = "quickstart-cubic-20mbit-2flows"
CAMPAIGN = "nightly-web"
NIGHTS, REPS = 5, 3
VARIANTS = ("vanilla", "long-queue")
EXTRA_RUNS = 26
T0 = 1_790_000_000_000_000_000
MS = 1_000_000
FRAME, MSS = 1514, 1448
SERVER, CLIENT = "10.0.3.2", "10.0.1.2"
EGRESS, INGRESS = "aqm:to-client", "aqm:to-server"
EVENT_AT_S = 2.5


def _packets(n: int, t: np.ndarray, src: str, dst: str, sport: np.ndarray, dport: np.ndarray, seq: np.ndarray,
             plen: int, tsval: np.ndarray, tsecr: np.ndarray, point: int) -> np.ndarray:
    a = np.zeros(n, records.PACKET)
    a["ts_ns"], a["seq"], a["ack"] = t, seq % (1 << 32), 1
    a["src_addr"], a["dst_addr"] = addr.packed(src), addr.packed(dst)
    a["src_port"], a["dst_port"] = sport, dport
    a["payload_len"], a["ip_len"] = plen, plen + 52
    a["tcp_flags"], a["ecn"], a["proto"], a["ipv"], a["point"] = 0x18 if plen else 0x10, 0, 6, 4, point
    a["ip_id"] = np.arange(n) % 65536
    a["tsval"], a["tsecr"] = tsval, tsecr
    return a


def physics_ingest() -> RunIngest:
    plan = load_plan(ROOT / "experiments" / "quickstart.yaml")
    spec = next(s for s in expand(plan) if s.params.get("cc") == "cubic" and s.params.get("flows") == 2
                and s.params.get("rate") == "20mbit")
    spec = spec.model_copy(update={"run_id": PHYSICS_RUN})
    rng = np.random.default_rng(7)
    # egress departures: back to back at 20 Mbit/s, then 10 Mbit/s after the event
    gap = np.where(np.arange(20_000) * FRAME * 8 / 20e6 < EVENT_AT_S, FRAME * 8 / 20e6, FRAME * 8 / 10e6)
    t_out = 0.05 + np.cumsum(gap)
    t_out = t_out[t_out < 4.95]
    n = t_out.size
    flow = (rng.random(n) < 0.45).astype(int)                   # flow 1 gets a bit less than flow 0
    rate = np.where(t_out < EVENT_AT_S, 20e6, 10e6)
    qpkts = (np.mod(t_out, 1.0) * 100).astype(int)              # queue length sawtooth 0..99 packets per second
    sojourn = qpkts * FRAME * 8 / rate
    t_in = t_out - sojourn - 15e-6
    tsval = (t_in * 1000).astype(np.int64) + 1_000_000
    k = np.zeros(n, int)
    for f in (0, 1):
        k[flow == f] = np.arange(int((flow == f).sum()))
    seq = 1_000 + k * MSS + flow * 7_777_777
    sport, dport = 40_000 + flow, 5_201 + flow
    tn = lambda s: (T0 + s * 1e9).astype(np.int64)              # noqa: E731
    egress = _packets(n, tn(t_out), SERVER, CLIENT, sport, dport, seq, MSS, tsval, tsval - 20, 0)
    acks = np.arange(0, n, 2)                                   # one ACK per two segments, 0.1 ms after
    ack_t = tn(t_out[acks] + 1e-4)
    ack_tsval = (t_out[acks] * 1000).astype(np.int64) + 2_000_000
    ack_eg = _packets(acks.size, ack_t, CLIENT, SERVER, dport[acks], sport[acks], np.ones(acks.size, int), 0,
                      ack_tsval, tsval[acks], 0)
    drops = np.flatnonzero(qpkts == 99)[::3]                    # dropped at the top of the sawtooth
    d_t = t_in[drops] + 1e-6
    dropped = _packets(drops.size, tn(d_t), SERVER, CLIENT, sport[drops], dport[drops], seq[drops] + 1, MSS,
                       tsval[drops], tsval[drops] - 20, 1)
    data_in = np.concatenate([_packets(n, tn(t_in), SERVER, CLIENT, sport, dport, seq, MSS, tsval, tsval - 20, 1),
                              dropped])
    is_drop = np.concatenate([np.zeros(n, bool), np.ones(drops.size, bool)])
    soj_ns = np.concatenate([(sojourn * 1e9).astype(np.int64), np.full(drops.size, -1)])
    order = np.argsort(data_in["ts_ns"], kind="stable")
    data_in, is_drop, soj_ns = data_in[order], is_drop[order], soj_ns[order]
    ingress = np.concatenate([data_in, replace_point(ack_eg, 1, 2e-5)])
    egress = np.concatenate([egress, ack_eg])
    egress, ingress = egress[np.argsort(egress["ts_ns"])], ingress[np.argsort(ingress["ts_ns"])]
    conns = ConnRegistry()
    conns.ids(egress)                      # the writer's order: point 0 first, so the ids match its conn rows
    q = np.zeros(data_in.size, records.QDELAY)
    q["conn_id"] = conns.ids(data_in)
    q["ts_in_ns"], q["dropped"], q["sojourn_ns"] = data_in["ts_ns"], is_drop, soj_ns
    q["ts_out_ns"] = np.where(is_drop, -1, q["ts_in_ns"] + soj_ns + 15_000)
    q["payload_len"] = MSS
    # tcp_probe on the sender: cwnd = a floor plus the flow's share of the queue, every 5 ms per flow
    tp_t = np.arange(0.05, 4.95, 0.005)
    probes = []
    for f in (0, 1):
        p = np.zeros(tp_t.size, records.TCP_PROBE)
        qn = (np.mod(tp_t, 1.0) * 100).astype(int)
        p["ts_ns"] = tn(tp_t) + f
        p["saddr"], p["sport"], p["daddr"], p["dport"] = SERVER, 40_000 + f, CLIENT, 5_201 + f
        p["snd_cwnd"] = 10 + (qn * (0.55 if f == 0 else 0.45)).astype(int)
        p["ssthresh"], p["srtt_us"] = 2**31 - 1, 1_000 + qn * 600
        p["snd_wnd"] = p["rcv_wnd"] = 3_145_728
        p["data_len"] = MSS
        probes.append(p)
    qs_t = np.arange(0.0, 5.0, 0.01)
    qs = np.zeros(qs_t.size * 2, records.QDISC_SAMPLE)
    qn = (np.mod(qs_t, 1.0) * 100).astype(int)
    for i, (handle, parent, kind) in enumerate((("1:", "root", "htb"), ("2:", "1:1", "pfifo"))):
        part = qs[i::2]
        part["ts_ns"], part["handle"], part["parent"], part["kind"] = tn(qs_t), handle, parent, kind
        part["backlog_bytes"], part["qlen"] = qn * FRAME, qn
        part["drops"] = np.searchsorted(np.sort(d_t), qs_t)
        part["packets"] = np.searchsorted(t_out, qs_t)
        part["bytes"] = part["packets"] * FRAME
    run = {"run_id": PHYSICS_RUN, "plan_sha256": "d" * 64,
           "plan_name": spec.plan_name, "experiment": spec.experiment, "repetition": spec.repetition,
           "seed": spec.seed, "status": "complete", "params": spec.params,
           "derived": spec.derived.model_dump(mode="json"),
           "spec": spec.model_dump(mode="json"), "tags": ["smoke", "<script>alert(1)</script>"], "profile": None,
           "t0_ns": T0, "duration_s": spec.duration_s,
           "started_at": dt.datetime(2026, 10, 1, 12, 0, tzinfo=dt.UTC),
           "finished_at": dt.datetime(2026, 10, 1, 12, 0, 6, tzinfo=dt.UTC), "error": None, "flags": []}
    sched = T0 + int(EVENT_AT_S * 1e9)
    return RunIngest(
        run=run,
        plan={"plan_sha256": run["plan_sha256"], "name": spec.plan_name, "path": "experiments/quickstart.yaml",
              "text": (ROOT / "experiments" / "quickstart.yaml").read_text(),
              "created_at": dt.datetime(2026, 10, 1, 11, 0, tzinfo=dt.UTC)},
        flows=[{"flow_id": f, "src_host": "server", "dst_host": "client", "src_addr": SERVER, "dst_addr": CLIENT,
                "src_port": 40_000 + f, "dst_port": 5_201 + f, "cc": "cubic", "start_s": 0.0, "duration_s": 5.0,
                "tool": "iperf3"} for f in (0, 1)],
        artifacts=[{"host": "aqm", "name": f"{p}.pcap", "kind": "pcap", "path": f"{PHYSICS_RUN}/aqm/{p}.pcap",
                    "size": 1_000_000 + i, "sha256": f"{i + 1:x}" * 64, "meta": {}}
                   for i, p in enumerate(("to-client", "to-server"))],
        evidence=[{"host": h, "phase": ph, "data": {"kernel": "6.1.0-50-amd64", "phase": ph}}
                  for h in ("client", "aqm", "server") for ph in ("hello", "apply", "reset")],
        hosts=[{"host": h, "variant": "vanilla", "vanilla": True, "build_key": None, "release": "6.1.0-50-amd64",
                "boot_id": f"{i:08x}-1111-4000-8000-000000000000", "installed_build_key": None}
               for i, h in enumerate(("client", "aqm", "server"))],
        events=[{"event_index": 0, "action": "set_rate", "host": "aqm", "interface": "to-client",
                 "scheduled_ns": sched, "issued_ns": sched + 200_000, "effective_ns": sched + MS,
                 "lag_ns": MS, "end_scheduled_ns": None, "end_effective_ns": None,
                 "detail": {"stage": {"kind": "htb", "rate_bit": 10_000_000}}}],
        packets=[(EGRESS, egress), (INGRESS, ingress)], conns=conns, qdelay=[(INGRESS, q)],
        qdelay_pairs=[{"ingress": INGRESS, "egress": EGRESS, "d_fwd_ns": 15_000, "d_fwd_source": "given",
                       "netem_ns": 0, "matched": int((~is_drop).sum()), "dropped": int(is_drop.sum()), "ce": 0,
                       "unmatched_egress": 0}],
        tcp_probe=[("server", np.concatenate(probes))],
        qdisc_samples=[("aqm", "to-client", qs)],
    )


def replace_point(a: np.ndarray, point: int, shift_s: float) -> np.ndarray:
    b = a.copy()
    b["point"] = point
    b["ts_ns"] += int(shift_s * 1e9)
    return b


def _campaign_run(run_id: str, variant: str, started: dt.datetime) -> RunIngest:
    ing = make_run_ingest(run_id, n_packets=200, seed=len(run_id))
    release = "6.1.0-50-amd64" if variant == "vanilla" else "6.1.0-99-amd64"
    hosts = [{**h, "variant": variant, "vanilla": variant == "vanilla", "release": release} for h in ing.hosts]
    return replace(ing, run={**ing.run, "plan_name": "quickstart", "experiment": "main", "started_at": started,
                             "tags": ["nightly"]}, hosts=hosts)


def build_campaign(engine) -> None:
    trials.save_campaign(engine, CAMPAIGN, "c" * 64, "experiments/campaigns/nightly-web.yaml",
                         "version: 1\nname: nightly-web\ndescription: the web tests' campaign <b>not bold</b>\n")
    for night in range(1, NIGHTS + 1):
        n = trials.start_night(engine, CAMPAIGN, "c" * 64, f"2026-10-0{night}")
        rows, seq = [], 0
        for rep in range(REPS):
            for variant in VARIANTS if rep % 2 == 0 else VARIANTS[::-1]:
                rows.append({"campaign_run_id": n["id"], "seq": seq, "cell_key": "e" * 64,
                             "cell_label": "quickstart/main", "plan_sha256": "a" * 64, "variant": variant,
                             "repetition": rep, "attempt": 0, "run_id": f"{CAMPAIGN}-n{night}-{variant}-r{rep}a0",
                             "spec": {}})
                seq += 1
        trials.add_trials(engine, rows)
        started = dt.datetime(2026, 10, night, 2, 0, tzinfo=dt.UTC)
        values = {}
        for i, t in enumerate(trials.trials(engine, [n["id"]])):
            write_run(engine, _campaign_run(t["run_id"], t["variant"], started + dt.timedelta(minutes=i)))
            step = 1.7 if t["variant"] == "long-queue" and night >= 4 else 1.0
            values[t["id"]] = {"qdelay_median": 4.0 * step + 0.05 * t["repetition"],
                               "goodput": 19.0 + 0.1 * t["repetition"]}
        trials.save_metrics(engine, values)
        regress = night >= 4
        verdicts = [
            {"campaign_run_id": n["id"], "check_index": 0, "cell_key": "e" * 64, "variant": "long-queue",
             "metric": "goodput", "kind": "relative", "verdict": "PASS",
             "detail": {"cell_label": "quickstart/main", "ratio": 1.0, "ci": [0.99, 1.01], "p_adjusted": 0.9}},
            {"campaign_run_id": n["id"], "check_index": 1, "cell_key": "e" * 64, "variant": "long-queue",
             "metric": "qdelay_median", "kind": "relative", "verdict": "REGRESSION" if regress else "PASS",
             "detail": {"cell_label": "quickstart/main", "ratio": 1.7 if regress else 1.0,
                        "ci": [1.65, 1.75] if regress else [0.98, 1.02], "p_adjusted": 0.016 if regress else 0.8,
                        "samples_cand": [6.8, 6.85, 6.9] if regress else [4.0, 4.05, 4.1]}},
        ]
        with writer(engine).begin() as conn:
            conn.execute(campaign_verdict.insert(), verdicts)
        trials.finish_night(engine, n["id"], 1 if regress else 0,
                            {"verdicts": {"REGRESSION" if regress else "PASS": 1, "PASS": 1}, "trials": {"ok": 6}})


def build_extra(engine) -> None:
    for i in range(EXTRA_RUNS):
        status = "failed" if i % 5 == 3 else "refused" if i % 7 == 6 else "complete"
        ing = make_run_ingest(f"other-{i:03d}", n_packets=100, seed=i, status=status)
        write_run(engine, replace(ing, run={**ing.run, "plan_name": "other", "experiment": f"e{i % 3}",
                                            "tags": ["smoke"] if i % 2 else ["nightly", "smoke"],
                                            "started_at": dt.datetime(2026, 9, 1, 0, i, tzinfo=dt.UTC)}))


def build_db(path: Path) -> str:
    url = f"sqlite:///{path}"
    engine = open_db(url)
    try:
        write_run(engine, physics_ingest())
        build_campaign(engine)
        build_extra(engine)
    finally:
        engine.dispose()
    return url
