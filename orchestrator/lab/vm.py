"""The VM lab (effects): `up`, `down`, `status` for `tcplab lab up --kind vm [--vm-roles ROLES]`.

The aqm is a QEMU guest booting a Debian kernel package (orchestrator.lab.vm_image), so netem/red/
fq_codel/... exist even when the host kernel lacks them; the client and server are network namespaces
exactly as in the netns lab (same names, addresses, `to-aqm` interfaces, agents on UNIX sockets), or
guests too when chosen, so that the senders run the guest kernel (dctcp, a patched congestion control).
How guests are wired and configured is data: orchestrator.lab.vm_config.
- No data interface or address ever exists in the root namespace: a tap toward a namespace is created
  inside that namespace (vm_host.open_tap: its fd is opened after setns and handed to QEMU); guests talk
  to each other over UNIX datagram sockets. A switch is a bridge in its own namespace as in the netns lab;
  a guest's port on it is a tap born there and enslaved to the bridge.
- Host files: each guest mounts the host's `/` read-only (9p, or virtiofs for kernels without 9p) and runs
  this repository's agent with this interpreter (orchestrator.lab.vm_guest is its PID 1), wherever both
  live: those under the guest's tmpfs mounts (a clone in /tmp) are kept visible at their own path.
- Control: a QEMU user-mode NIC with restrict=on (the guest reaches nothing) forwards 127.0.0.1:PORT to
  the guest's agent: the inventory says tcp://127.0.0.1:PORT.
Each QEMU is a child of the lab supervisor (PID 1 here reaps nothing); `down` stops them by pid.
"""
from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from orchestrator.agent_client import AgentClient
from orchestrator.lab import netns, vm_disk, vm_disk_lab, vm_guest, vm_image, vm_recipe
from orchestrator.lab.netns import LAB_PREFIX, STATE_DIR, LabError, inventory_path
from orchestrator.lab.topology import (
    bridge_argv,
    lab_topology,
    namespace_argv,
    neigh_argv,
    netns_topology,
    wiring_argv,
)
from orchestrator.lab.vm_config import (
    EXEC_SOCKET,
    Nic,
    check_vm_roles,
    guest_config,
    guest_nics,
    kernel_cmdline,
    lab_macs,
    namespace_nodes,
    paths_to_keep,
    qemu_argv,
    virtiofsd_argv,
    vm_dir,
)
from orchestrator.lab.vm_host import REPO_ROOT, choose_accel, free_ports, guest_interpreter, missing_tools, open_tap
from orchestrator.plan.model.topology import Graph
from schemas import procs

VM_PROCESSES = ("qemu-", "virtiofsd-")  # supervisor children of a guest, named <kind>-<role>


def up(state_dir: Path = STATE_DIR, prefix: str = LAB_PREFIX, kernel: str | None = None,
       timeout_s: float = 180.0, vm_roles: tuple[str, ...] = ("aqm",), graph: Graph | None = None,
       disk: bool = False, modules: tuple[str, ...] = ()) -> dict:
    """The lab of `graph` (default: the quickstart's chain) with `vm_roles` as guests, the rest namespaces.
    `kernel`: a Debian kernel image package, or the path of a linux-image .deb (a tcplab build).
    `disk`: the guests are disk guests (orchestrator.lab.vm_disk_lab): real hosts booting their own disk,
    reached over SSH and provisioned by `tcplab provision`; `kernel` does not apply (they boot what their
    disk's boot entry names).
    `modules`: modules of experiments/modules/ to build for the guest kernel (cached) and give every guest's
    agent as a --module-dir (it insmods them when a plan needs them)."""
    if disk and (kernel or modules):
        raise LabError("disk guests boot the kernel their own boot entry names: install one with "
                       "`tcplab kernel install` instead of --kernel (and its modules with it) ")
    topo = netns_topology(prefix) if graph is None else lab_topology(graph, prefix)
    vm_roles = check_vm_roles(topo, vm_roles)
    deb = Path(kernel) if kernel and kernel.endswith(".deb") else None   # a `tcplab kernel build` package
    package = deb.name.split("_")[0] if deb else kernel
    if inventory_path(state_dir).exists() or netns.lab_namespaces(prefix):
        kind = lab_kind(state_dir)
        if kind != "vm" and netns.status(state_dir, prefix)["healthy"]:
            raise LabError(f"a {kind} lab is up in {state_dir}: run `tcplab lab down` first")
        if kind == "vm" and status(state_dir, prefix)["healthy"]:
            inv = json.loads(inventory_path(state_dir).read_text())
            if (package not in (None, inv["vm"].get("package")) or tuple(inv["vm"]["roles"]) != vm_roles
                    or inv.get("topology") != netns.topology_dict(topo) or bool(inv["vm"].get("disk")) != disk
                    or sorted(inv["vm"].get("modules", {})) != sorted(modules)):
                kernel = inv['vm'].get('package') or 'disk guests'
                raise LabError(f"a vm lab with {kernel}, guests {', '.join(inv['vm']['roles'])} and "
                               f"modules {', '.join(inv['vm'].get('modules', {})) or 'none'} is up: run "
                               "`tcplab lab down` first")
            return inv
        down(state_dir, prefix)
    if missing := missing_tools():
        raise LabError("the VM lab needs " + ", ".join(missing) + ": run `make vm-deps`")
    image = vm_image.ensure_image(None if deb else kernel, deb=deb)
    if modules and deb:
        raise LabError("--module builds against a Debian kernel package's headers, not a `tcplab kernel build`")
    from orchestrator.kernel import debian_modules  # the module build's own imports only when asked
    built = [debian_modules.ensure_module(m, image.package) for m in modules]
    accel = choose_accel(image)
    base = vm_disk.ensure_base_image()[0] if disk else None
    ns_roles = tuple(r for r in topo.roles if r not in vm_roles)
    nodes = namespace_nodes(topo, vm_roles)
    nics = {role: guest_nics(topo, role, vm_roles, state_dir) for role in vm_roles}
    fds: dict[tuple[str, str], int] = {}
    try:
        for argv in namespace_argv(topo, nodes) + bridge_argv(topo):
            procs.run(argv)
        # each namespace's interface toward a guest (a host's, or a switch's port) is a tap born in that
        # namespace, so that the wiring below addresses or enslaves it like the veth end it stands for
        for role in vm_roles:
            for nic in nics[role]:
                if nic.backend == "tap":
                    fds[(role, nic.ifname)] = open_tap(nic.namespace, nic.tap_ifname)
        for argv in wiring_argv(topo, nodes):
            procs.run(argv)
        ns_ends = [ep for r in ns_roles for ep in topo.endpoints(r)]
        macs = lab_macs(topo, vm_roles, {(ep.role, ep.ifname): netns.link_mac(topo.namespace(ep.role), ep.ifname)
                                         for ep in ns_ends})
        for argv in neigh_argv(topo, macs, roles=ns_roles):
            procs.run(argv)
        token_file = netns.new_token(state_dir)
        free = free_ports(2 * len(vm_roles))
        ports = dict(zip(vm_roles, free[:len(vm_roles)], strict=True))
        agents = {r: f"unix:{state_dir / f'agent-{r}.sock'}" for r in ns_roles}
        agents.update({r: f"tcp://127.0.0.1:{port}" for r, port in ports.items()})
        inv = netns.inventory_dict(topo, "vm", token_file, macs, agents,
                                   {r: topo.namespace(r) if r in ns_roles else None for r in topo.roles})
        inv["processes"], guests = [], {}
        for i, (role, port) in enumerate(ports.items()):
            cfg = guest_config(topo, role, port, macs, [str(b.ko.parent) for b in built])
            gdir = _prepare_guest_dir(state_dir, role, token_file, cfg)
            guests[role] = {"control_port": port, "console": str(gdir / "console.log")}
            if base is None:
                inv["processes"] += _processes(image, accel, gdir, topo.namespace(role), nics[role], fds, role, port)
                continue
            ssh_port = free[len(vm_roles) + i]
            inv["processes"].append(vm_disk_lab.prepare(
                state_dir, gdir, role, cfg, base, accel, nics[role], fds,
                {vm_disk_lab.SSH_PORT: ssh_port, vm_disk_lab.AGENT_PORT: port},
                cpus=int(os.environ.get("TCPLAB_VM_SMP", "1")), cpu=os.environ.get("TCPLAB_VM_CPU")))
            inv["hosts"][role]["ssh"] = vm_disk_lab.ssh_vars(state_dir, ssh_port)
            inv["hosts"][role]["agent_listen"] = vm_disk_lab.agent_listen()
            guests[role].update({"disk": str(gdir / "disk.img"), "ssh_port": ssh_port})
        vm_info = {"disk": True, "base_image": str(base)} if base else image.to_json()
        inv["vm"] = {**vm_info, "accel": accel, "roles": list(vm_roles), "guests": guests,
                     "modules": {b.name: b.to_json() for b in built}}
        return _start(state_dir, inv, list(fds.values()), timeout_s)
    except BaseException:
        for fd in fds.values():
            try:
                os.close(fd)
            except OSError:
                pass
        down(state_dir, prefix)
        raise


def _prepare_guest_dir(state_dir: Path, role: str, token_file: Path, config: dict) -> Path:
    """<state>/vm-<role>/, with guest/ (0700: token 0600, guest.json) that the guest copies at boot."""
    gdir = vm_dir(state_dir, role)
    gdir.mkdir(parents=True, exist_ok=True)
    (gdir / "guest").mkdir(mode=0o700, exist_ok=True)
    shutil.copy(token_file, gdir / "guest" / "token")
    (gdir / "guest" / "guest.json").write_text(json.dumps(config, indent=2))
    for stale in [*gdir.glob("*.sock"), *gdir.glob("console*.log"), gdir / "boots.jsonl"]:
        stale.unlink(missing_ok=True)
    return gdir


def _processes(image: vm_recipe.KernelImage, accel: str, gdir: Path, name: str, nics: list[Nic],
               fds: dict[tuple[str, str], int], role: str, port: int) -> list[dict]:
    """The supervisor's extra children for one guest: [virtiofsd,] QEMU (with its tap fds)."""
    processes = []
    share_socket = None
    if image.share == "virtiofs":
        share_socket, view = gdir / "virtiofsd.sock", gdir / "hostroot"
        view.mkdir(exist_ok=True)
        processes.append({"name": f"virtiofsd-{role}", "argv": virtiofsd_argv(view, share_socket),
                          "ready_path": str(share_socket)})
    python, needed = guest_interpreter()
    cmdline = kernel_cmdline(image.share, gdir / "guest", python, REPO_ROOT, paths_to_keep(needed))
    netdevs = [(nic.netdev(i, fds.get((role, nic.ifname))), nic.mac) for i, nic in enumerate(nics)]
    argv = qemu_argv(image, accel, cmdline, gdir, name, netdevs, port, share_socket,
                     cpus=int(os.environ.get("TCPLAB_VM_SMP", "1")), cpu=os.environ.get("TCPLAB_VM_CPU"))
    pass_fds = [fds[(role, nic.ifname)] for nic in nics if nic.backend == "tap"]
    return [*processes, {"name": f"qemu-{role}", "argv": argv, "pass_fds": pass_fds}]


def _start(state_dir: Path, inv: dict, fds: list[int], timeout_s: float) -> dict:
    """Start the supervisor (handing it the tap fds), then wait until every agent answers."""
    inventory_path(state_dir).write_text(json.dumps(inv, indent=2))
    netns.write_inventory_ini(state_dir, inv)
    started = time.monotonic()
    with open(state_dir / "lab.log", "ab") as log_file:
        sup = subprocess.Popen([sys.executable, "-m", "orchestrator.lab.supervisor", str(state_dir)],
                               stdin=subprocess.DEVNULL, stdout=log_file, stderr=log_file, pass_fds=fds,
                               start_new_session=True, cwd=str(REPO_ROOT))
    while fds:  # the supervisor and then QEMU hold them now
        os.close(fds.pop())
    inv["supervisor_pid"] = sup.pid
    inventory_path(state_dir).write_text(json.dumps(inv, indent=2))
    disk_guests = [r for r in inv["vm"]["roles"] if "ssh" in inv["hosts"][r]]
    started_agents = {**inv, "hosts": {r: h for r, h in inv["hosts"].items() if r not in disk_guests}}
    asyncio.run(netns._wait_for_agents(started_agents, Path(inv["token_file"]).read_bytes(), timeout_s, sup,
                                       check=lambda: _check_qemu(state_dir)))
    if disk_guests:   # their agents come with `tcplab provision`: until then, the lab is up when sshd answers
        ssh_s = vm_disk_lab.wait_for_ssh({r: inv["vm"]["guests"][r]["ssh_port"] for r in disk_guests}, timeout_s,
                                         check=lambda: _check_qemu(state_dir))
        for role, secs in ssh_s.items():
            inv["vm"]["guests"][role]["ssh_s"] = secs
    inv["vm"]["boot_s"] = round(time.monotonic() - started, 2)
    for role in [r for r in inv["vm"]["roles"] if r not in disk_guests]:
        inv["vm"]["guests"][role]["clock_offset_ns"] = asyncio.run(calibrate_clock(inv, state_dir, role))
    inventory_path(state_dir).write_text(json.dumps(inv, indent=2))
    return inv


async def calibrate_clock(inv: dict, state_dir: Path, role: str, rounds: int = 4, good_ns: int = 250_000,
                          step: Callable[[int], object] | None = None) -> int:
    """Measure a guest's clock offset the way the run engine does (the agent's `clock` op) and step the
    guest clock by it, until it is within `good_ns`; returns the last offset. `step(delta_ns)` steps it
    (default: over the exec port; a disk guest's goes over SSH). (The boot-time sync through QEMU's
    guestfwd only gets within a few ms.)"""
    if step is None:
        def step(delta_ns: int) -> object:
            return vm_guest.guest_request(vm_dir(state_dir, role) / EXEC_SOCKET, {"clock_step_ns": delta_ns})
    client = AgentClient(role, inv["hosts"][role]["agent"], Path(inv["token_file"]).read_bytes().strip())
    await client.connect("tcplab-lab")
    try:
        for _ in range(rounds):
            offset, _rtt = await client.clock_offset_ns(samples=9)
            if abs(offset) <= good_ns:
                break
            step(-offset)
        return offset
    finally:
        await client.close()


def guest_exec(argv: list[str], state_dir: Path = STATE_DIR, timeout_s: float = 60.0,
               role: str = "aqm") -> procs.Completed:
    """Run argv as root in a guest over its exec port (the VM's `ip netns exec`)."""
    try:
        r = vm_guest.guest_exec(vm_dir(state_dir, role) / EXEC_SOCKET, argv, timeout_s)
    except OSError as exc:
        raise LabError(f"exec in the {role} guest: {exc} (is the vm lab up, with {role} as a guest?)") from None
    return procs.Completed(argv, r["rc"], r["stdout"], r["stderr"])


def _console_tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no console log)"


def _check_qemu(state_dir: Path) -> None:
    for name, pid in netns.supervised_children(state_dir).items():
        if name.startswith(VM_PROCESSES) and not netns.pid_alive(pid):
            role = name.split("-", 1)[1]
            console = vm_dir(state_dir, role) / "console.log"
            raise LabError(f"{name} exited; see {state_dir / 'lab.log'}; {role} guest console:\n"
                           f"{_console_tail(console)}")


def _guest_dirs(state_dir: Path) -> list[Path]:
    return sorted(p for p in state_dir.glob("vm-*") if p.is_dir())


def _vm_pids(state_dir: Path) -> list[int]:
    found = {pid for name, pid in netns.supervised_children(state_dir).items() if name.startswith(VM_PROCESSES)}
    for gdir in _guest_dirs(state_dir):
        try:
            found.add(int((gdir / "qemu.pid").read_text().split()[0]))
        except (OSError, ValueError, IndexError):
            pass
    return sorted(p for p in found if netns.verified_pid(p, str(state_dir)))


def lab_kind(state_dir: Path = STATE_DIR) -> str:
    """The kind of the lab in `state_dir` (its inventory's, else what its guest directories say): every lab's
    `up` and the CLI's down/status ask this one function."""
    try:
        return json.loads(inventory_path(state_dir).read_text())["kind"]
    except (OSError, json.JSONDecodeError, KeyError):
        if any(state_dir.glob("uml-*/guest")):
            return "uml"
        live = [g for g in _guest_dirs(state_dir) if (g / "qemu.pid").exists() or (g / "guest").exists()]
        return "vm" if live else "netns"


def down(state_dir: Path = STATE_DIR, prefix: str = LAB_PREFIX) -> list[str]:
    """Stop the supervisor (which stops every QEMU), then QEMU/virtiofsd by verified pid if they outlived
    it, then everything netns.down removes; taps vanish with QEMU's fds and the namespaces. Each guest's
    console.log stays for the post-mortem."""
    vm_pids = _vm_pids(state_dir)
    sup = netns._supervisor_pid(state_dir)
    removed = []
    if sup:
        netns._kill_pids([sup], grace_s=20)
        removed.append(f"supervisor {sup}")
    left = [p for p in vm_pids if netns.verified_pid(p, str(state_dir))]
    netns._kill_pids(left)
    removed += [f"vm process {p}" for p in left]
    removed += netns.down(state_dir, prefix)
    for gdir in _guest_dirs(state_dir):
        shutil.rmtree(gdir / "guest", ignore_errors=True)
        # a disk guest's disk goes with the lab (console.log and boots.jsonl stay for the post-mortem)
        for stale in [gdir / "qemu.pid", *gdir.glob("*.sock"), gdir / "disk.img", gdir / "firmware.json"]:
            stale.unlink(missing_ok=True)
        for tree in ("boot", "hostkey"):
            shutil.rmtree(gdir / tree, ignore_errors=True)
        if (gdir / "hostroot").is_dir():
            (gdir / "hostroot").rmdir()
    return removed


def _guest_links(state_dir: Path, role: str, inv: dict) -> dict[str, tuple[str, list[str]]]:
    argv = ["ip", "-j", "-br", "addr", "show"]
    try:
        if inv["hosts"][role].get("ssh"):          # a disk guest: over SSH
            out = procs.run(vm_disk_lab.ssh_argv(inv, role, argv), check=False, timeout=15).stdout
        else:
            out = guest_exec(argv, state_dir, timeout_s=5, role=role).stdout
        return {lk["ifname"]: (lk["operstate"], [a["local"] for a in lk.get("addr_info", [])])
                for lk in json.loads(out or "[]")}
    except (LabError, ValueError, KeyError, procs.CommandFailed):
        return {}


def status(state_dir: Path = STATE_DIR, prefix: str = LAB_PREFIX) -> dict:
    st = netns.status(state_dir, prefix)
    pids = netns.supervised_children(state_dir)
    try:
        inv = json.loads(inventory_path(state_dir).read_text())
    except (OSError, json.JSONDecodeError):
        inv = {}
    v = inv.get("vm", {})
    vm_roles = v.get("roles", [])
    vm = {k: v.get(k) for k in ("package", "release", "accel", "share", "boot_s", "roles")}
    vm["guests"] = {}
    agents = [a for a in st["agents"] if a["role"] in inv.get("hosts", {}) and a["role"] not in vm_roles]
    for role in vm_roles:
        qemu = pids.get(f"qemu-{role}")
        alive = bool(qemu and netns.verified_pid(qemu, str(state_dir)))
        vm["guests"][role] = {"pid": qemu, "alive": alive, "console": v["guests"][role]["console"]}
        agents.append({"role": role, "pid": None, "alive": alive, "agent": inv["hosts"][role]["agent"]})
        seen = _guest_links(state_dir, role, inv) if alive else {}
        for ifname, i in inv["hosts"][role]["interfaces"].items():
            state, addrs = seen.get(ifname, ("?", [i["addr"]]))
            st["links"].append({"namespace": f"vm:{prefix}-{role}", "ifname": ifname, "state": state, "addr": addrs})
    # the namespace hosts' and the switches' namespaces, no more, no fewer
    built = [f"{prefix}-{n}" for n in inv.get("hosts", {}) if n not in vm_roles]
    built += [f"{prefix}-{n}" for n in (inv.get("topology") or {}).get("switches", [])]
    healthy = (inv.get("kind") == "vm" and bool(vm_roles) and sorted(st["namespaces"]) == sorted(built)
               and len(agents) == len(inv["hosts"]) and all(a["alive"] for a in agents))
    return {"healthy": healthy, "kind": "vm", "inventory": st["inventory"], "namespaces": st["namespaces"],
            "agents": [a for a in agents if a["alive"]], "links": st["links"], "vm": vm}
