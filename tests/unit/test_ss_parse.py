"""orchestrator/ingest/ss.py on literal `ss -tinH` output (tests/fixtures/ss/capture_ss.sh, iproute2 6.1,
a real cubic / bbr / reno / IPv6 transfer through an htb 50 Mbit/s bottleneck) plus the DCTCP lines
constructed in the documented iproute2 format (this kernel has no tcp_dctcp; see the fixture header)."""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from orchestrator.ingest.ss import SsFormatError, parse_ss, parse_ss_with_stats
from orchestrator.storage import records

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "ss"


def rows(name: str) -> np.ndarray:
    return parse_ss((FIX / name).read_text())


def data_socket(arr: np.ndarray) -> np.ndarray:
    """The iperf3 data stream (the control connection sends ~200 bytes)."""
    return arr[arr["bytes_sent"] > 100_000]


@pytest.mark.parametrize("name, cc", [("ss_cubic.txt", "cubic"), ("ss_bbr.txt", "bbr"), ("ss_reno.txt", "reno"),
                                      ("ss_cubic_v6.txt", "cubic")])
def test_every_poll_and_socket_is_read(name: str, cc: str) -> None:
    arr, stats = parse_ss_with_stats((FIX / name).read_text())
    assert arr.dtype == records.SS_SAMPLE
    assert (stats.polls, stats.empty_polls) == (10, 1)       # the last poll came after the transfer ended
    assert arr.size == 18                                     # 9 polls x (control + data connection)
    assert 0 < stats.max_span_ns < 50_000_000
    assert np.all(np.diff(arr["ts_ns"]) >= 0)
    data = data_socket(arr)
    assert data.size >= 8 and set(data["cc"]) == {cc}
    assert set(arr["cc"]) <= {cc, "bbr"}                     # control connection: the namespace default (bbr)
    assert np.all(data["cwnd"] > 2) and np.all(data["mss"] >= 1428)
    assert np.all(data["rtt_us"] > 0) and np.all(data["rttvar_us"] >= 0) and np.all(data["minrtt_us"] > 0)
    assert np.all(data["pacing_rate_bit"] > 0) and np.all(data["delivery_rate_bit"] > 0)
    assert np.all(np.diff(data["bytes_acked"]) > 0)
    assert np.all(data["retrans_total"][-1] >= data["retrans_total"])  # life-long counter only grows
    assert np.all(np.isnan(arr["dctcp_alpha"])) and np.all(arr["dctcp_ab_tot"] == -1)


def test_first_cubic_poll_literal_values() -> None:
    """The data socket of the first poll of ss_cubic.txt, field by field against the text."""
    arr = rows("ss_cubic.txt")
    first = arr[(arr["ts_ns"] == arr["ts_ns"][0]) & (arr["sport"] == 59344)][0]
    assert first["ts_ns"] == (1795245920515242145 + 1795245920522008141) // 2
    assert (first["saddr"], first["sport"], first["daddr"], first["dport"]) == ("10.198.2.1", 59344,
                                                                                "10.198.3.2", 5311)
    got = {n: first[n].item() for n in ("cwnd", "ssthresh", "rtt_us", "rttvar_us", "minrtt_us", "bytes_sent",
                                        "bytes_retrans", "bytes_acked", "unacked", "retrans", "retrans_total",
                                        "delivered", "pacing_rate_bit", "delivery_rate_bit", "lost")}
    assert got == {"cwnd": 23, "ssthresh": 22, "rtt_us": 5025, "rttvar_us": 469, "minrtt_us": 9,
                   "bytes_sent": 689285, "bytes_retrans": 4344, "bytes_acked": 658878, "unacked": 18,
                   "retrans": 0, "retrans_total": 3, "delivered": 457, "pacing_rate_bit": 63614472,
                   "delivery_rate_bit": 41293808, "lost": 0}
    assert first["cc"] == "cubic" and first["bbr_bw_bit"] == -1 and math.isnan(first["bbr_pacing_gain"])


def test_bbr_fields() -> None:
    arr = rows("ss_bbr.txt")
    data = data_socket(arr)
    assert np.all(data["bbr_bw_bit"] > 0) and np.all(data["bbr_mrtt_us"] >= 0)
    assert set(np.round(data["bbr_cwnd_gain"], 5)) <= {2.0, 2.88672}
    assert set(np.round(data["bbr_pacing_gain"], 5)) <= {0.75, 1.0, 1.25, 2.88672, 0.34657}
    # the control connection never lost anything: ss omits ssthresh -> NULL (-1)
    assert np.all(arr[arr["bytes_sent"] < 1000]["ssthresh"] == -1)


def test_ipv6_addresses() -> None:
    arr = rows("ss_cubic_v6.txt")
    assert set(arr["saddr"]) == {"fd00:198:2::1"} and set(arr["daddr"]) == {"fd00:198:3::2"}
    assert set(arr["dport"]) == {5314}


def test_dctcp_alpha_is_a_fraction_of_1024() -> None:
    arr = rows("ss_dctcp_constructed.txt")
    assert list(arr["cc"]) == ["dctcp", "dctcp"]
    ecn, fallback = arr[0], arr[1]
    assert ecn["dctcp_alpha"] == 512 / 1024 == 0.5
    assert (ecn["dctcp_ab_ecn"], ecn["dctcp_ab_tot"]) == (65160, 130320)
    assert (ecn["cwnd"], ecn["ssthresh"], ecn["retrans_total"]) == (30, 21, 8)
    assert math.isnan(fallback["dctcp_alpha"]) and fallback["dctcp_ab_tot"] == -1


@pytest.mark.parametrize("alpha, want", [("0", 0.0), ("1024", 1.0), ("100", 100 / 1024)])
def test_dctcp_alpha_range(alpha: str, want: float) -> None:
    text = (FIX / "ss_dctcp_constructed.txt").read_text().replace("alpha:512", f"alpha:{alpha}")
    assert parse_ss(text)[0]["dctcp_alpha"] == want


def test_mapped_and_scoped_addresses() -> None:
    text = ("@ 10 20\nESTAB 0 0 [::ffff:10.0.0.1]:40000 [fe80::1%veth0]:5201\n"
            "\t cubic rtt:1.5/0.75 cwnd:10 send 1000bps\n")
    r = parse_ss(text)[0]
    assert (r["saddr"], r["daddr"], r["ts_ns"], r["rtt_us"], r["rttvar_us"]) == ("10.0.0.1", "fe80::1", 15, 1500, 750)
    assert r["pacing_rate_bit"] == -1 and r["ssthresh"] == -1 and r["retrans_total"] == 0


def test_empty_artifact_and_comment_only() -> None:
    arr, stats = parse_ss_with_stats("# ss -tinH ( dport = :5201 )\n")
    assert arr.size == 0 and stats.polls == 0


@pytest.mark.parametrize("text, why", [
    ("ESTAB 0 0 1.2.3.4:1 5.6.7.8:2\n\t cubic cwnd:1\n", "before the first"),
    ("@ 1 2\nESTAB 0 0 1.2.3.4:1 5.6.7.8:2\n@ 3 4\n", "without its info line"),
    ("@ 1 2\n\t cubic cwnd:1\n", "info line without"),
    ("@ 1 2\nESTAB 0 0 1.2.3.4:1 5.6.7.8:2\n\t cubic cwnd:10 pacing_rate 53.0Mbps\n", "not in bit/s"),
    ("@ 1 x\n", "bad poll line"),
    ("@ 1 2\nESTAB 0 0 1.2.3.4 5.6.7.8:2\n\t cubic\n", "bad endpoint"),
    # literal, from a Debian 6.1 guest before tcp_diag was loaded there: ss fell back to /proc/net/tcp
    ("@ 1 2\nESTAB 0      0      10.199.2.1:33866 10.199.1.1:5201 rto:0.36 ato:0.04 qack:15 bidir cwnd:10 "
     "reordering:0\n", "no tcp_diag"),
])
def test_refuses_what_it_does_not_understand(text: str, why: str) -> None:
    with pytest.raises(SsFormatError, match=why):
        parse_ss(text)


def test_a_connecting_socket_has_no_rtt_yet() -> None:
    """A poll can catch a flow's socket in SYN-SENT (seen in the lab): ss prints no rtt (tcpi_rtt is 0 until
    the first sample), so the row holds NULL there, not a made-up value."""
    [row] = rows("ss_syn_sent.txt")
    assert (row["sport"], row["dport"], row["cwnd"], row["cc"]) == (36252, 5201, 10, "bbr")
    assert row["rtt_us"] == -1                      # SS_NULLABLE: stored as NULL
