"""`tcplab provision` (effects): playbooks/site.yml on every testbed host Ansible can reach over SSH.

The hosts are those of the inventory's role groups that carry Ansible connection variables (a physical
testbed's hosts, a VM lab's disk guests); namespace hosts of the labs share this machine and need none. On a
VM lab, once the agents answer, each disk guest's clock is stepped onto this machine's (the agent's `clock`
op measures the offset; the step goes over SSH), as `lab up` does for the other guests.
"""
from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

from rich.console import Console

from orchestrator.agent_client import AgentClient
from orchestrator.ansible.bundle import build_bundle
from orchestrator.ansible.runner import PlaybookResult, run_playbook
from orchestrator.inventory import Inventory, InventoryError
from orchestrator.inventory_ini import ansible_hosts, host_roles, load_ini_inventory
from schemas import procs


def targets(path: Path, roles: list[str] | None = None) -> tuple[Inventory, dict[str, str]]:
    """The inventory and the hosts the playbooks reach (inventory host name -> role): those of `roles`
    (default: all) that carry Ansible connection variables."""
    inv = load_ini_inventory(path)
    by_name = host_roles(ansible_hosts(path.resolve()))
    unknown = sorted(set(roles or []) - set(by_name.values()))
    if unknown:
        raise InventoryError(f"{path}: no role {', '.join(unknown)} (have {', '.join(sorted(by_name.values()))})")
    chosen = {name: role for name, role in by_name.items() if (not roles or role in roles) and inv.hosts[role].ssh}
    if not chosen:
        raise InventoryError(f"{path}: no host asked for has Ansible connection variables (ansible_host ...): "
                             "nothing to do (the netns lab's hosts are namespaces of this machine)")
    return inv, chosen


def provision(path: Path, console: Console, python: str = f"{sys.version_info.major}.{sys.version_info.minor}"
              ) -> PlaybookResult:
    inv, chosen = targets(path)
    bundle = build_bundle(python, progress=lambda m: console.print(m))
    console.print(f"provision: {', '.join(f'{n} ({r})' for n, r in chosen.items())} with {bundle.name}")
    result = run_playbook("site.yml", path, {"tcplab_roles": chosen, "tcplab_bundle": str(bundle),
                                             "tcplab_hosts": ",".join(chosen)}, limit=",".join(chosen),
                          console=console)
    if result.ok:
        asyncio.run(_wait_for_agents(inv, list(chosen.values())))
    return result


async def _wait_for_agents(inv: Inventory, roles: list[str], timeout_s: float = 300.0) -> None:
    """Until every provisioned agent answers hello (it was just (re)started by systemd)."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    for role in roles:
        while True:
            client = AgentClient(role, inv.hosts[role].agent, inv.token, tls=inv.tls_context())
            try:
                await client.connect("tcplab-provision")
                await client.close()
                break
            except Exception as exc:  # noqa: BLE001 - any failure to connect is "not yet"
                if asyncio.get_running_loop().time() > deadline:
                    raise InventoryError(f"agent {role} did not answer at {inv.hosts[role].agent} within "
                                         f"{timeout_s:.0f} s after site.yml: {exc} (on the host: "
                                         "`journalctl -u tcplab-agent`)") from None
                await asyncio.sleep(1.0)


def step_clock_argv(ssh_argv_prefix: list[str], delta_ns: int) -> list[str]:
    """Step a host's realtime clock by delta_ns (relative, so the SSH latency does not matter)."""
    code = ("import time; c = time.CLOCK_REALTIME; "
            f"time.clock_settime_ns(c, time.clock_gettime_ns(c) + ({int(delta_ns)}))")
    return [*ssh_argv_prefix, f"python3 -c '{code}'"]


def calibrate_lab_guests(state_inventory: Path, console: Console) -> dict[str, int]:
    """A VM lab's disk guests: clocks stepped onto this machine's; offsets recorded in inventory.json."""
    from orchestrator.inventory import load_inventory
    from orchestrator.lab import vm
    from orchestrator.lab.vm_disk_lab import ssh_argv

    doc = json.loads(state_inventory.read_text())
    inv = load_inventory(state_inventory)
    roles = [r for r in (doc.get("vm") or {}).get("roles", []) if inv.hosts[r].ssh]
    asyncio.run(_wait_for_agents(inv, roles))     # e.g. just rebooted by kernel-install.yml
    out = {}
    for role in roles:
        prefix = ssh_argv(doc, role, [])[:-1]          # ssh ... root@host --  (the command is added per step)
        out[role] = asyncio.run(vm.calibrate_clock(
            doc, state_inventory.parent, role, step=lambda delta, p=prefix: procs.run(step_clock_argv(p, delta),
                                                                                      timeout=60)))
        doc["vm"]["guests"][role]["clock_offset_ns"] = out[role]
        console.print(f"clock: {role} within {out[role] / 1e6:.3f} ms of this machine")
    state_inventory.write_text(json.dumps(doc, indent=2))
    return out
