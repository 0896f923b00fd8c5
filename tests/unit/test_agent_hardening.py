"""Issue 13, first defects closed: identifiers that cannot name a path, an artifacts root no other user can swap,
and a protocol session that answers every frame -- before and after hello -- with a coded error instead of a
crash. Each reported case is replayed; hypothesis then throws random and mutated frames at the session."""
from __future__ import annotations

import json
import os
import stat

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from agents.rootdir import UnsafeArtifactsRoot, ensure_artifacts_root, private_dir_problem
from agents.session import AgentSession, Dispatch
from schemas import handshake, protocol

TOKEN = b"secret-token"
CODES = {"bad_request", "unauthenticated", "unknown_op", "invalid_args", "refused"}


def _authenticated() -> AgentSession:
    s = AgentSession(TOKEN)
    nonce = "ab" * 32
    out = s.receive(json.dumps({"id": 1, "op": "hello", "args": {
        "client": "t", "nonce": nonce, "hmac": handshake.manager_proof(TOKEN, s.nonce_hex, nonce)}}))
    assert isinstance(out, Dispatch)
    return s


def _coded(reply: Dispatch | str) -> str:
    assert isinstance(reply, str), reply
    err = json.loads(reply)["error"]
    assert err["code"] in CODES and err["message"], err
    return err["code"]


class _Tally:
    """Fuzz cases run and crashes seen in this module (a crash also fails its test)."""
    cases = 0
    crashes = 0


@pytest.fixture(scope="module", autouse=True)
def _record_fuzz_figures(ledger):
    yield
    if _Tally.cases:
        ledger.fuzz("agent session (sans-I/O)", _Tally.cases, _Tally.crashes)


def _fuzzed(session: AgentSession, frame: str) -> Dispatch | str:
    """One fuzz case: the session must answer with a Dispatch or a coded error, never raise."""
    _Tally.cases += 1
    try:
        reply = session.receive(frame)
        if not isinstance(reply, Dispatch):
            _coded(reply)
    except BaseException:
        _Tally.crashes += 1
        raise
    return reply


@pytest.mark.parametrize("run_id", [".", "..", "-rf", ".hidden", "a/b", "a\nforged log line", "", "x" * 129])
def test_a_run_id_cannot_name_a_path_or_forge_a_log_line(run_id):
    task = {"kind": "capture", "task_id": "c0", "start_ns": 1, "stop_ns": 2, "interface": "to-aqm"}
    for model, args in ((protocol.ScheduleArgs, {"tasks": [task]}), (protocol.CollectArgs, {}),
                        (protocol.ApplyArgs, {"state": {}})):
        with pytest.raises(ValidationError, match="run_id"):
            model.model_validate({"run_id": run_id, **args})
    reply = _authenticated().receive(json.dumps({"id": 2, "op": "schedule",
                                                  "args": {"run_id": run_id, "tasks": [task]}}))
    assert _coded(reply) == "invalid_args" and json.loads(reply)["error"]["field"] == "run_id"


def test_plan_run_ids_still_fit_the_pattern():
    # every plan's runs are expanded under the same pattern by test_run_id_stability (RunSpec.run_id)
    assert protocol.CollectArgs(run_id="quickstart-main-8dd82a3fd3-r0").run_id


@pytest.mark.parametrize("frame", [
    "[" * 5000 + "]" * 5000,                                   # nesting: RecursionError in json
    '{"id": ' + "9" * 4301 + ', "op": "hello"}',               # beyond int_max_str_digits: ValueError
    '{"id": 1, "op": ["hello"]}',                               # an unhashable op: TypeError
    '{"id": 1, "op": {"a": 1}}',
    '{"id": true, "op": "hello", "args": {}}',
    '{"id": -1, "op": "status"}',
    '{"op": "status"}',
    '{"id": 1, "op": "hello", "args": []}',
    '{"id": 1, "op": "hello", "args": {"client": "\\ud800", "hmac": "00"}}',   # a lone surrogate
    '"just a string"', "null", "1e999999",
])
def test_frames_that_crashed_the_agent_before_hello_get_a_coded_error(frame):
    for session in (AgentSession(TOKEN), _authenticated()):
        _coded(session.receive(frame))


VALID = [{"id": 3, "op": "status", "args": {}},
         {"id": 4, "op": "clock", "args": {"t1_ns": 1}},
         {"id": 5, "op": "collect", "args": {"run_id": "r1", "timeout_s": 10}},
         {"id": 6, "op": "schedule", "args": {"run_id": "r1", "tasks": [
             {"kind": "capture", "task_id": "c0", "start_ns": 1, "stop_ns": 2, "interface": "to-aqm"}]}}]
JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
                    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner,
                                                                              max_size=4), max_leaves=20)


@settings(max_examples=3000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.one_of(st.text(max_size=200), JSON.map(json.dumps)))
def test_random_frames_before_hello_never_crash_the_session(frame):
    s = AgentSession(TOKEN)
    reply = _fuzzed(s, frame)
    assert isinstance(reply, str) and not s.authenticated


@settings(max_examples=3000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(VALID), st.lists(st.tuples(st.text(max_size=10), JSON), min_size=1, max_size=3),
       st.booleans())
def test_mutated_valid_ops_after_hello_dispatch_or_get_a_coded_error(op, mutations, in_args):
    doc = json.loads(json.dumps(op))
    for key, value in mutations:
        (doc["args"] if in_args else doc)[key] = value
    _fuzzed(_authenticated(), json.dumps(doc))


def test_the_artifacts_root_is_created_private(tmp_path):
    root = ensure_artifacts_root(tmp_path / "artifacts")
    st_ = os.lstat(root)
    assert stat.S_IMODE(st_.st_mode) == 0o700 and st_.st_uid == os.geteuid()
    assert ensure_artifacts_root(root) == root                       # an existing private root is kept


def test_an_artifacts_root_another_user_could_swap_is_refused(tmp_path):
    target = tmp_path / "root-owned"
    target.mkdir(mode=0o700)
    link = tmp_path / "artifacts"
    link.symlink_to(target)
    with pytest.raises(UnsafeArtifactsRoot, match="symbolic link"):
        ensure_artifacts_root(link)
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o1777)                                           # like /var/tmp itself
    with pytest.raises(UnsafeArtifactsRoot, match="writable by others"):
        ensure_artifacts_root(shared)
    assert "owned by uid" in private_dir_problem(os.lstat(target), os.geteuid() + 1)
