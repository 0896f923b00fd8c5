"""The receivers' ACK policy (`run.ack_policy`, G-ACK) in host state, in the read-back check and at preflight
(pure).

`quickack_route` puts `quickack` on every route of each receiving host's data interfaces; the agent reads
the routes back (`InterfaceReadback.routes`). `tcp_delayed_acks_sysctl` writes the patched kernels' sysctl
net.ipv4.tcp_delayed_acks (0: an ACK per segment) unless the plan states it, and is read back as every
sysctl is; a host whose kernel lacks it is refused. `module_param` is refused: no kernel variant the agents
know has a parameter for it. `stock` changes nothing. What the receivers really did is measured after the run
(orchestrator/guards/ack.py).
"""
from __future__ import annotations

from orchestrator.plan import RunSpec
from schemas import protocol
from schemas.hoststate import InterfaceState
from schemas.routes import quickack_by_route

DELAYED_ACKS_SYSCTL = "net.ipv4.tcp_delayed_acks"


def receives(spec: RunSpec, role: str) -> bool:
    return spec.ack_policy is not None and role in spec.ack_policy.hosts


def receiver_quickack(spec: RunSpec, role: str) -> bool | None:
    """The `quickack` of the role's data interfaces: on for a receiver of a quickack_route policy, else
    None (the routes are left as they are)."""
    if receives(spec, role) and spec.ack_policy.mechanism == "quickack_route":
        return True
    return None


def receiver_sysctls(spec: RunSpec, role: str) -> dict[str, str]:
    """Sysctls the policy adds on the role (the plan's own values take precedence)."""
    a = spec.ack_policy
    if receives(spec, role) and a.mechanism == "tcp_delayed_acks_sysctl" and a.mode == "per_segment":
        return {DELAYED_ACKS_SYSCTL: "0"}
    return {}


def quickack_differences(dev: str, want: InterfaceState, irb: protocol.InterfaceReadback) -> list[str]:
    """Each route of `dev` whose quickack the kernel shows differently from the wanted one."""
    if want.quickack is None:
        return []
    found = quickack_by_route(irb.routes)
    if not found and want.quickack:
        return [f"{dev}: no route to carry quickack"]
    return [f"{dev} route {key}: quickack {'on' if on else 'off'} != {'on' if want.quickack else 'off'}"
            for key, on in found.items() if on != want.quickack]


def refusals(spec: RunSpec, caps: dict[str, protocol.Capabilities]) -> list[str]:
    """The ACK policies the receivers cannot be given, each naming host and kernel."""
    a = spec.ack_policy
    if a is None:
        return []
    out = []
    for role in a.hosts:
        release = caps[role].kernel_release if role in caps else "?"
        if a.mechanism == "module_param":
            out.append(f"host {role} (kernel {release}): ack_policy mechanism module_param is not applied by this "
                       "agent version: no kernel variant it knows has a module parameter for the receiver's ACK "
                       "policy (use quickack_route for per_segment ACKs)")
        elif a.mechanism == "tcp_delayed_acks_sysctl" and role in caps and not caps[role].tcp_delayed_acks:
            out.append(f"host {role} (kernel {release}) lacks sysctl {DELAYED_ACKS_SYSCTL} (patched kernels "
                       "only): ack_policy mechanism tcp_delayed_acks_sysctl cannot be applied")
    return out
