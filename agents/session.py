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

from pydantic import BaseModel, ValidationError

from schemas import protocol
from schemas.validate import ProtocolError, check_request, check_result


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
        """Validate one inbound frame. Returns a Dispatch to execute or an encoded error reply."""
        if isinstance(text, bytes):
            return encode_error(None, "bad_request", "binary frames are not accepted by the agent")
        try:
            doc = json.loads(text)
        except json.JSONDecodeError as exc:
            return encode_error(None, "bad_request", f"not JSON: {exc.msg}")
        if not isinstance(doc, dict):
            return encode_error(None, "bad_request", "a request must be a JSON object")
        req_id = doc.get("id") if isinstance(doc.get("id"), int) else None
        op = doc.get("op")
        if op not in protocol.OP_ARGS:
            return encode_error(req_id, "unknown_op", f"unknown op {op!r}", field="op")
        try:
            check_request(doc)
        except ProtocolError as exc:
            return encode_error(req_id, exc.code, exc.detail, field=exc.field, op=op)
        if not self.authenticated and op != "hello":
            return encode_error(req_id, "unauthenticated", f"op {op!r} before a successful hello", op=op)
        try:
            args = protocol.OP_ARGS[op].model_validate(doc.get("args", {}))
        except ValidationError as exc:
            first = exc.errors()[0]
            field = ".".join(str(p) for p in first["loc"])
            return encode_error(req_id, "invalid_args", first["msg"], field=field, op=op)
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
        return Dispatch(id=doc["id"], op=op, args=args)


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
