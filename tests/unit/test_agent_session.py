"""The sans-I/O agent session: authentication, op/field validation and coded errors, no sockets."""
from __future__ import annotations

import json

from agents.session import AgentSession, Dispatch
from schemas import handshake, protocol

TOKEN = b"secret-token"


MANAGER_NONCE = "cd" * 32


def hello(session: AgentSession, token: bytes = TOKEN, req_id: int = 1, binding: str = "",
          client: str = "t") -> Dispatch | str:
    mac = handshake.manager_proof(token, session.nonce_hex, MANAGER_NONCE, binding)
    return session.receive(json.dumps({"id": req_id, "op": "hello", "args": {
        "client": client, "nonce": MANAGER_NONCE, "hmac": mac}}))


def error_of(reply) -> dict:
    assert isinstance(reply, str), reply
    return json.loads(reply)["error"]


def test_greeting_carries_a_fresh_nonce():
    a, b = AgentSession(TOKEN), AgentSession(TOKEN)
    ga, gb = json.loads(a.greeting()), json.loads(b.greeting())
    assert ga["event"] == "challenge" and len(ga["data"]["nonce"]) == 64
    assert ga["data"]["nonce"] != gb["data"]["nonce"]


def test_hello_with_the_right_hmac_authenticates():
    s = AgentSession(TOKEN)
    out = hello(s)
    assert isinstance(out, Dispatch) and out.op == "hello" and s.authenticated and s.peer == "t"


def test_hello_with_a_wrong_token_is_refused_and_closes():
    s = AgentSession(TOKEN)
    err = error_of(hello(s, token=b"other"))
    assert err["code"] == "unauthenticated" and err["field"] == "hmac"
    assert s.closed and not s.authenticated


def test_ops_before_hello_are_refused():
    s = AgentSession(TOKEN)
    err = error_of(s.receive(json.dumps({"id": 7, "op": "apply", "args": {"run_id": "r", "state": {}}})))
    assert err["code"] == "unauthenticated"


def test_unknown_op_and_malformed_frames():
    s = AgentSession(TOKEN)
    assert error_of(s.receive(json.dumps({"id": 1, "op": "shell", "args": {"cmd": "rm"}})))["code"] == "unknown_op"
    assert error_of(s.receive("{"))["code"] == "bad_request"
    assert error_of(s.receive(b"\x00"))["code"] == "bad_request"
    assert error_of(s.receive("[1, 2]"))["code"] == "bad_request"


def test_schema_errors_name_op_and_field():
    s = AgentSession(TOKEN)
    hello(s)
    bad_rate = {"id": 2, "op": "apply", "args": {"run_id": "r", "state": {"interfaces": {
        "to-client": {"qdiscs": [{"kind": "htb", "rate_bit": -5}]}}}}}
    err = error_of(s.receive(json.dumps(bad_rate)))
    assert err["code"] == "invalid_args"
    assert err["field"] == "state.interfaces.to-client.qdiscs.0.rate_bit"
    assert err["message"].startswith("apply: ")
    extra = {"id": 3, "op": "schedule", "args": {"run_id": "r", "tasks": [
        {"kind": "capture", "task_id": "c", "start_ns": 1, "stop_ns": 2, "interface": "x", "argv": ["sh"]}]}}
    err = error_of(s.receive(json.dumps(extra)))
    assert err["code"] == "invalid_args" and err["field"] == "tasks.0.argv"


def test_shell_metacharacters_in_a_cc_name_are_rejected():
    s = AgentSession(TOKEN)
    hello(s)
    task = {"kind": "iperf3_client", "task_id": "c", "start_ns": 1, "port": 5201, "dst_addr": "10.0.0.1",
            "cc": "cubic; reboot", "duration_s": 1}
    err = error_of(s.receive(json.dumps({"id": 4, "op": "schedule", "args": {"run_id": "r", "tasks": [task]}})))
    assert err["code"] == "invalid_args" and err["field"] == "tasks.0.cc"


def test_valid_ops_become_typed_dispatches():
    s = AgentSession(TOKEN)
    hello(s)
    out = s.receive(json.dumps({"id": 5, "op": "collect", "args": {"run_id": "r"}}))
    assert isinstance(out, Dispatch) and isinstance(out.args, protocol.CollectArgs)
    assert out.args.timeout_s == 120
    assert isinstance(s.receive(json.dumps({"id": 6, "op": "bye"})), Dispatch) and s.closed
