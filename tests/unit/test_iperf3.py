"""orchestrator.ingest.iperf3 on real iperf3 3.12 -J output (tests/fixtures/ingest/capture_fixtures.sh).

iperf3_client.json / iperf3_server.json: one test, `-t 1 -i 0.1 -b 8M -C cubic` (its packets are in
eth.pcap); *_P2: two parallel streams (-P 2, -i 0.2); *_R: reverse mode with reno (the server sends);
iperf3_client_refused.json: a client pointed at a port with no listener. iperf3_client_warning.json: a client
(iperf3 3.12 in a UML lab host, 6 s of RED-ECN traffic) whose control connection broke while the results were
exchanged, so iperf3 printed a WARNING line before its JSON and the document carries an error.
"""
from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

from orchestrator.ingest.iperf3 import Iperf3FormatError, parse_iperf3
from orchestrator.ingest.pcap import read_pcap
from orchestrator.storage import addr

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "ingest"


def load(name: str):
    return parse_iperf3((FIX / name).read_text())


def test_client_sender_run():
    r = load("iperf3_client.json")
    assert (r.role, r.sender, r.reverse, r.protocol, r.version) == ("client", True, False, "TCP", "iperf 3.12")
    assert (r.sender_cc, r.receiver_cc, r.error, r.ok) == ("cubic", "cubic", None, True)
    (s,) = r.streams
    assert (s.local_host, s.local_port, s.remote_host, s.remote_port) == ("10.198.1.1", 40064, "10.198.1.2", 5299)
    assert s.sender_port == 40064
    assert (s.bytes_sent, s.bytes_received, s.retransmits) == (1048576, 1048576, 0)
    assert (s.max_snd_cwnd_bytes, s.min_rtt_us, s.mean_rtt_us, s.max_rtt_us) == (220096, 49, 187, 260)
    assert (r.bytes_sent, r.bytes_received, r.retransmits, r.start_unix_s) == (1048576, 1048576, 0, 1795241021)
    iv = r.intervals
    assert iv.size == 10 and (iv["stream_port"] == 40064).all()
    assert iv[0].tolist() == (40064, 0.0, 0.100078, 131072, 10477587.31232865, 0, 127424, 49)
    np.testing.assert_allclose(iv["start_s"][1:], iv["end_s"][:-1])
    assert iv["bytes"].sum() == r.bytes_sent


def test_server_receiver_run_knows_only_its_side():
    r = load("iperf3_server.json")
    assert (r.role, r.sender, r.reverse, r.sender_cc, r.receiver_cc) == ("server", False, False, None, "cubic")
    (s,) = r.streams
    assert (s.local_port, s.remote_port, s.sender_port) == (5299, 40064, 40064)   # same key as the client
    # iperf3 prints 0 for what a receiving server cannot know; the parser says "unknown".
    assert (s.bytes_sent, s.bytes_received, s.retransmits, s.max_snd_cwnd_bytes) == (None, 1048576, None, None)
    assert (r.bytes_sent, r.bytes_received, r.retransmits) == (None, 1048576, None)
    assert r.intervals.tolist() == [(40064, 0.0, 1.000188, 1048576, 8387031.2964093164, -1, -1, -1)]


def test_parallel_streams_are_kept_apart():
    client, server = load("iperf3_client_P2.json"), load("iperf3_server_P2.json")
    ports = [s.sender_port for s in client.streams]
    assert ports == [40080, 40088] == [s.sender_port for s in server.streams]
    iv = client.intervals
    assert iv.size == 10 and list(iv["stream_port"][:4]) == [40080, 40088, 40080, 40088]
    for s in client.streams:
        assert iv["bytes"][iv["stream_port"] == s.sender_port].sum() == s.bytes_sent == 524288
    assert client.bytes_sent == 1048576 and server.bytes_received == 1048576


def test_reverse_mode_sender_is_the_server():
    client, server = load("iperf3_client_R.json"), load("iperf3_server_R.json")
    assert (client.sender, client.reverse, client.sender_cc) == (False, True, "reno")
    assert (server.sender, server.reverse, server.sender_cc, server.role) == (True, True, "reno", "server")
    (c,), (s,) = client.streams, server.streams
    assert c.sender_port == s.sender_port == 5299
    # The client learns the server's byte/retransmit counts but not its cwnd/RTT (printed as 0).
    assert (c.bytes_sent, c.retransmits, c.max_snd_cwnd_bytes, c.mean_rtt_us) == (524288, 0, None, None)
    assert (s.bytes_sent, s.bytes_received, s.max_snd_cwnd_bytes, s.mean_rtt_us) == (524288, None, 163624, 116)
    assert (client.intervals["retransmits"] == -1).all() and (client.intervals["rtt_us"] == -1).all()
    assert server.intervals["snd_cwnd"].tolist() == [163624]


def test_connection_refused_is_an_error_value():
    r = load("iperf3_client_refused.json")
    assert r.error == "unable to connect to server: Connection refused" and not r.ok
    assert (r.role, r.sender, r.streams, r.intervals.size, r.bytes_sent) == (None, None, (), 0, None)


def test_stream_ports_match_the_packet_capture():
    pkts = read_pcap(FIX / "eth.pcap")
    (s,) = load("iperf3_client.json").streams
    data = pkts[(pkts["src_port"] == s.sender_port) & (pkts["payload_len"] > 0)]
    # The data connection opens with iperf3's 37-byte cookie; no retransmissions in this run.
    assert data["payload_len"][0] == 37 and data["payload_len"].sum() == s.bytes_sent + 37
    assert set(addr.format_column(data["ipv"], data["src_addr"])) == {s.local_host}


def test_a_warning_printed_before_the_document_is_kept_apart_and_the_document_parsed():
    r = load("iperf3_client_warning.json")
    assert r.warnings == ("WARNING:  Size of data read does not correspond to offered length",)
    assert r.error == "unable to receive results: Resource temporarily unavailable" and not r.ok
    assert r.streams[0].sender_port == 56108 and r.intervals.size == 59
    from agents.tasks import iperf3_json_error

    assert iperf3_json_error((FIX / "iperf3_client_warning.json").read_bytes()) == (r.error, True)


@pytest.mark.parametrize("text", ["", "iperf3: error - unable to connect", "[1, 2]", '{"intervals": []}',
                                  "WARNING: one\nWARNING: two\n"])
def test_not_iperf3_json(text):
    with pytest.raises(Iperf3FormatError):
        parse_iperf3(text)


def test_the_agent_sees_a_refused_connection_that_iperf3_exits_0_for():
    from agents.tasks import iperf3_json_error
    assert iperf3_json_error((FIX / "iperf3_client_refused.json").read_bytes()) == (
        "unable to connect to server: Connection refused", False)
    assert iperf3_json_error((FIX / "iperf3_client.json").read_bytes()) == (None, True)
    assert iperf3_json_error(b"iperf3: error - not json") == (None, False)
    # `iperf3 -s -1 -p P` killed 1.2 s into `iperf3 -c 127.0.0.1 -p P -t 3 -i 0.5 -J -b 10M` (exit code 0)
    assert iperf3_json_error((FIX / "iperf3_client_server_killed.json").read_bytes()) == (
        "the server has terminated", True)


@pytest.mark.skipif(shutil.which("iperf3") is None, reason="needs iperf3")
def test_a_client_that_never_connected_fails_its_task(tmp_path):
    """A real iperf3 client toward a loopback port with no listener: exit code 0, but the task fails."""
    import asyncio
    import socket
    import time

    from agents.tasks import make_runner
    from schemas import protocol

    with socket.socket() as s:              # a port that was free a moment ago, with nothing listening
        s.bind(("127.0.0.1", 0))
        port = max(1024, s.getsockname()[1])
    now = time.time_ns()
    runner = make_runner(protocol.Iperf3ClientTask(task_id="c", start_ns=now,
                                                   port=port, dst_addr="127.0.0.1", cc="reno", duration_s=1),
                         tmp_path)
    asyncio.run(runner.run())
    assert runner.state == "failed"
    assert runner.detail.endswith(f"iperf3 -c 127.0.0.1 -p {port}: unable to connect to server: Connection refused")


def test_a_refused_connection_is_retried_only_early_and_only_before_sending() -> None:
    """Literal output of iperf3 3.12 -J in a TCG guest whose server was not listening yet at the flow's start
    (LS-AIMD 3B on the VM lab, 8 servers starting together)."""
    from agents.tasks import CONNECT_GRACE_NS, iperf3_json_error, retry_connect

    error, sent = iperf3_json_error((FIX.parent / "iperf3" / "client-refused-tcg.json").read_bytes())
    assert error == "unable to connect to server: Connection refused" and not sent
    assert retry_connect(error, sent, 200_000_000)
    assert not retry_connect(error, sent, CONNECT_GRACE_NS)          # too late: the run fails naming it
    assert not retry_connect(error, True, 200_000_000)               # it sent: a remark, not a second flow
    assert not retry_connect("unable to connect to server: No route to host", False, 0)


def test_a_client_waits_for_its_syn_retransmissions_before_it_gives_up() -> None:
    """Literal output of iperf3 3.12 -J in a UML lab host: the 8th of 8 staggered Reno flows (LS-AIMD 3A) joined
    a RED-ECN queue whose average sat above its maximum, which drops every SYN (not ECN-capable), and gave up
    after the 3 s it was then allowed: a run failed. The timeout now covers the SYN retransmissions at 1, 3, 7
    and 15 s for flows long enough to afford them."""
    from agents.tasks import iperf3_json_error, retry_connect
    from schemas.tasks import iperf3_connect_timeout_ms

    error, sent = iperf3_json_error((FIX.parent / "iperf3" / "client-syn-timeout-uml.json").read_bytes())
    assert error == "unable to connect to server: Connection timed out" and not sent
    assert not retry_connect(error, sent, 0)          # a timeout is not a server that was not listening yet
    assert [iperf3_connect_timeout_ms(d) for d in (5, 12, 40, 600)] == [3_000, 6_000, 20_000, 30_000]


def test_a_client_json_the_parser_refuses_leaves_its_flow_without_a_port_not_the_run_without_rows(tmp_path):
    """The engine writes the flow rows from the clients' JSON before the ingest judges the artifacts: a document
    the parser refuses must not end the run there (the ingest then stores the run failed, naming the file)."""
    from orchestrator.ingest.assemble import sender_ports
    from orchestrator.plan import expand, load_plan

    spec = expand(load_plan(Path(__file__).resolve().parents[2] / "experiments" / "quickstart.yaml"))[1]
    (tmp_path / "server").mkdir()
    good, bad = spec.flows[0], spec.flows[1]
    shutil.copy(FIX / "iperf3_client_warning.json", tmp_path / good.src / f"iperf3-client-{good.port}.json")
    (tmp_path / bad.src / f"iperf3-client-{bad.port}.json").write_text("iperf3: interrupt - the client has terminated")
    assert sender_ports(tmp_path, spec) == {good.flow_id: 56108, bad.flow_id: None}
