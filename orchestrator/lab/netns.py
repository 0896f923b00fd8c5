"""The netns lab (effects): `up`, `down`, `status`.

`up` builds the topology, then starts a detached supervisor (orchestrator.lab.supervisor) that keeps
one agent per namespace as its own child and reaps it; this machine's PID 1 does not reap orphans.
`down` is idempotent and crash-safe: whatever state file exists, it removes every `<prefix>-*`
namespace, stops every process inside them by pid, and deletes leftover tracefs instances.
"""
from __future__ import annotations

import asyncio
import json
import logging
import os
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from websockets.exceptions import ConnectionClosed, InvalidHandshake

from orchestrator.agent_client import AgentClient, AgentError
from orchestrator.inventory import Inventory
from orchestrator.inventory_ini import to_ini
from orchestrator.lab.topology import PREFIX, Topology, build_argv, lab_topology, neigh_argv, netns_topology
from orchestrator.plan.model.topology import Graph
from schemas import procs

log = logging.getLogger("tcplab.lab")
STATE_DIR = Path(os.environ.get("TCPLAB_LAB_DIR", "/run/tcplab"))
LAB_PREFIX = os.environ.get("TCPLAB_LAB_PREFIX", PREFIX)
AGENT_ARTIFACTS = Path("/var/tmp/tcplab/agents")


class LabError(Exception):
    pass


def inventory_path(state_dir: Path = STATE_DIR) -> Path:
    return state_dir / "inventory.json"


def write_inventory_ini(state_dir: Path, inv: dict) -> None:
    """The same testbed as Ansible INI next to inventory.json (docs/inventory.md): one format for labs and
    physical testbeds, usable by `tcplab run --inventory` and by Ansible itself."""
    (state_dir / "inventory.ini").write_text(to_ini(Inventory.model_validate(inv)))


def lab_namespaces(prefix: str = LAB_PREFIX) -> list[str]:
    out = procs.run(["ip", "-j", "netns", "list"], check=False).stdout.strip()
    names = [n["name"] for n in json.loads(out)] if out else []
    return sorted(n for n in names if n.startswith(f"{prefix}-"))


def _proc_state(pid: int) -> str | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[0]


def pid_alive(pid: int) -> bool:
    return _proc_state(pid) not in (None, "Z", "X")


def supervised_children(state_dir: Path) -> dict[str, int]:
    """name -> pid of the lab supervisor's children (agents.json: its agents and extra processes)."""
    try:
        return json.loads((state_dir / "agents.json").read_text())
    except (OSError, json.JSONDecodeError):
        return {}


def verified_pid(pid: int | None, marker: str) -> int | None:
    """pid, if that process is alive and its command line names `marker` (never kill a reused pid)."""
    try:
        return pid if pid and pid_alive(pid) and marker.encode() in Path(f"/proc/{pid}/cmdline").read_bytes() \
            else None
    except OSError:
        return None


def topology_dict(topo: Topology) -> dict:
    """What the lab was built as, in a plan's TopologySpec shape (compared with a plan's by `tcplab run`)."""
    return {"hosts": list(topo.hosts), "switches": list(topo.switches),
            "links": [[link.a.role, link.b.role] for link in topo.links]}


def inventory_dict(topo: Topology, kind: str, token_file: Path, macs: dict[tuple[str, str], str],
                   agents: dict[str, str], namespaces: dict[str, str | None]) -> dict:
    """The inventory (pure): per role its agent URL, namespace (None for a VM) and data interfaces."""
    hosts = {}
    for role in topo.roles:
        ifaces = {}
        for ep in topo.endpoints(role):
            peer = topo.peer(ep)
            entry = {"toward": peer.role, "addr": ep.addr, "plen": ep.plen, "peer_addr": peer.addr,
                     "mac": macs[(role, ep.ifname)]}
            if peer.role in topo.switches:
                entry["switch_peers"] = {p.role: p.addr for p in topo.segment_peers(ep)}
            ifaces[ep.ifname] = entry
        hosts[role] = {"agent": agents[role], "namespace": namespaces[role], "interfaces": ifaces}
    return {"kind": kind, "prefix": topo.prefix, "token_file": str(token_file), "hosts": hosts,
            "topology": topology_dict(topo)}


def new_token(state_dir: Path) -> Path:
    """A fresh testbed token (0600) in the lab's state dir: every agent of the lab and the manager share it."""
    state_dir.mkdir(parents=True, exist_ok=True)
    token_file = state_dir / "token"
    token_file.touch(mode=0o600)
    token_file.write_text(secrets.token_hex(32))
    return token_file


def link_mac(namespace: str, ifname: str) -> str:
    return json.loads(procs.run(["ip", "-n", namespace, "-j", "link", "show", "dev", ifname]).stdout)[0]["address"]


def build_inventory(topo: Topology, state_dir: Path, token_file: Path) -> dict:
    macs = {(role, ep.ifname): link_mac(topo.namespace(role), ep.ifname)
            for role in topo.roles for ep in topo.endpoints(role)}
    return inventory_dict(topo, "netns", token_file, macs,
                          {role: f"unix:{state_dir / f'agent-{role}.sock'}" for role in topo.roles},
                          {role: topo.namespace(role) for role in topo.roles})


def up(state_dir: Path = STATE_DIR, prefix: str = LAB_PREFIX, timeout_s: float = 60.0,
       graph: Graph | None = None) -> dict:
    """Build the lab of `graph` (a plan's topology; default: the quickstart's client <-> aqm <-> server).
    A healthy lab of the same topology is kept; any other is taken down first."""
    topo = netns_topology(prefix) if graph is None else lab_topology(graph, prefix)
    if lab_namespaces(prefix) or inventory_path(state_dir).exists():
        if status(state_dir, prefix)["healthy"]:
            inv = json.loads(inventory_path(state_dir).read_text())
            if inv.get("topology") == topology_dict(topo):
                return inv
        down(state_dir, prefix)
    try:
        for argv in build_argv(topo):
            procs.run(argv)
        token_file = new_token(state_dir)
        inv = build_inventory(topo, state_dir, token_file)
        macs = {(role, name): i["mac"]
                for role, h in inv["hosts"].items() for name, i in h["interfaces"].items()}
        for argv in neigh_argv(topo, macs):
            procs.run(argv)
        inventory_path(state_dir).write_text(json.dumps(inv, indent=2))
        write_inventory_ini(state_dir, inv)
        log_file = open(state_dir / "lab.log", "ab")
        sup = subprocess.Popen([sys.executable, "-m", "orchestrator.lab.supervisor", str(state_dir)],
                               stdin=subprocess.DEVNULL, stdout=log_file, stderr=log_file,
                               start_new_session=True, cwd=str(Path(__file__).resolve().parents[2]))
        inv["supervisor_pid"] = sup.pid
        inventory_path(state_dir).write_text(json.dumps(inv, indent=2))
        asyncio.run(_wait_for_agents(inv, token_file.read_bytes(), timeout_s, sup))
        inv = json.loads(inventory_path(state_dir).read_text())  # now with agent pids
        return inv
    except BaseException:
        down(state_dir, prefix)
        raise


async def _wait_for_agents(inv: dict, token: bytes, timeout_s: float, sup: subprocess.Popen,
                           check: Callable[[], None] | None = None) -> None:
    """Until every agent answers hello; `check` raises LabError when something it watches has died."""
    deadline = time.monotonic() + timeout_s
    for role, host in inv["hosts"].items():
        while True:
            if sup.poll() is not None:
                raise LabError(f"lab supervisor exited ({sup.returncode}); see lab.log")
            if check:
                check()
            client = AgentClient(role, host["agent"], token, netns=host.get("agent_netns"))
            try:
                await client.connect("tcplab-lab")
                await client.close()
                break
            except (AgentError, OSError, EOFError, TimeoutError, InvalidHandshake, ConnectionClosed):
                if time.monotonic() > deadline:
                    raise LabError(f"agent {role} did not answer within {timeout_s:.0f}s") from None
                await asyncio.sleep(0.2)


def _kill_pids(pids: list[int], grace_s: float = 5.0) -> None:
    for pid in pids:
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + grace_s
    while any(pid_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    for pid in pids:
        if pid_alive(pid):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def _supervisor_pid(state_dir: Path) -> int | None:
    try:
        pid = json.loads(inventory_path(state_dir).read_text()).get("supervisor_pid")
    except (OSError, json.JSONDecodeError):
        return None
    if pid and pid_alive(pid) and b"orchestrator.lab.supervisor" in Path(f"/proc/{pid}/cmdline").read_bytes():
        return pid
    return None


def down(state_dir: Path = STATE_DIR, prefix: str = LAB_PREFIX) -> list[str]:
    """Remove everything the lab made; returns a list of what was removed."""
    removed = []
    sup = _supervisor_pid(state_dir)
    if sup:
        _kill_pids([sup], grace_s=20)  # it stops and reaps its agents, which reset their hosts
        removed.append(f"supervisor {sup}")
    for ns in lab_namespaces(prefix):
        pids = [int(p) for p in procs.run(["ip", "netns", "pids", ns], check=False).stdout.split()]
        _kill_pids(pids)
        procs.run(["ip", "netns", "del", ns], check=False)
        removed.append(f"namespace {ns}" + (f" ({len(pids)} processes)" if pids else ""))
    for root in (Path("/sys/kernel/tracing/instances"), Path("/sys/kernel/debug/tracing/instances")):
        if root.is_dir():
            for inst in root.glob(f"{prefix}-*"):
                inst.rmdir()
                removed.append(f"tracefs instance {inst.name}")
            break
    for name in ("inventory.json", "inventory.ini", "token", "agents.json"):
        (state_dir / name).unlink(missing_ok=True)
    for sock in state_dir.glob("agent-*.sock") if state_dir.exists() else []:
        sock.unlink()
    return removed


def _built_namespaces(inv: Path, prefix: str) -> list[str]:
    """The namespaces the inventory's lab was built with (hosts and switches)."""
    try:
        doc = json.loads(inv.read_text())
    except (OSError, json.JSONDecodeError):
        return []
    topo = doc.get("topology") or {"hosts": list(doc.get("hosts", {})), "switches": []}
    return [f"{prefix}-{n}" for n in topo["hosts"] + topo["switches"]]


def status(state_dir: Path = STATE_DIR, prefix: str = LAB_PREFIX) -> dict:
    namespaces = lab_namespaces(prefix)
    agents = []
    agents_file = state_dir / "agents.json"
    if agents_file.exists():
        for role, pid in json.loads(agents_file.read_text()).items():
            agents.append({"role": role, "pid": pid, "alive": pid_alive(pid)})
    links = []
    for ns in namespaces:
        out = procs.run(["ip", "-n", ns, "-j", "-br", "addr", "show"], check=False).stdout
        for link in json.loads(out or "[]"):
            if link["ifname"] != "lo":
                links.append({"namespace": ns, "ifname": link["ifname"], "state": link["operstate"],
                              "addr": [a["local"] for a in link.get("addr_info", [])]})
    inv = inventory_path(state_dir)
    healthy = (bool(namespaces) and inv.exists() and bool(agents) and all(a["alive"] for a in agents)
               and sorted(namespaces) == sorted(_built_namespaces(inv, prefix)))
    return {"healthy": healthy, "inventory": str(inv) if inv.exists() else None,
            "namespaces": namespaces, "agents": [a for a in agents if a["alive"]], "links": links}
