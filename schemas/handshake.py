"""Mutual authentication in `hello`, shared by agent and manager (pure functions, no I/O).

Each side proves the testbed token with HMAC-SHA256 over both sides' fresh nonces, a direction label and the
channel binding. The label keeps one side's proof from being reflected back as the other's; the two nonces
bind both proofs to this one session; the binding -- the sha256 of the agent's TLS certificate as the manager
saw it, empty without TLS -- makes both proofs fail when a relay terminates TLS with a certificate of its own.
Without TLS there is no binding, and a relay that forwards every frame unchanged cannot be told apart.
"""
from __future__ import annotations

import hashlib
import hmac

NONCE_PATTERN = r"^[0-9a-f]{64}$"
MANAGER_TO_AGENT = b"tcplab-hello manager proves the token to the agent"
AGENT_TO_MANAGER = b"tcplab-hello agent proves the token to the manager"


def _proof(token: bytes, label: bytes, agent_nonce_hex: str, manager_nonce_hex: str, binding_hex: str) -> str:
    # fixed-length nonces (32 bytes each) and a fixed-form binding: the concatenation is unambiguous
    message = b"|".join([label, bytes.fromhex(agent_nonce_hex), bytes.fromhex(manager_nonce_hex),
                         binding_hex.encode("ascii")])
    return hmac.new(token, message, hashlib.sha256).hexdigest()


def manager_proof(token: bytes, agent_nonce_hex: str, manager_nonce_hex: str, binding_hex: str = "") -> str:
    """What the manager sends in hello.hmac."""
    return _proof(token, MANAGER_TO_AGENT, agent_nonce_hex, manager_nonce_hex, binding_hex)


def agent_proof(token: bytes, agent_nonce_hex: str, manager_nonce_hex: str, binding_hex: str = "") -> str:
    """What the agent sends in the hello result's `proof`."""
    return _proof(token, AGENT_TO_MANAGER, agent_nonce_hex, manager_nonce_hex, binding_hex)


def proofs_match(got: str, expected: str) -> bool:
    return hmac.compare_digest(got.encode("ascii", "replace"), expected.encode("ascii"))


def certificate_binding(der: bytes | None) -> str:
    """The channel binding of a TLS session: sha256 (hex) of the agent's certificate in DER; "" without TLS."""
    return hashlib.sha256(der).hexdigest() if der else ""
