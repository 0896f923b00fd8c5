"""Issue 13, items 4, 5, 6, 9 as pure decisions (no sockets, no root): the connection table and failed-hello
budgets before authentication, run ownership between sessions, the mutual hello and the session's own
pre-authentication limits."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from agents.admission import Admission, LogBudget, PreAuthLimits, TokenBucket
from agents.ownership import RunOwnership, SessionId
from agents.session import AgentSession, Dispatch
from schemas import handshake, limits, protocol

TOKEN = b"secret-token"
NONCE = "cd" * 32


def hello_frame(session: AgentSession, token: bytes = TOKEN, binding: str = "", client: str = "mgr",
                nonce: str = NONCE) -> str:
    mac = handshake.manager_proof(token, session.nonce_hex, nonce, binding)
    return json.dumps({"id": 1, "op": "hello", "args": {"client": client, "nonce": nonce, "hmac": mac}})


def error_of(reply) -> dict:
    assert isinstance(reply, str), reply
    return json.loads(reply)["error"]


# ---------------------------------------------------------------- connection table
def test_the_cap_holds_and_evicts_the_oldest_unauthenticated_connection_never_an_authenticated_one():
    adm = Admission(PreAuthLimits(max_connections=4, max_unauthenticated_per_peer=4))
    assert adm.admit("manager", "10.0.0.1").accepted
    adm.authenticated("manager")
    for i in range(3):
        assert adm.admit(f"idle{i}", f"10.0.1.{i}").evict == []
    flood = [adm.admit(f"new{i}", f"10.0.2.{i}") for i in range(100)]
    assert all(d.accepted for d in flood) and adm.open_connections() == 4
    assert flood[0].evict == ["idle0"] and flood[3].evict == ["new0"]
    assert "manager" not in [k for d in flood for k in d.evict]


def test_one_peer_cannot_push_out_another_peers_connection():
    adm = Admission(PreAuthLimits(max_connections=64, max_unauthenticated_per_peer=8))
    adm.admit("manager-handshaking", "10.0.0.1")              # not yet authenticated
    evicted = [k for i in range(10_000) for k in adm.admit(f"a{i}", "10.6.6.6").evict]
    assert "manager-handshaking" not in evicted and adm.open_connections() == 9


def test_with_every_slot_authenticated_a_new_connection_is_refused():
    adm = Admission(PreAuthLimits(max_connections=2))
    for k in ("m1", "m2"):
        adm.admit(k, "10.0.0.1")
        adm.authenticated(k)
    decision = adm.admit("m3", "10.0.0.2")
    assert not decision.accepted and "cap is 2" in decision.reason
    adm.closed("m1")
    assert adm.admit("m3", "10.0.0.2").accepted


# ---------------------------------------------------------------- failed hellos
def test_failed_hellos_are_budgeted_per_peer_and_in_total():
    adm = Admission(PreAuthLimits(failed_hello_burst_per_peer=5, failed_hello_rate_per_peer=0.5,
                                  failed_hello_burst_total=8, failed_hello_rate_total=0.1))
    now = 1000.0
    for _ in range(5):
        assert adm.hello_refusal("10.6.6.6", now) is None
        adm.hello_failed("10.6.6.6", now)
    assert "from 10.6.6.6: retry in 2 s" in adm.hello_refusal("10.6.6.6", now)
    assert adm.hello_refusal("10.0.0.1", now) is None          # another peer still may
    assert adm.hello_refusal("10.6.6.6", now + 2) is None      # refilled at 0.5/s
    for i in range(3):
        adm.hello_failed(f"10.7.0.{i}", now + 2)
    assert "on this agent" in adm.hello_refusal("10.0.0.1", now + 2)   # the total budget is spent


def test_guessing_at_full_speed_gets_at_most_the_budget_checked():
    adm, checked, now = Admission(), 0, 0.0
    for _ in range(220 * 60):                                   # the reported 220 guesses/s, for a minute
        now += 1 / 220
        if adm.hello_refusal("10.6.6.6", now) is None:
            checked += 1
            adm.hello_failed("10.6.6.6", now)
    lim = adm.limits
    assert checked <= lim.failed_hello_burst_per_peer + 60 * lim.failed_hello_rate_per_peer + 1
    print(f"\nguessing at 220/s for 60 s: {checked} guesses checked (was 13,200)")


def test_per_peer_buckets_are_bounded():
    adm = Admission(PreAuthLimits(max_tracked_peers=100))
    for i in range(10_000):
        adm.hello_failed(f"10.{i // 65536}.{i // 256 % 256}.{i % 256}", float(i))
    assert len(adm._peer_buckets) <= 100


def test_token_bucket_refills_to_its_burst_only():
    b = TokenBucket(burst=2, rate=1, at=0)
    b.take(0)
    b.take(0)
    assert not b.available(0.5) and b.available(1.0) and b.full(100) and b.tokens == 2


def test_the_log_budget_reports_what_it_held_back():
    budget, logged = LogBudget(lines=3, window_s=10), 0
    for i in range(1000):
        allowed, _ = budget.allow(i * 0.001)
        logged += allowed
    assert logged == 3 and budget.suppressed == 997
    assert budget.allow(10.5) == (True, 997)


# ---------------------------------------------------------------- the session before hello
def test_frames_before_hello_are_small_and_few():
    s = AgentSession(TOKEN)
    err = error_of(s.receive("x" * (64 * 1024 + 1)))
    assert err["code"] == "bad_request" and "before hello" in err["message"]
    for _ in range(PreAuthLimits().max_frames_before_hello - 1):
        s.receive("{}")
    err = error_of(s.receive("{}"))
    assert s.closed and "frames before hello" in err["message"] and "frames before hello" in s.close_reason


def test_after_hello_large_frames_are_allowed_again():
    s = AgentSession(TOKEN)
    assert isinstance(s.receive(hello_frame(s)), Dispatch)
    big = json.dumps({"id": 2, "op": "clock", "args": {"t1_ns": 1}, "pad": "x" * 100_000})
    assert "exceeds" not in error_of(s.receive(big))["message"]   # schema error, not the size


# ---------------------------------------------------------------- mutual authentication
def test_the_agent_proves_the_token_back_over_both_nonces():
    s = AgentSession(TOKEN)
    assert isinstance(s.receive(hello_frame(s)), Dispatch)
    assert s.proof == handshake.agent_proof(TOKEN, s.nonce_hex, NONCE)
    # a direction label: the manager's proof is not the agent's, so neither can be reflected as the other
    assert s.proof != handshake.manager_proof(TOKEN, s.nonce_hex, NONCE)


def test_a_proof_for_another_tls_channel_is_refused():
    ours, relays = "11" * 32, "22" * 32
    s = AgentSession(TOKEN, channel_binding=ours)
    err = error_of(s.receive(hello_frame(s, binding=relays)))
    assert err["code"] == "unauthenticated" and err["field"] == "hmac" and s.closed and s.hello_failed
    s = AgentSession(TOKEN, channel_binding=ours)
    assert isinstance(s.receive(hello_frame(s, binding=ours)), Dispatch)


def test_a_manager_nonce_that_repeats_the_agents_is_refused():
    s = AgentSession(TOKEN)
    err = error_of(s.receive(hello_frame(s, nonce=s.nonce_hex)))
    assert err["code"] == "invalid_args" and err["field"] == "nonce"


def test_a_spent_failed_hello_budget_refuses_without_checking_the_proof():
    s = AgentSession(TOKEN, hello_gate=lambda: "too many failed hellos from 10.6.6.6: retry in 2 s")
    err = error_of(s.receive(hello_frame(s)))                  # even the right proof is not looked at
    assert err["code"] == "busy" and err["field"] == "hmac" and s.closed and not s.authenticated
    assert not s.hello_failed


@pytest.mark.parametrize("client", ["mgr\n2026-01-01 INFO forged line", "a b", "", "x" * 65, "\x1b[31m", "-x"])
def test_a_client_name_cannot_forge_a_log_line(client):
    s = AgentSession(TOKEN)
    err = error_of(s.receive(hello_frame(s, client=client)))
    assert err["code"] == "invalid_args" and err["field"] == "client"


def test_client_names_in_use_fit_the_pattern():
    for client in ("tcplab-manager", "tcplab-lab", "test", "mgr@host-1.lab:2"):
        protocol.HelloArgs(client=client, nonce=NONCE, hmac="0" * 64)


# ---------------------------------------------------------------- schedules
def _task(task_id: str) -> dict:
    return {"kind": "cpu_load", "task_id": task_id, "start_ns": 1, "stop_ns": 2}


def _schedule(tasks: list[dict]) -> str:
    s = AgentSession(TOKEN)
    s.receive(hello_frame(s))
    return s.receive(json.dumps({"id": 2, "op": "schedule", "args": {"run_id": "r1", "tasks": tasks}}))


def test_duplicate_task_ids_in_one_schedule_are_refused_naming_the_second():
    err = error_of(_schedule([_task("a"), _task("b"), _task("a")]))
    assert err == {"code": "invalid_args", "field": "tasks.2.task_id",
                   "message": "schedule: task id 'a' is given twice: two tasks would write one file"}


def test_more_tasks_than_the_limit_are_refused_naming_the_field():
    err = error_of(_schedule([_task(f"t{i}") for i in range(limits.MAX_TASKS_PER_SCHEDULE + 1)]))
    assert err["code"] == "invalid_args" and err["field"] == "tasks" and "512" in err["message"]
    assert isinstance(_schedule([_task(f"t{i}") for i in range(limits.MAX_TASKS_PER_SCHEDULE)]), Dispatch)


# ---------------------------------------------------------------- run ownership
FIRST, SECOND = SessionId(1, "manager-a", "10.0.0.1"), SessionId(2, "manager-b", "10.0.0.2")


def test_another_session_cannot_touch_the_owners_run():
    own = RunOwnership()
    assert own.refusal("schedule", FIRST, None) is None
    own.after("schedule", FIRST)
    for op in ("stop", "collect", "status", "schedule", "apply", "reset"):
        refusal = own.refusal(op, SECOND, "r1")
        assert refusal is not None and refusal.code == "busy" and refusal.field == "run_id"
        assert "run r1 is owned by session #1 ('manager-a' from 10.0.0.1)" in refusal.message
    assert own.refusal("clock", SECOND, "r1") is None and own.refusal("hello", SECOND, "r1") is None
    assert own.refusal("stop", FIRST, "r1") is None


def test_when_the_owner_is_gone_a_new_session_takes_over_and_can_reset():
    own = RunOwnership()
    own.after("apply", FIRST)
    assert not own.disconnected(SECOND)                        # not the owner: nothing changes
    assert own.disconnected(FIRST)
    assert own.refusal("reset", SECOND, "r1") is None
    assert "took over from session #1" in own.after("reset", SECOND)
    assert own.refusal("status", FIRST, "r1") is not None      # the old session, were it back, is refused


def test_status_does_not_make_a_monitor_the_owner():
    own = RunOwnership()
    own.after("status", SECOND)
    assert own.owner is None and own.refusal("apply", FIRST, None) is None


# ---------------------------------------------------------------- the token file
@pytest.mark.parametrize("content", [b"", b"\n  \n"])
def test_an_empty_token_file_stops_the_agent_naming_the_file(tmp_path, content):
    token = tmp_path / "token"
    token.write_bytes(content)
    proc = subprocess.run([sys.executable, "-m", "agents", "--name", "x", "--listen", f"unix:{tmp_path}/a.sock",
                           "--token-file", str(token), "--artifacts", str(tmp_path / "art")],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0 and f"--token-file {token}: the file is empty" in proc.stderr
    assert not (tmp_path / "a.sock").exists() and not (tmp_path / "art").exists()


def test_the_websockets_log_is_bounded_and_loses_only_peer_caused_tracebacks():
    import logging

    from agents.connections import BoundedLogFilter

    now = [0.0]
    f = BoundedLogFilter(LogBudget(lines=20, window_s=10), clock=lambda: now[0])

    def record(msg: str) -> logging.LogRecord:
        try:
            raise ValueError("boom")
        except ValueError:
            return logging.LogRecord("ws", logging.ERROR, __file__, 1, msg, None, sys.exc_info())

    passed = [r for r in (record("opening handshake failed") for _ in range(10_000)) if f.filter(r)]
    assert len(passed) == 20 and all(r.exc_info is None for r in passed)
    now[0] = 11.0
    bug = record("connection handler failed")
    assert f.filter(bug) and bug.exc_info is not None and "9980 earlier lines suppressed" in bug.msg
