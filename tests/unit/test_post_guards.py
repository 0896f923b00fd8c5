"""Guards on what a run measured (docs/guards.md: M-DROP, G-NETEM/G-HTB post, G-CC post), on literal
sampler and ss output (tests/fixtures/qdisc/README.md, tests/fixtures/ss/)."""
from __future__ import annotations

from pathlib import Path

from orchestrator.guards import ecn, qdisc
from orchestrator.guards import ss as ss_guards
from orchestrator.ingest.assemble import parse_qdisc_csv
from orchestrator.ingest.ss import parse_ss
from orchestrator.plan import expand, load_plan, load_plan_text
from schemas.hoststate import Netem

ROOT = Path(__file__).resolve().parents[2]
QDISC = ROOT / "tests" / "fixtures" / "qdisc"
RED_ECN = ROOT / "experiments" / "vm" / "red-ecn.yaml"


def _samples(name: str):
    return parse_qdisc_csv((QDISC / f"{name}.csv").read_text())


def _quickstart(cc: str, rate: str, flows: int):
    return next(s for s in expand(load_plan(ROOT / "experiments" / "quickstart.yaml"))
                if (s.params["cc"], s.params["rate"], s.params["flows"]) == (cc, rate, flows))


def _red_ecn(netem: str):
    text = RED_ECN.read_text().replace("    line_rate: 1gbit                  # sizes netem's limit (G-NETEM)\n", netem)
    text = text.replace("  tcp_probe: true\n", "  tcp_probe: true\n  accept_guards: [G-NETEM]\n")
    return expand(load_plan_text(text[:text.index("matrix:")], "netem-small.yaml"))[0]


def test_drops_in_the_queue_under_test_are_not_flagged():
    # the pfifo dropped 123 packets and htb's own counter shows the same 123: they are the leaf's
    assert qdisc.qdisc_findings(_quickstart("reno", "50mbit", 1), "aqm", "to-client",
                                 _samples("htb50_pfifo100_reno")) == []


def test_netem_dropping_above_the_aqm_is_flagged_with_its_own_count():
    found = qdisc.qdisc_findings(_red_ecn("    netem_limit: 5\n"), "aqm", "to-client",
                                  _samples("vm61_netem5_htb20_red_ecn"))
    assert [str(f) for f in found] == [
        "G-NETEM host aqm: netem 1: on to-client dropped 292 packets itself, above the queue under test: "
        "drops outside the AQM (raise its limit)"]


def test_planned_netem_loss_is_not_a_finding():
    spec = _red_ecn("    netem_limit: 5\n")
    aqm = spec.hosts["aqm"]
    lossy = {t: [s.model_copy(update={"loss": 0.01}) if isinstance(s, Netem) else s for s in c]
             for t, c in aqm.qdiscs.items()}       # the plan asks this host's netem for 1 % loss
    spec = spec.model_copy(update={"hosts": {**spec.hosts, "aqm": aqm.model_copy(update={"qdiscs": lossy})}})
    assert qdisc.qdisc_findings(spec, "aqm", "to-client", _samples("vm61_netem5_htb20_red_ecn")) == []


def test_an_htb_that_never_throttled_a_bulk_run_is_flagged():
    found = qdisc.qdisc_findings(_quickstart("reno", "20mbit", 1), "aqm", "to-client",
                                  _samples("htb20_burst2MB_pfifo_tcp5mbit"))
    assert len(found) == 1 and found[0].guard == "G-HTB"
    assert "htb 1: on to-client carried 3.2 Mbit/s of bulk traffic but never throttled" in found[0].message


def test_htb_overlimits_from_bursts_count_as_throttling():
    # below its rate htb still throttles line-rate cwnd bursts: overlimits 78, not a finding
    assert qdisc.qdisc_findings(_quickstart("reno", "20mbit", 1), "aqm", "to-client",
                                 _samples("htb100_pfifo_tcp5mbit")) == []


def test_one_sample_or_none_says_nothing():
    spec = _quickstart("reno", "20mbit", 1)
    assert qdisc.qdisc_findings(spec, "aqm", "x", _samples("htb100_pfifo_tcp5mbit")[:1]) == []


def _ss_spec(cc: str, port: int):
    text = (ROOT / "experiments" / "quickstart.yaml").read_text().replace("base_port: 5201", f"base_port: {port}")
    spec = next(s for s in expand(load_plan_text(text, "q.yaml")) if s.params["flows"] == 1)
    return spec.model_copy(update={"flows": [spec.flows[0].model_copy(update={"cc": cc})]})


def test_ss_shows_the_planned_cc_on_the_data_socket_not_the_control_one():
    ss = parse_ss((ROOT / "tests" / "fixtures" / "ss" / "ss_cubic.txt").read_text())
    # iperf3's control connection (port 59328) ran the namespace's default bbr; the -C cubic stream 59344
    assert ss_guards.ss_cc_findings(_ss_spec("cubic", 5311), "server", ss, {0: 59344}) == []
    assert ss_guards.ss_cc_findings(_ss_spec("cubic", 5311), "server", ss, {0: None}) == []   # most bytes sent
    [f] = ss_guards.ss_cc_findings(_ss_spec("dctcp", 5311), "server", ss, {0: 59344})
    assert str(f) == "G-CC host server: flow 0 (port 59344 -> 5311) ran cubic per ss, the plan says dctcp"
    assert ss_guards.ss_cc_findings(_ss_spec("cubic", 5399), "server", ss, {0: None}) == []   # not sampled


def _counts(point, sport, dport, **kw):
    return {"point": point, "src_port": sport, "dst_port": dport, "syn": 0, "syn_ecn": 0, "synack": 0,
            "synack_ece": 0, "data": 0, "data_ect": 0, **kw}


def test_ecn_findings_judge_only_flows_that_asked_for_ecn():
    spec = _red_ecn("    netem_limit: 5\n")            # tcp_ecn: 1 on every host
    reno = _quickstart("reno", "20mbit", 1)            # tcp_ecn: 0
    rows = [{"flow_id": 0, "src_port": 40000}, {"flow_id": 1, "src_port": 40002}]
    ok = [_counts("aqm:to-server", 40000, 5201, syn=1, syn_ecn=1, data=1000, data_ect=990),
          _counts("aqm:to-server", 5201, 40000, synack=1, synack_ece=1),
          _counts("aqm:to-server", 40002, 5202, syn=1, syn_ecn=1, data=900, data_ect=899),
          _counts("aqm:to-server", 5202, 40002, synack=1, synack_ece=1)]
    assert ecn.ecn_findings(spec, rows, ok) == []
    # flow 1's first SYN was dropped and the retry went out without ECE (tcp_ecn_fallback): non-ECT data
    fallback = ok[:2] + [_counts("aqm:to-server", 40002, 5202, syn=2, syn_ecn=1, data=900, data_ect=0),
                         _counts("aqm:to-server", 5202, 40002, synack=1, synack_ece=0)]
    fallback[2]["syn_ecn"] = 0
    [f] = ecn.ecn_findings(spec, rows, fallback)
    assert str(f) == ("G-ECN host server: flow 1 (40002 -> 5202) did not use ECN: its SYN carried no ECE+CWR; the "
                      "SYN-ACK carried no ECE; 0% of its data packets at aqm:to-server were ECN-capable (check "
                      "tcp_ecn on both ends and tcp_ecn_fallback=0)")
    plain = [_counts("aqm:to-server", 40000, 5201, syn=1, data=1000)]
    assert ecn.ecn_findings(reno, rows[:1], plain) == []                  # reno with tcp_ecn 0: not asked
    assert len(ecn.ecn_findings(spec, rows[:1], plain)) == 1               # the same packets, ECN asked
    late = [_counts("aqm:to-server", 40000, 5201, data=1000, data_ect=990)]  # capture began after the handshake
    assert ecn.ecn_findings(spec, rows, late) == []


def _ss(name: str):
    return parse_ss((ROOT / "tests" / "fixtures" / "ss" / f"{name}.txt").read_text())


def test_ss_chrono_times_are_parsed_and_accumulate():
    snd = _ss("ss_sndbuf_limited")
    data = snd[snd["bytes_sent"] == snd["bytes_sent"].max()]["sport"][0]
    mine = snd[snd["sport"] == data]
    assert mine["busy_ms"].tolist() == [404, 904, 1404, 1904]          # literal `busy:404ms` ... in the fixture
    assert mine["sndbuf_limited_ms"].tolist() == [128, 408, 696, 988]  # `sndbuf_limited:128ms(31.7%)` ...
    assert not mine["rwnd_limited_ms"].any()
    rwnd = _ss("ss_rwnd_limited")
    assert rwnd["rwnd_limited_ms"].max() == 1712 and not rwnd["sndbuf_limited_ms"].any()
    assert not _ss("ss_cubic")["sndbuf_limited_ms"].any()               # ss prints them only when non-zero


def test_sockbuf_post_names_the_buffer_that_limited_the_flow():
    spec = _ss_spec("cubic", 5201)
    [snd] = ss_guards.ss_sockbuf_findings(spec, "server", _ss("ss_sndbuf_limited"), {0: None})
    assert str(snd).startswith("G-SOCKBUF host server: flow 0 (port ")
    assert snd.message.endswith("was limited by its send buffer for 52% of its busy time (988 of 1904 ms): the "
                                "socket, not the network; raise tcp_wmem on server")
    [rwnd] = ss_guards.ss_sockbuf_findings(spec, "server", _ss("ss_rwnd_limited"), {0: None})
    assert "the receiver's window for 90% of its busy time (1712 of 1896 ms)" in rwnd.message
    assert rwnd.message.endswith("raise tcp_rmem on client")
    assert ss_guards.ss_sockbuf_findings(_ss_spec("cubic", 5311), "server", _ss("ss_cubic"), {0: None}) == []
