"""Sans-I/O protocol core of the agent: one connection's state machine, no sockets in it.

`receive(text)` turns one text frame into either a `Dispatch` (a typed, authenticated, schema-valid
operation for the executors) or an error reply to send back. Authentication is an HMAC challenge:
the agent pushes a random nonce on connect; `hello` must carry HMAC-SHA256(token, nonce). Until then
every other op is refused, and a wrong HMAC closes the session.
"""
from __future__ import annotations

import hashlib
import hmac
import json
import secrets
from dataclasses import dataclass
from typing import get_args

from pydantic import BaseModel, ValidationError

from schemas import protocol
from schemas.hoststate import QdiscStage
from schemas.validate import ProtocolError, check_request, check_result

MAX_FRAME_CHARS = 8 * 1024 * 1024   # the WebSocket limit; checked again here for callers without one


@dataclass(frozen=True)
class Dispatch:
    id: int
    op: str
    args: BaseModel


def expected_hmac(token: bytes, nonce_hex: str) -> str:
    return hmac.new(token, bytes.fromhex(nonce_hex), hashlib.sha256).hexdigest()


class AgentSession:
    def __init__(self, token: bytes, nonce: bytes | None = None):
        if not token:
            raise ValueError("an agent needs a non-empty shared token")
        self._token = token
        self.nonce_hex = (nonce or secrets.token_bytes(32)).hex()
        self.authenticated = False
        self.closed = False
        self.peer: str | None = None

    def greeting(self) -> str:
        return encode_event("challenge", {"nonce": self.nonce_hex, "protocol": protocol.PROTOCOL_VERSION})

    def receive(self, text: str | bytes) -> Dispatch | str:
        """Validate one inbound frame. Returns a Dispatch to execute or an encoded error reply; never raises,
        whatever the frame holds (the peer may not have authenticated yet)."""
        if isinstance(text, bytes):
            return encode_error(None, "bad_request", "binary frames are not accepted by the agent")
        if len(text) > MAX_FRAME_CHARS:
            return encode_error(None, "bad_request", f"frame of {len(text)} characters exceeds {MAX_FRAME_CHARS}")
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
            if not hmac.compare_digest(args.hmac, expected_hmac(self._token, self.nonce_hex)):
                self.closed = True
                return encode_error(req_id, "unauthenticated", "hello HMAC does not match the token",
                                    field="hmac", op=op)
            if args.protocol != protocol.PROTOCOL_VERSION:
                return encode_error(req_id, "refused", f"protocol {args.protocol} not supported",
                                    field="protocol", op=op)
            self.authenticated = True
            self.peer = args.client
        if op == "bye":
            self.closed = True
        return Dispatch(id=req_id, op=op, args=args)


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
