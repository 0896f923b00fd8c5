"""run_table, format_table and write_report on a tiny SQLite DB built here from literal rows."""
from __future__ import annotations

import base64
import csv
import html
import io
import math
import re
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import pytest
import sqlalchemy as sa
from PIL import Image

from analysis import load, rundata, runmeta, runstats, summary
from analysis import tables as t
from analysis.report import write_report
from orchestrator.plan import CapturePoint, FlowSpec, HostSpec, LinkRef, RunSpec
from orchestrator.storage import tables as T
from schemas.flag import parse_line
from schemas.hoststate import Htb, Pfifo

T0 = 1_700_000_000_000_000_000
MS = 1_000_000
MSS = 1448
CLIENT, SERVER = "10.0.1.2", "10.0.2.2"


def spec(run_id: str, cc: str, rate_bit: int, ports: list[int]) -> dict:
    flows = [FlowSpec(flow_id=i, src="server", dst="client", cc=cc, start_s=0.0, duration_s=1.0, port=p)
             for i, p in enumerate(ports)]
    aqm_link = LinkRef(host="aqm", toward="client")
    return RunSpec(
        run_id=run_id, plan_name="quick", experiment="e", params={}, duration_s=1.0,
        hosts={"aqm": HostSpec(qdiscs={"client": [Htb(rate_bit=rate_bit), Pfifo(limit_packets=100)]})},
        flows=flows,
        # The sender-side capture comes first: the bottleneck point must be found by link, not order.
        captures=[CapturePoint(link=LinkRef(host="server", toward="aqm")), CapturePoint(link=aqm_link)],
        qdisc_stats=[aqm_link],
    ).model_dump(mode="json")


def packet_row(run_id: str, point: str, ts: int, sport: int, dport: int, seq: int, plen: int,
               src: str = SERVER, dst: str = CLIENT) -> dict:
    return dict(run_id=run_id, point=point, ts_ns=ts, src_addr=src, dst_addr=dst, src_port=sport,
                dst_port=dport, seq=seq, ack=1, payload_len=plen, ip_len=plen + 52, tcp_flags=0x18,
                ecn=0, ip_id=0, tsval=-1, tsecr=-1)


def data_flow(run_id: str, point: str, sport: int, dport: int, n: int, start_ms: int, gap_ms: int,
              isn: int) -> list[dict]:
    """n full segments every gap_ms, plus one retransmission of segment 3 and the receiver's ACKs."""
    rows = [packet_row(run_id, point, T0 + (start_ms + k * gap_ms) * MS, sport, dport,
                       (isn + k * MSS) % (1 << 32), MSS) for k in range(n)]
    rows.append(packet_row(run_id, point, T0 + (start_ms + 3 * gap_ms) * MS + 1, sport, dport,
                           (isn + 3 * MSS) % (1 << 32), MSS))
    rows += [packet_row(run_id, point, T0 + (start_ms + k * gap_ms) * MS + 5, dport, sport, 1, 0,
                        src=CLIENT, dst=SERVER) for k in range(n)]
    return rows


def qdisc_rows(run_id: str, iface: str, backlogs: list[int], drops: list[int], scale: int = 1) -> list[dict]:
    """htb root 1: (total backlog) and pfifo leaf 10: (half of it) sampled every 10 ms from t0."""
    rows = []
    for k, (b, d) in enumerate(zip(backlogs, drops, strict=True)):
        base = dict(run_id=run_id, host="aqm", interface=iface, ts_ns=T0 + k * 10 * MS, bytes=0,
                    packets=0, overlimits=0, requeues=0)
        rows.append(base | dict(handle="1:", parent="root", kind="htb", drops=d,
                                backlog_bytes=b * scale, qlen=b * scale // 1000))
        rows.append(base | dict(handle="10:", parent="1:1", kind="pfifo", drops=d,
                                backlog_bytes=b * scale // 2, qlen=b * scale // 2000))
    return rows


def probe_rows(run_id: str, host: str, sport: int, dport: int, cwnds: list[int], start_ms: int = 0) -> list[dict]:
    """tcp_probe events one per ms from start_ms (the run table reads them inside the run's window only)."""
    return [dict(run_id=run_id, host=host, ts_ns=T0 + (start_ms + k) * MS, saddr=SERVER, sport=sport, daddr=CLIENT,
                 dport=dport, snd_cwnd=c, ssthresh=2**31 - 1, srtt_us=1000, snd_wnd=0, rcv_wnd=0,
                 snd_nxt=0, snd_una=0, data_len=0, sock_cookie=0) for k, c in enumerate(cwnds)]


def run_row(run_id: str, cc: str, rate_bit: int, ports: list[int], status: str = "complete") -> dict:
    return dict(run_id=run_id, plan_name="quick", experiment="e", repetition=0, seed=0, status=status,
                params={"cc": cc, "rate": f"{rate_bit // 10**6}mbit", "rate_bit": rate_bit,
                        "flows": len(ports)},
                derived={}, spec=spec(run_id, cc, rate_bit, ports), tags=[], t0_ns=T0, duration_s=1.0,
                started_at=datetime.now(UTC), finished_at=None, error=None, flags=[])


def flow_row(run_id: str, flow_id: int, cc: str, dport: int, sport: int | None) -> dict:
    return dict(run_id=run_id, flow_id=flow_id, src_host="server", dst_host="client", src_addr=SERVER,
                dst_addr=CLIENT, src_port=sport, dst_port=dport, cc=cc, start_s=0.0, duration_s=1.0,
                tool="iperf3")


BOTTLENECK = "aqm:to-client"
CPULOAD_FLAG = ("G-CPULOAD host client+aqm+server: cpu1 was > 90% busy for 100% of the measurement window (mean "
                "100%, softirq 0%, steal 0%): the lab host, not the network, may have limited this run")


@pytest.fixture()
def engine(tmp_path: Path) -> sa.Engine:
    eng = sa.create_engine(f"sqlite:///{tmp_path / 'results.db'}")
    T.metadata.create_all(eng)
    runs = [run_row("q-reno-20", "reno", 20_000_000, [5201]),
            run_row("q-bbr-50", "bbr", 50_000_000, [5201, 5202]),
            run_row("q-failed", "reno", 20_000_000, [5201], status="failed")]
    runs[1]["flags"] = [parse_line(CPULOAD_FLAG).stored()]
    flows = [flow_row("q-reno-20", 0, "reno", 5201, None),            # sender port not recorded
             flow_row("q-bbr-50", 0, "bbr", 5201, 40001),
             flow_row("q-bbr-50", 1, "bbr", 5202, 40002),
             flow_row("q-failed", 0, "reno", 5201, 40000)]
    packets = (
        # q-reno-20: 11 segments every 10 ms from 100 ms; seq wraps inside the flow.
        data_flow("q-reno-20", BOTTLENECK, 40000, 5201, n=11, start_ms=100, gap_ms=10,
                  isn=(1 << 32) - 5 * MSS)
        # iperf3 control connection to the same port: few bytes, must not mix in.
        + [packet_row("q-reno-20", BOTTLENECK, T0 + 50 * MS, 39999, 5201, 777, 37),
           packet_row("q-reno-20", BOTTLENECK, T0 + 990 * MS, 39999, 5201, 814, 300)]
        # the same flow seen upstream at the sender: must not count.
        + data_flow("q-reno-20", "server:to-aqm", 40000, 5201, n=30, start_ms=90, gap_ms=5, isn=0)
        # q-bbr-50: two flows, overlapping spans [200, 290] and [250, 400] ms.
        + data_flow("q-bbr-50", BOTTLENECK, 40001, 5201, n=10, start_ms=200, gap_ms=10, isn=1000)
        + data_flow("q-bbr-50", BOTTLENECK, 40002, 5202, n=16, start_ms=250, gap_ms=10, isn=5)
        + data_flow("q-failed", BOTTLENECK, 40000, 5201, n=5, start_ms=100, gap_ms=10, isn=0)
    )
    # q-reno-20: root backlog in the data window [100, 200] ms is samples 10..20.
    reno_backlog = [0] * 10 + [1000 * k for k in range(11)] + [50_000] * 5
    reno_drops = [0] * 10 + [3 + k // 2 for k in range(11)] + [99] * 5
    qdisc = (qdisc_rows("q-reno-20", "to-client", reno_backlog, reno_drops)
             # another sampled interface of the aqm host (sorting first): not the bottleneck.
             + qdisc_rows("q-reno-20", "br0", [77_000] * 26, list(range(26)))
             + qdisc_rows("q-bbr-50", "to-client", [3000] * 45, [k // 10 for k in range(45)]))
    probe = (probe_rows("q-reno-20", "server", 40000, 5201, [10, 20, 30, 40], 100)     # data: mean 25
             + probe_rows("q-reno-20", "server", 40000, 5201, [90], 5)                  # before the window
             + probe_rows("q-reno-20", "server", 39999, 5201, [10], 100)                # control connection
             + probe_rows("q-reno-20", "client", 5201, 40000, [7, 7, 7], 100)           # receiver side
             + probe_rows("q-bbr-50", "server", 40001, 5201, [100, 100], 250)
             + probe_rows("q-bbr-50", "server", 40002, 5202, [50], 250))
    keys = {r["run_id"]: i + 1 for i, r in enumerate(runs)}
    for r in runs:
        r["run_key"] = keys[r["run_id"]]
    conns: dict[tuple, int] = {}   # packet rows name a conn (point, addresses, ports) by id
    packet_rows = []
    for row in packets:
        k = (row["run_id"], row["point"], row["src_addr"], row["dst_addr"], row["src_port"], row["dst_port"])
        cid = conns.setdefault(k, len(conns))
        packet_rows.append({"run_key": keys[row["run_id"]], "conn_id": cid,
                            **{c: v for c, v in row.items() if c in T.packet.c}})
    conn_rows = [dict(run_key=keys[k[0]], conn_id=cid, point=k[1], proto=6, ipv=4, src_addr=k[2], dst_addr=k[3],
                      src_port=k[4], dst_port=k[5]) for k, cid in conns.items()]

    def keyed(rows: list[dict]) -> list[dict]:
        return [{**{c: v for c, v in r.items() if c != "run_id"}, "run_key": keys[r["run_id"]]} for r in rows]

    with eng.begin() as conn:
        conn.execute(T.run.insert(), runs)
        conn.execute(T.flow.insert(), flows)
        conn.execute(T.conn.insert(), conn_rows)
        conn.execute(T.packet.insert(), packet_rows)
        conn.execute(T.qdisc_sample.insert(), keyed(qdisc))
        conn.execute(T.tcp_probe.insert(), keyed(probe))
    return eng


# ---------------------------------------------------------------------------- load helpers

def test_bottleneck_point_comes_from_the_qdisc_stats_link():
    s = spec("r", "reno", 10**7, [5201])
    assert runmeta.bottleneck_of(RunSpec.model_validate(s)) == ("aqm:to-client", LinkRef(host="aqm", toward="client"))
    s["qdisc_stats"] = []
    assert runmeta.bottleneck_of(RunSpec.model_validate(s)) == ("server:to-aqm", None)   # the first capture
    assert runmeta.bottleneck_of(None) == (None, None)
    assert runmeta.read_spec({}) is None and runmeta.read_spec({"derived": {}}) is None   # not a RunSpec


def test_queue_handle_fallback_is_the_largest_backlog():
    s = np.zeros(4, dtype=rundata.QDISC_DTYPE)
    s["handle"] = ["1:", "1:", "10:", "10:"]
    s["parent"] = ["1:1", "1:1", "1:2", "1:2"]      # nothing marked root
    s["backlog_bytes"] = [100, 100, 10, 10]
    assert rundata.pick_queue_handle(s) == "1:"
    s["parent"][2:] = "root"
    assert rundata.pick_queue_handle(s) == "10:"
    assert rundata.pick_queue_handle(s[:0]) is None


def test_queue_handle_steps_below_netem():
    # netem 1: -> htb 2: -> red 3: as the VM-lab plan builds it (tc -s -j qdisc parents)
    s = np.zeros(3, dtype=rundata.QDISC_DTYPE)
    s["handle"], s["parent"], s["kind"] = ["1:", "2:", "3:"], ["root", "1:1", "2:1"], ["netem", "htb", "red"]
    s["backlog_bytes"] = [25000 + 3000, 3000, 3000]   # netem's own count includes its delay line
    assert rundata.pick_queue_handle(s) == "2:"
    assert rundata.pick_queue_handle(s[:1]) == "1:"       # netem alone: nothing below to pick


# ---------------------------------------------------------------------------- run_table

def test_run_table_single_flow_with_wrap_retransmission_and_control_connection(engine):
    (row,) = summary.run_table(engine, ["q-reno-20"])
    assert (row.run_id, row.cc, row.rate_bit, row.flows) == ("q-reno-20", "reno", 20_000_000, 1)
    assert row.point == BOTTLENECK and row.qdisc_handle == "1:"
    expected = 11 * MSS * 8 / 0.100                # 11 unique segments over 100 ms
    assert row.goodput_bps == pytest.approx(expected)
    assert row.flow_goodput_bps == pytest.approx((expected,))
    assert row.goodput_ratio == pytest.approx(expected / 20e6)
    # root qdisc samples 10..20 (0..10 KB): the leaf (half) and the other interface are ignored.
    assert row.backlog_mean_bytes == pytest.approx(5000.0)
    assert row.backlog_p99_bytes == pytest.approx(9900.0)
    assert row.backlog_mean_packets == pytest.approx(5.0)
    assert row.drops == 5                          # 8 - 3 within the window
    assert row.mean_cwnd == pytest.approx(25.0)    # data connection only


def test_run_table_two_flows_over_the_all_flows_active_window(engine):
    rows = summary.run_table(engine)              # complete runs only, ordered by run_id
    assert [r.run_id for r in rows] == ["q-bbr-50", "q-reno-20"]
    bbr = rows[0]
    # spans [200, 290] and [250, 400] ms: the window is [250, 290] ms, where each flow sent 5 new segments
    assert bbr.window.rule == "all_flows_active"
    assert (bbr.window.start_ns - T0, bbr.window.length_ns) == (250 * MS, 40 * MS)
    assert bbr.flow_goodput_bps == pytest.approx((5 * MSS * 8 / 0.040,) * 2)
    assert bbr.goodput_bps == pytest.approx(10 * MSS * 8 / 0.040)
    assert bbr.drops == 0 and bbr.backlog_mean_bytes == pytest.approx(3000.0)   # counter flat in the window
    assert bbr.mean_cwnd == pytest.approx(75.0)                      # mean of per-flow means
    assert "all_flows_active" in summary.format_table(rows)          # the table says which window it used
    assert summary.csv_record(bbr)["window_s"] == pytest.approx(0.040)


def test_run_table_failed_run_by_id_and_unknown_id(engine):
    (failed,) = summary.run_table(engine, ["q-failed"])
    assert failed.goodput_bps == pytest.approx(5 * MSS * 8 / 0.040)
    assert failed.drops is None and math.isnan(failed.backlog_mean_bytes) and math.isnan(failed.mean_cwnd)
    with pytest.raises(KeyError):
        summary.run_table(engine, ["nope"])


def test_format_table_shows_every_run_and_its_numbers(engine):
    rows = summary.run_table(engine, ["q-reno-20", "q-bbr-50"])
    text = summary.format_table(rows)
    assert "\x1b[" not in text
    for r in rows:
        line = next(ln for ln in text.splitlines() if r.run_id in ln)
        assert f"{r.goodput_bps / 1e6:.2f}" in line
        assert summary.fmt_rate(r.rate_bit) in line
    assert "20 Mbit/s" in text and "50 Mbit/s" in text


# ---------------------------------------------------------------------------- report

def _images(page: str) -> list[Image.Image]:
    blobs = re.findall(r'<img [^>]*src="data:image/png;base64,([A-Za-z0-9+/=]+)"', page)
    return [Image.open(io.BytesIO(base64.b64decode(b))) for b in blobs]


def test_write_report_html_and_csv(engine, tmp_path):
    out = tmp_path / "out"
    path = write_report(engine, out, ["q-reno-20", "q-bbr-50"])
    assert path == out / "report.html"
    page = path.read_text()
    rows = summary.run_table(engine, ["q-reno-20", "q-bbr-50"])
    tbody = page[page.index("<tbody>"):page.index("</tbody>")]
    table_rows = re.findall(r"<tr>(.*?)</tr>", tbody, flags=re.S)
    assert len(table_rows) == 2
    for r, tr in zip(rows, table_rows, strict=True):
        assert r.run_id in tr and f"{r.goodput_bps / 1e6:.2f}" in tr and f"{r.goodput_ratio:.3f}" in tr
    # titles come from the run metadata
    assert "q-bbr-50" in page and "reno" in page
    images = _images(page)
    # throughput, backlog, queue delay, cwnd (one panel per run), then the CDF and the box plot
    assert len(images) == 6
    for i, img in enumerate(images):
        assert img.format == "PNG"
        w, h = img.size
        assert 400 <= w <= 3000 and 200 <= h <= 3000
        if i < 4:
            assert w > h                          # two runs side by side in one row
        assert len(img.convert("L").getcolors(maxcolors=1 << 16) or []) > 2   # not a blank canvas

    with (out / "runs.csv").open(newline="") as fh:
        recs = list(csv.DictReader(fh))
    assert [r["run_id"] for r in recs] == ["q-reno-20", "q-bbr-50"]
    for rec, r in zip(recs, rows, strict=True):
        assert float(rec["goodput_bps"]) == pytest.approx(r.goodput_bps)
        assert [float(x) for x in rec["flow_goodput_bps"].split(";")] == pytest.approx(r.flow_goodput_bps)
        assert int(rec["drops"]) == r.drops and rec["qdisc_handle"] == "1:"
    # a run's guard flags travel into the detail table's notes and the page: its numbers are suspect
    with (out / "tables" / "runs_detail.csv").open(newline="") as fh:
        notes = {rec["run_id"]: rec["notes"] for rec in csv.DictReader(fh)}
    assert f"run flag: {CPULOAD_FLAG}" in notes["q-bbr-50"]
    assert "run flag" not in notes["q-reno-20"]
    assert html.escape(f"run flag: {CPULOAD_FLAG}") in page
    assert "analysis window: all_flows_active" in " ".join(page.split())   # the page says which window


def test_every_table_says_which_window_its_columns_use(engine):
    results = [runstats.analyse(d) for d in load.iter_runs(engine, ["q-reno-20", "q-bbr-50"], detail=True)]
    tables = [*t.qdelay_tables(results), t.utilisation_table(results), t.convergence_table(results),
              t.runs_table(results), t.flows_table(results), *t.series_tables(results)]
    assert len(tables) >= 8
    for table in tables:
        assert "analysis window" in table.note or "whole run" in table.note, (table.name, table.note)


def test_run_series_bins_share_t0_and_show_the_retransmission_free_goodput(engine):
    from analysis.report import run_series
    with engine.connect() as conn:
        (meta,) = load.list_runs(conn, ["q-reno-20"])
        data = load.load_run(conn, meta)
    row = summary.summarise(data)
    s = run_series(data, row, bin_ns=100 * MS)
    (series,) = s.throughput.values()
    # 10 segments in [100, 200) ms and the 11th at exactly 200 ms (half-open bins).
    assert series.values.tolist() == pytest.approx([0.0, 10 * MSS * 8 / 0.1, MSS * 8 / 0.1])
    assert s.backlog_t_s[0] == pytest.approx(0.0) and s.backlog_bytes.max() == 50_000
    assert "reno" in s.title and "20 Mbit/s" in s.title and "1 flow" in s.title


def test_empty_report_still_writes_files(tmp_path):
    eng = sa.create_engine("sqlite://")
    T.metadata.create_all(eng)
    path = write_report(eng, tmp_path)
    assert "<tbody>\n\n</tbody>" in path.read_text()
    assert (tmp_path / "runs.csv").read_text().startswith("run_id,")


def _meta(spec: RunSpec | None, params: dict | None = None) -> runmeta.RunMeta:
    return runmeta.RunMeta(run_id="r", status="complete", params=params or {}, t0_ns=T0, duration_s=1.0, spec=spec)


def test_the_bottleneck_rate_is_the_derived_one_else_the_shaper_on_the_bottleneck_link():
    from orchestrator.plan import expand, load_plan

    [one_cell] = expand(load_plan(Path(__file__).resolve().parents[2] / "experiments" / "vm" / "dctcp.yaml"))[:1]
    assert "rate_bit" not in one_cell.params and one_cell.derived.bottleneck_rate_bit   # the rate is not varied
    assert _meta(one_cell).rate_bit == one_cell.derived.bottleneck_rate_bit
    shaped = RunSpec.model_validate(spec("r", "reno", 20_000_000, [5201]))   # no bottleneck section: an htb chain
    assert shaped.derived.bottleneck_rate_bit is None and _meta(shaped).rate_bit == 20_000_000
    assert _meta(None).rate_bit is None


def test_the_base_rtt_comes_from_the_run_s_own_expansion():
    from orchestrator.plan import expand, load_plan

    [one_cell] = expand(load_plan(Path(__file__).resolve().parents[2] / "experiments" / "vm" / "dctcp.yaml"))[:1]
    assert one_cell.derived.base_rtt_us == 20_000           # netem 20 ms holds the whole RTT
    assert _meta(one_cell).base_rtt_s == pytest.approx(0.020)
    assert _meta(RunSpec.model_validate(spec("r", "reno", 10**7, [5201]))).base_rtt_s is None   # none stated
    assert _meta(None).base_rtt_s is None


def test_what_the_run_spec_says_about_flows_cc_aqm_and_windows():
    s = RunSpec.model_validate(spec("r", "reno", 10**7, [5201, 5202]))
    meta = _meta(s)
    assert (meta.flows, meta.cc, meta.aqm) == (2, "reno", "pfifo")     # the chain's leaf below the htb
    assert (meta.capture_point, meta.bottleneck) == ("aqm:to-client", LinkRef(host="aqm", toward="client"))
    assert meta.sender_point("server") == "server:to-aqm"
    assert meta.analysis.window == "all_flows_active" and meta.analysis.warmup_s == 0.0
    red = {"kind": "red", "mode": "ramp", "min": "1ms"}
    assert _meta(s, {"queue": red}).aqm == "red-ramp" and _meta(s, {"aqm": "fq_codel"}).aqm == "fq_codel"
    empty = _meta(None)
    assert (empty.flows, empty.cc, empty.aqm, empty.capture_point) == (None, "", "–", None)
