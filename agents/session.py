"""Sans-I/O protocol core of the agent: one connection's state machine, no sockets in it.

`receive(text)` turns one text frame into either a `Dispatch` (a typed, authenticated, schema-valid
operation for the executors) or an error reply to send back. Authentication is mutual (schemas/handshake.py):
the agent pushes a random nonce on connect; `hello` carries the manager's own nonce and its proof of the token
over both nonces and the TLS channel binding; the agent's proof over the same goes back in the hello result.
Until then every other op is refused, and a wrong proof closes the session. Before hello the session is held
to the pre-authentication limits (agents/admission.py): small frames, and few of them.
"""
from __future__ import annotations

import json
import secrets
from collections.abc import Callable
from dataclasses import dataclass
from typing import get_args

from pydantic import BaseModel, ValidationError

from agents.admission import PreAuthLimits
from schemas import handshake, protocol
from schemas.hoststate import QdiscStage
from schemas.validate import ProtocolError, check_request, check_result

MAX_FRAME_CHARS = 8 * 1024 * 1024   # the WebSocket limit after hello; checked again here for callers without one


@dataclass(frozen=True)
class Dispatch:
    id: int
    op: str
    args: BaseModel


class AgentSession:
    def __init__(self, token: bytes, nonce: bytes | None = None, channel_binding: str = "",
                 limits: PreAuthLimits | None = None, hello_gate: Callable[[], str | None] = lambda: None):
        """`channel_binding`: sha256 of the agent's TLS certificate ("" without TLS); `hello_gate`: why a hello
        is not even checked now (the failed-hello budget is spent), or None."""
        if not token:
            raise ValueError("an agent needs a non-empty shared token")
        self._token = token
        self._binding = channel_binding
        self._limits = limits or PreAuthLimits()
        self._hello_gate = hello_gate
        self.nonce_hex = (nonce or secrets.token_bytes(32)).hex()
        self.authenticated = False
        self.closed = False
        self.close_reason = ""           # why the session closed itself: the WebSocket close reason
        self.hello_failed = False        # the last frame was a hello with a wrong proof (rate-limited, logged)
        self.peer: str | None = None
        self.proof: str | None = None    # the agent's proof for the hello result, once authenticated
        self._frames_before_hello = 0

    def greeting(self) -> str:
        return encode_event("challenge", {"nonce": self.nonce_hex, "protocol": protocol.PROTOCOL_VERSION})

    def receive(self, text: str | bytes) -> Dispatch | str:
        """Validate one inbound frame. Returns a Dispatch to execute or an encoded error reply; never raises,
        whatever the frame holds (the peer may not have authenticated yet)."""
        self.hello_failed = False
        if not self.authenticated:
            self._frames_before_hello += 1
            if self._frames_before_hello > self._limits.max_frames_before_hello:
                return self._close(None, "bad_request", f"more than {self._limits.max_frames_before_hello} "
                                   "frames before hello")
        if isinstance(text, bytes):
            return encode_error(None, "bad_request", "binary frames are not accepted by the agent")
        limit = MAX_FRAME_CHARS if self.authenticated else self._limits.max_frame_before_hello
        if len(text) > limit:
            return encode_error(None, "bad_request", f"frame of {len(text)} characters exceeds {limit}"
                                + ("" if self.authenticated else " before hello"))
        try:
            doc = json.loads(text)
        except json.JSONDecodeError as exc:
            return encode_error(None, "bad_request", f"not JSON: {exc.msg}")
        except (RecursionError, ValueError) as exc:   # nesting too deep; an integer beyond int_max_str_digits
            return encode_error(None, "bad_request", f"not acceptable JSON: {type(exc).__name__}")
        try:
            return self._validated(doc)
        except (ValidationError, ProtocolError, RecursionError, ValueError, TypeError) as exc:
            # a frame the checks below did not foresee: still a coded error, never a crash of the connection
            return encode_error(None, "bad_request", f"request refused: {type(exc).__name__}")

    def _validated(self, doc: object) -> Dispatch | str:
        if not isinstance(doc, dict):
            return encode_error(None, "bad_request", "a request must be a JSON object")
        raw_id = doc.get("id")
        req_id = raw_id if type(raw_id) is int and 0 <= raw_id < 2**53 else None
        if req_id is None:
            return encode_error(None, "bad_request", "id must be an integer in [0, 2**53)", field="id")
        op = doc.get("op")
        if not isinstance(op, str) or op not in protocol.OP_ARGS:
            shown = repr(op)[:40] if isinstance(op, str) else type(op).__name__
            return encode_error(req_id, "unknown_op", f"unknown op {shown}", field="op")
        if not self.authenticated and op != "hello":
            return encode_error(req_id, "unauthenticated", f"op {op!r} before a successful hello", op=op)
        try:
            # pydantic first: its error locations name the exact field inside tagged unions
            args = protocol.OP_ARGS[op].model_validate(doc.get("args", {}))
        except ValidationError as exc:
            first = exc.errors()[0]
            return encode_error(req_id, "invalid_args", first["msg"], field=field_path(first["loc"]), op=op)
        try:
            check_request(doc)  # the checked-in JSON Schema contract, for frames pydantic accepted
        except ProtocolError as exc:
            return encode_error(req_id, exc.code, exc.detail, field=exc.field, op=op)
        if op == "hello":
            assert isinstance(args, protocol.HelloArgs)
            return self._hello(req_id, args)
        if op == "schedule":
            assert isinstance(args, protocol.ScheduleArgs)
            if (duplicate := _duplicate_task(args)) is not None:
                return encode_error(req_id, "invalid_args", f"task id {args.tasks[duplicate].task_id!r} is "
                                    "given twice: two tasks would write one file", field=f"tasks.{duplicate}.task_id",
                                    op=op)
        if op == "bye":
            self.closed = True
        return Dispatch(id=req_id, op=op, args=args)

    def _hello(self, req_id: int, args: protocol.HelloArgs) -> Dispatch | str:
        if self.authenticated:
            return encode_error(req_id, "refused", "this session is already authenticated", field="hmac",
                                op="hello")
        if throttled := self._hello_gate():
            # the proof is not even checked: a guess costs the guesser its budget and us no check
            return self._close(req_id, "busy", throttled, field="hmac", op="hello")
        if args.nonce == self.nonce_hex:
            return self._close(req_id, "invalid_args", "the manager's nonce repeats the agent's", field="nonce",
                               op="hello")
        expected = handshake.manager_proof(self._token, self.nonce_hex, args.nonce, self._binding)
        if not handshake.proofs_match(args.hmac, expected):
            self.hello_failed = True
            return self._close(req_id, "unauthenticated", "hello HMAC does not match the token"
                               + (" and this TLS channel" if self._binding else ""), field="hmac", op="hello")
        if args.protocol != protocol.PROTOCOL_VERSION:
            return encode_error(req_id, "refused", f"protocol {args.protocol} not supported (this agent speaks "
                                f"{protocol.PROTOCOL_VERSION})", field="protocol", op="hello")
        self.authenticated = True
        self.peer = args.client
        self.proof = handshake.agent_proof(self._token, self.nonce_hex, args.nonce, self._binding)
        return Dispatch(id=req_id, op="hello", args=args)

    def _close(self, req_id: int | None, code: str, message: str, field: str | None = None,
               op: str | None = None) -> str:
        self.closed = True
        self.close_reason = message[:120]    # a WebSocket close reason holds at most 123 bytes
        return encode_error(req_id, code, message, field=field, op=op)


def _duplicate_task(args: protocol.ScheduleArgs) -> int | None:
    """Index of the first task whose id an earlier task already has."""
    seen: set[str] = set()
    for i, task in enumerate(args.tasks):
        if task.task_id in seen:
            return i
        seen.add(task.task_id)
    return None



def field_path(loc: tuple) -> str:
    """pydantic loc -> dotted field path, without the union tag pydantic inserts after list indexes."""
    parts: list[str] = []
    for i, item in enumerate(loc):
        if i > 0 and isinstance(loc[i - 1], int) and isinstance(item, str) and item in UNION_TAGS:
            continue
        parts.append(str(item))
    return ".".join(parts)


def _union_tags(*unions) -> frozenset[str]:
    members = [m for u in unions for m in get_args(get_args(u)[0])]
    return frozenset(m.model_fields["kind"].default for m in members)


UNION_TAGS = _union_tags(protocol.Task, QdiscStage)


def encode_result(req_id: int, op: str, result: BaseModel) -> str:
    doc = result.model_dump(mode="json")
    check_result(op, doc)  # an agent must never send what the manager would reject
    return json.dumps({"id": req_id, "result": doc})


def encode_error(req_id: int | None, code: str, message: str, field: str | None = None,
                 op: str | None = None) -> str:
    prefix = f"{op}: " if op else ""
    return json.dumps({"id": req_id, "error": {"code": code, "message": prefix + message, "field": field}})


def encode_event(event: str, data: dict) -> str:
    return json.dumps({"event": event, "data": data})
