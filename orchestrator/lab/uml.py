"""The UML lab (effects): `up`, `down`, `status`, `exec` for `tcplab lab up --kind uml`.

Every host of the topology is a User-Mode Linux kernel (orchestrator.kernel.uml: a project build, or Debian's
`linux.uml` while none is cached), an ordinary process of this machine: no KVM, native speed, the
machine's clock. Its layout is data (orchestrator.lab.uml_config): the taps, bridges and control network
live in the lab's own wire namespace; the UML processes are children of the lab supervisor, started inside
that namespace; the agents listen on the control network, and the manager reaches them (and each host's
exec port) with sockets opened inside the namespace. `down` stops the supervisor (a UML kernel ends at
once on SIGTERM), then whatever is left in the lab's namespaces, by pid.
"""
from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from orchestrator.agent_client import AgentClient, AgentError
from orchestrator.kernel.uml import UmlKernel, UmlKernelError, stock_uml
from orchestrator.lab import netns, vm, vm_guest
from orchestrator.lab.netns import LAB_PREFIX, STATE_DIR, LabError, inventory_path
from orchestrator.lab.topology import Topology, lab_topology, netns_topology
from orchestrator.lab.uml_config import (
    AGENT_PORT,
    EXEC_PORT,
    console_hint,
    control_addr,
    host_config,
    lab_macs,
    stage1_env,
    uml_argv,
    uml_dir,
    wire_argv,
    wire_namespace,
)
from orchestrator.lab.vm_config import paths_to_keep
from orchestrator.lab.vm_host import REPO_ROOT, guest_interpreter
from orchestrator.netns_socket import connect_in_netns
from orchestrator.plan.model.topology import Graph
from schemas import procs
from schemas.atomic import write_atomic

KIND = "uml"
STACK_LINE = re.compile(r"^ (\[<[0-9a-f]+>\]|[0-9a-f]{8} )")   # a panic's stack and call trace
PROCESS = "uml-"                         # supervisor children: uml-<role>
MODULES_MOUNT_POINT = Path("/lib/modules")
STAGE1 = REPO_ROOT / "orchestrator" / "lab" / "uml_init.sh"


def up(state_dir: Path = STATE_DIR, prefix: str = LAB_PREFIX, kernel: UmlKernel | None = None,
       graph: Graph | None = None, timeout_s: float = 60.0, module_dirs: tuple[str, ...] = ()) -> dict:
    """The lab of `graph` (default: the quickstart's chain), every host a UML kernel (`kernel`, default the
    stock one). A healthy UML lab of the same topology and kernel is kept; any other lab is refused (a
    netns or vm lab: take it down first) or, when broken, taken down. `module_dirs`: directories of modules
    built for this kernel, each an agent --module-dir."""
    topo = netns_topology(prefix) if graph is None else lab_topology(graph, prefix)
    try:
        kernel = kernel or stock_uml()
    except UmlKernelError as exc:
        raise LabError(str(exc)) from None
    if not module_dirs and kernel.extra_modules is not None:
        module_dirs = (str(kernel.extra_modules),)      # the project's modules, built against this kernel
    if inventory_path(state_dir).exists() or netns.lab_namespaces(prefix):
        kind = vm.lab_kind(state_dir)
        if kind != KIND and netns._supervisor_pid(state_dir):
            raise LabError(f"a {kind} lab is up in {state_dir}: run `tcplab lab down` first")
        if kind == KIND and status(state_dir, prefix)["healthy"]:
            inv = json.loads(inventory_path(state_dir).read_text())
            if (inv.get("topology") == netns.topology_dict(topo) and inv[KIND]["kernel"] == kernel.to_json()
                    and inv[KIND].get("module_dirs", []) == list(module_dirs)):
                return inv
        down(state_dir, prefix)
    try:
        for argv in wire_argv(topo):
            procs.run(argv)
        token_file = netns.new_token(state_dir)
        (state_dir / "uml").mkdir(exist_ok=True)
        agents = {role: f"tcp://{control_addr(topo, role)}:{AGENT_PORT}" for role in topo.hosts}
        inv = netns.inventory_dict(topo, KIND, token_file, lab_macs(topo), agents, dict.fromkeys(topo.hosts))
        for host in inv["hosts"].values():
            host["agent_netns"] = wire_namespace(prefix)
        inv["shared_clock"] = True            # a UML kernel reads the machine's clock
        if kernel.modules_root is not None:
            # the guests mount their kernel's modules there (hostfs is read-only: the mount point must exist);
            # every Debian system has it, a machine whose kernel has no modules may not
            MODULES_MOUNT_POINT.mkdir(parents=True, exist_ok=True)
        python, needed = guest_interpreter()
        keep = paths_to_keep(needed)
        inv["processes"], guests = [], {}
        for role in topo.hosts:
            gdir = _prepare_guest_dir(state_dir, role, token_file, host_config(topo, role, module_dirs))
            inv["processes"].append(_process(topo, role, state_dir, kernel, python, keep))
            guests[role] = {"console": str(gdir / "console.log"), "control_addr": control_addr(topo, role),
                            "kernel": kernel.to_json()}
        inv[KIND] = {"kernel": kernel.to_json(), "wire_namespace": wire_namespace(prefix), "guests": guests,
                     "module_dirs": list(module_dirs)}
        return _start(state_dir, inv, timeout_s)
    except BaseException:
        down(state_dir, prefix)
        raise


def switch_kernel(state_dir: Path, roles: list[str], kernel: UmlKernel, prefix: str = LAB_PREFIX,
                  timeout_s: float = 60.0) -> dict[str, float]:
    """Restart the UML hosts `roles` on `kernel` -- no install, no reboot: the supervisor stops each one's
    process and starts the new binary -- and verify each as a testbed host is verified after a kernel
    install: its agent's hello must report the kernel's release (which names the build's key). Returns the
    seconds each took from the restart to that hello; a host already on `kernel` is left alone (not in it)."""
    inv = _inventory(state_dir)
    if inv.get("kind") != KIND:
        raise LabError("no UML lab is up: `tcplab lab up --kind uml` first")
    unknown = [r for r in roles if r not in inv["hosts"]]
    if unknown:
        raise LabError(f"no UML host {', '.join(unknown)} in the lab (hosts: {', '.join(inv['hosts'])})")
    roles = [r for r in roles if (inv[KIND]["guests"][r].get("kernel") or {}) != kernel.to_json()]
    if not roles:
        return {}
    topo = lab_topology(Graph(tuple(inv["topology"]["hosts"]), tuple(inv["topology"]["switches"]),
                              tuple(tuple(link) for link in inv["topology"]["links"])), prefix)
    python, needed = guest_interpreter()
    modules = (str(kernel.extra_modules),) if kernel.extra_modules else ()
    keep = paths_to_keep(needed)
    for i, spec in enumerate(inv["processes"]):
        role = spec["name"].removeprefix(PROCESS)
        if role in roles:
            config = host_config(topo, role, modules)
            (uml_dir(state_dir, role) / "guest" / "guest.json").write_text(json.dumps(config, indent=2))
            inv["processes"][i] = _process(topo, role, state_dir, kernel, python, keep)
            inv[KIND]["guests"][role]["kernel"] = kernel.to_json()
    if kernel.modules_root is not None:
        MODULES_MOUNT_POINT.mkdir(parents=True, exist_ok=True)
    sup = netns._supervisor_pid(state_dir)
    if sup is None:
        raise LabError("the UML lab's supervisor is not running: `tcplab lab down` and up again")
    old = {r: netns.supervised_children(state_dir).get(f"{PROCESS}{r}") for r in roles}
    write_atomic(inventory_path(state_dir), json.dumps(inv, indent=2))
    started = time.monotonic()
    os.kill(sup, signal.SIGHUP)
    return asyncio.run(_wait_switched(state_dir, inv, roles, old, kernel.release, started, timeout_s))


def _listening(inv: dict, role: str) -> bool:
    """Whether the host's agent accepts a TCP connection now (a booting host does not answer ARP: a full
    connect would wait seconds for the kernel to give up; this one gives up after 0.2 s)."""
    addr, _, port = inv["hosts"][role]["agent"].removeprefix("tcp://").rpartition(":")
    try:
        connect_in_netns(inv[KIND]["wire_namespace"], addr, int(port), timeout_s=0.2).close()
        return True
    except OSError:
        return False


def _wait_listening(state_dir: Path, inv: dict, roles: list[str], deadline: float,
                    supervised: Callable[[], bool]) -> None:
    """Until every host's agent listens (then the hello), or a host's kernel exited, or the deadline."""
    waiting = list(roles)
    while waiting:
        if not supervised():
            _check_hosts(state_dir)     # a kernel that died took the supervisor down: its console says why
            raise LabError(f"the lab supervisor exited; see {state_dir / 'lab.log'}")
        _check_hosts(state_dir)
        waiting = [r for r in waiting if not _listening(inv, r)]
        if waiting and time.monotonic() > deadline:
            consoles = "\n".join(f"{r}'s console ({uml_dir(state_dir, r) / 'console.log'}):\n"
                                 f"{_console_tail(uml_dir(state_dir, r) / 'console.log', 6)}" for r in waiting)
            raise LabError(f"the agents of {', '.join(waiting)} did not listen in time\n{consoles}")
        if waiting:
            time.sleep(0.05)


async def _wait_switched(state_dir: Path, inv: dict, roles: list[str], old: dict[str, int | None], release: str,
                         started: float, timeout_s: float) -> dict[str, float]:
    token = Path(inv["token_file"]).read_bytes().strip()
    took: dict[str, float] = {}
    deadline = started + timeout_s
    while len(took) < len(roles):
        if time.monotonic() > deadline:
            raise LabError(f"UML hosts {', '.join(r for r in roles if r not in took)} did not come back on "
                           f"{release} within {timeout_s:.0f} s")
        for role in [r for r in roles if r not in took]:
            pid = netns.supervised_children(state_dir).get(f"{PROCESS}{role}")
            if pid is None or pid == old[role]:
                continue
            _check_hosts(state_dir)
            if not await asyncio.to_thread(_listening, inv, role):
                continue
            host = inv["hosts"][role]
            client = AgentClient(role, host["agent"], token, netns=host["agent_netns"])
            try:
                hello = await client.connect("tcplab-lab")
                await client.close()
            except (AgentError, OSError, TimeoutError):
                continue
            if hello.capabilities.kernel_release != release:
                raise LabError(f"UML host {role} came back on {hello.capabilities.kernel_release}, not {release}")
            took[role] = round(time.monotonic() - started, 2)
        await asyncio.sleep(0.05)
    return took


def _process(topo: Topology, role: str, state_dir: Path, kernel: UmlKernel, python: str, keep: list[str]) -> dict:
    """The supervisor's child for one UML host: its kernel's command line, its console as stdout."""
    gdir = uml_dir(state_dir, role)
    env = stage1_env(gdir / "guest", python, REPO_ROOT, keep, kernel.modules_root)
    return {"name": f"{PROCESS}{role}", "stdout": str(gdir / "console.log"),
            "argv": uml_argv(kernel.binary, topo, role, state_dir, STAGE1, env)}


def _prepare_guest_dir(state_dir: Path, role: str, token_file: Path, config: dict) -> Path:
    """<state>/uml-<role>/ with guest/ (0700: token 0600, guest.json), which stage 1 copies at boot."""
    gdir = uml_dir(state_dir, role)
    gdir.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(gdir / "guest", ignore_errors=True)
    (gdir / "guest").mkdir(mode=0o700)
    shutil.copy(token_file, gdir / "guest" / "token")
    (gdir / "guest" / "guest.json").write_text(json.dumps(config, indent=2))
    (gdir / "console.log").unlink(missing_ok=True)
    return gdir


def _start(state_dir: Path, inv: dict, timeout_s: float) -> dict:
    """Start the supervisor (it starts every UML kernel), then wait until every agent answers."""
    inventory_path(state_dir).write_text(json.dumps(inv, indent=2))
    netns.write_inventory_ini(state_dir, inv)
    started = time.monotonic()
    with open(state_dir / "lab.log", "ab") as log_file:
        sup = subprocess.Popen([sys.executable, "-m", "orchestrator.lab.supervisor", str(state_dir)],
                               stdin=subprocess.DEVNULL, stdout=log_file, stderr=log_file,
                               start_new_session=True, cwd=str(REPO_ROOT))
    inv["supervisor_pid"] = sup.pid
    inventory_path(state_dir).write_text(json.dumps(inv, indent=2))
    _wait_listening(state_dir, inv, list(inv["hosts"]), started + timeout_s, lambda: sup.poll() is None)
    asyncio.run(netns._wait_for_agents(inv, Path(inv["token_file"]).read_bytes(), timeout_s, sup,
                                       check=lambda: _check_hosts(state_dir)))
    inv[KIND]["boot_s"] = round(time.monotonic() - started, 2)
    inventory_path(state_dir).write_text(json.dumps(inv, indent=2))
    return inv


def _console_tail(path: Path, lines: int = 15) -> str:
    """The console's last lines, without a panic's stack dump (its cause is above it)."""
    try:
        text = path.read_text(errors="replace").splitlines()
    except OSError:
        return "(no console log)"
    return "\n".join([ln for ln in text if not STACK_LINE.match(ln)][-lines:])


def _check_hosts(state_dir: Path) -> None:
    for name, pid in netns.supervised_children(state_dir).items():
        if name.startswith(PROCESS) and not netns.pid_alive(pid):
            role = name.removeprefix(PROCESS)
            console = uml_dir(state_dir, role) / 'console.log'
            tail = _console_tail(console)
            raise LabError(f"the {role} UML kernel exited; its console ({console}):\n{tail}"
                           + (f"\n{hint}" if (hint := console_hint(tail)) else ""))


def down(state_dir: Path = STATE_DIR, prefix: str = LAB_PREFIX) -> list[str]:
    """Stop the supervisor (which stops every UML kernel), then anything left in the lab's namespaces by pid
    (netns.down); each host's console.log stays for the post-mortem."""
    marker = str(state_dir / "uml")
    hosts = [p for n, p in netns.supervised_children(state_dir).items()
             if n.startswith(PROCESS) and netns.verified_pid(p, marker)]
    removed = []
    sup = netns._supervisor_pid(state_dir)
    if sup:
        netns._kill_pids([sup], grace_s=20)
        removed.append(f"supervisor {sup}")
    left = [p for p in hosts if netns.verified_pid(p, marker)]
    netns._kill_pids(left)
    removed += [f"uml process {p}" for p in left]
    removed += netns.down(state_dir, prefix)
    for gdir in sorted(state_dir.glob("uml-*")) if state_dir.exists() else []:
        shutil.rmtree(gdir / "guest", ignore_errors=True)
    for umid_dir in sorted((state_dir / "uml").glob(f"{prefix}-*")) if (state_dir / "uml").is_dir() else []:
        shutil.rmtree(umid_dir, ignore_errors=True)      # a killed kernel leaves its pid file and mconsole socket
        removed.append(f"uml dir {umid_dir.name}")
    return removed


def lab_kernel(state_dir: Path) -> UmlKernel | None:
    """The kernel the UML lab came up with (its hosts' own, which a kernel switch leaves recorded), or None
    when no UML lab is up there."""
    inv = _inventory(state_dir)
    k = inv.get(KIND, {}).get("kernel") if inv.get("kind") == KIND else None
    if not k:
        return None
    paths = {"binary", "modules_root", "extra_modules"}
    return UmlKernel(**{f: Path(v) if f in paths and v is not None else v for f, v in k.items()})


def _inventory(state_dir: Path) -> dict:
    try:
        return json.loads(inventory_path(state_dir).read_text())
    except (OSError, json.JSONDecodeError):
        return {}


def guest_exec(argv: list[str], role: str, state_dir: Path = STATE_DIR, timeout_s: float = 60.0) -> procs.Completed:
    """Run argv as root on a UML host over its exec port (the lab's `ip netns exec`)."""
    inv = _inventory(state_dir)
    if inv.get("kind") != KIND or role not in inv.get("hosts", {}):
        raise LabError(f"no UML host {role!r} in the lab (is a UML lab up?)")
    token = Path(inv["token_file"]).read_text().strip()
    try:
        sock = connect_in_netns(inv[KIND]["wire_namespace"], inv[KIND]["guests"][role]["control_addr"], EXEC_PORT)
        r = vm_guest.guest_request(sock, {"argv": argv, "timeout": timeout_s, "token": token}, timeout_s + 15)
    except OSError as exc:
        raise LabError(f"exec on the {role} UML host: {exc}") from None
    return procs.Completed(argv, r["rc"], r["stdout"], r["stderr"])


def status(state_dir: Path = STATE_DIR, prefix: str = LAB_PREFIX) -> dict:
    st = netns.status(state_dir, prefix)
    inv = _inventory(state_dir)
    info = inv.get(KIND, {})
    pids = netns.supervised_children(state_dir)
    marker = str(state_dir / "uml")
    agents, guests = [], {}
    for role, g in info.get("guests", {}).items():
        pid = pids.get(f"{PROCESS}{role}")
        alive = bool(netns.verified_pid(pid, marker))
        guests[role] = {"pid": pid, "alive": alive, "console": g["console"],
                        "release": (g.get("kernel") or info.get("kernel") or {}).get("release")}
        agents.append({"role": role, "pid": None, "alive": alive, "agent": inv["hosts"][role]["agent"]})
        seen = _guest_links(state_dir, role) if alive else {}
        for ifname, i in inv["hosts"][role]["interfaces"].items():
            state, addrs = seen.get(ifname, ("?", [i["addr"]]))
            st["links"].append({"namespace": f"uml:{prefix}-{role}", "ifname": ifname, "state": state, "addr": addrs})
    healthy = (inv.get("kind") == KIND and st["namespaces"] == [wire_namespace(prefix)] and bool(agents)
               and len(agents) == len(inv["hosts"]) and all(a["alive"] for a in agents))
    return {"healthy": healthy, "kind": KIND, "inventory": st["inventory"], "namespaces": st["namespaces"],
            "agents": [a for a in agents if a["alive"]], "links": st["links"],
            KIND: {"kernel": info.get("kernel"), "boot_s": info.get("boot_s"), "guests": guests}}


def _guest_links(state_dir: Path, role: str) -> dict[str, tuple[str, list[str]]]:
    try:
        out = guest_exec(["ip", "-j", "-br", "addr", "show"], role, state_dir, timeout_s=5).stdout
        return {lk["ifname"]: (lk["operstate"], [a["local"] for a in lk.get("addr_info", [])])
                for lk in json.loads(out or "[]")}
    except (LabError, ValueError, KeyError):
        return {}
