"""The VM lab (effects): `up`, `down`, `status` for `tcplab lab up --kind vm`.

Hybrid: client and server are network namespaces exactly as in the netns lab (same names, addresses,
`to-aqm` interfaces, agents on UNIX sockets); the aqm is a QEMU guest booting a Debian kernel package
(orchestrator.lab.vm_image), so netem/red/fq_codel/... exist even when the host kernel lacks them.
- Data links: each namespace's `to-aqm` is a tap created *inside* that namespace (its fd is opened after
  setns and handed to QEMU), so no data interface or address ever exists in the root namespace.
- Host files: the guest mounts the host's `/` read-only (9p, or virtiofs for kernels without 9p) and
  runs this repository's agent with this interpreter (orchestrator.lab.vm_guest is its PID 1).
- Control: a QEMU user-mode NIC with restrict=on (the guest reaches nothing) forwards
  127.0.0.1:PORT to the guest agent: the inventory says tcp://127.0.0.1:PORT.
QEMU is a child of the lab supervisor (PID 1 here reaps nothing); `down` stops it by pid.
"""
from __future__ import annotations

import asyncio
import ctypes
import fcntl
import json
import logging
import os
import re
import secrets
import shutil
import socket
import struct
import subprocess
import sys
import time
from pathlib import Path

from agents import procs
from orchestrator.agent_client import AgentClient
from orchestrator.lab import netns, vm_guest, vm_image
from orchestrator.lab.netns import AGENT_ARTIFACTS, LAB_PREFIX, STATE_DIR, LabError, inventory_path
from orchestrator.lab.topology import Topology, address_argv, namespace_argv, neigh_argv, netns_topology, route_argv

log = logging.getLogger("tcplab.lab")
REPO_ROOT = Path(__file__).resolve().parents[2]
QEMU = "qemu-system-x86_64"
VIRTIOFSD = "/usr/lib/qemu/virtiofsd"  # QEMU 7.2's C daemon (package qemu-system-common)
GUEST_MACS = {"to-client": "52:54:00:7c:01:fe", "to-server": "52:54:00:7c:02:fe"}
CONTROL_MAC, CONTROL_ADDR = "52:54:00:7c:00:fe", "10.0.2.15"  # QEMU user-mode network defaults
CLOCK_ADDR, CLOCK_PORT = "10.0.2.100", 37  # guestfwd: each connection runs `date` on the host
GUEST_TMPFS = ("/tmp", "/var/tmp", "/run", "/dev/shm")  # vm_image.INIT_SCRIPT mounts these
SAFE_PATH = re.compile(r"^/[A-Za-z0-9._/+-]*$")  # goes onto the kernel command line and into -serial file:
TUNSETIFF, IFF_TAP, IFF_NO_PI, CLONE_NEWNET = 0x400454CA, 0x0002, 0x1000, 0x40000000


# ---------------------------------------------------------------- pure: guest config and QEMU argv
def guest_config(topo: Topology, port: int, tap_macs: dict[str, str]) -> dict:
    """/run/tcplab-vm/guest.json for orchestrator.lab.vm_guest; tap_macs[role] = MAC of that `to-aqm`."""
    interfaces = [{"ifname": ep.ifname, "mac": GUEST_MACS[ep.ifname], "addr": ep.addr, "plen": ep.plen,
                   "neighbours": [[topo.peer(ep).addr, tap_macs[topo.peer(ep).role]]]}
                  for ep in topo.endpoints("aqm")]
    interfaces.append({"ifname": "ctl", "mac": CONTROL_MAC, "addr": CONTROL_ADDR, "plen": 24, "neighbours": []})
    agent = ["--name", "aqm", "--listen", f"tcp://{CONTROL_ADDR}:{port}", "--token-file", "/run/tcplab-vm/token",
             "--artifacts", str(AGENT_ARTIFACTS / topo.prefix / "aqm")]
    for ep in topo.endpoints("aqm"):
        agent += ["--interface", ep.ifname]
    return {"hostname": topo.namespace("aqm"), "interfaces": interfaces,
            "sysctls": {"net.ipv4.ip_forward": "1"}, "clock": [CLOCK_ADDR, CLOCK_PORT], "agent": agent}


def kernel_cmdline(share: str, guest_dir: Path, python: str, repo: Path) -> str:
    for path in (str(guest_dir), python, str(repo)):
        if not SAFE_PATH.match(path):
            raise LabError(f"{path!r}: the VM lab needs paths without spaces, commas or shell characters")
    for path in (python, str(Path(python).resolve()), str(repo)):
        if any(path == d or path.startswith(f"{d}/") for d in GUEST_TMPFS):
            raise LabError(f"{path}: the aqm guest mounts tmpfs over {', '.join(GUEST_TMPFS)} and could not run it; "
                           "use an interpreter and repository outside them")
    # clocksource=hpet: QEMU's HPET runs on the host's clock; the guest's own TSC calibration under TCG is
    # ~10 ppm off (0.7 ms/min of drift), HPET reads cost no measurable throughput
    return (f"console=ttyS0 panic=-1 quiet mitigations=off clocksource=hpet tcplab.share={share} "
            f"tcplab.guest={guest_dir} tcplab.python={python} tcplab.repo={repo}")


def qemu_argv(image: vm_image.KernelImage, accel: str, cmdline: str, state_dir: Path, name: str,
              nics: list[tuple[int, str]], port: int, share_socket: Path | None = None,
              memory_mb: int = 1024, cpus: int = 1, cpu: str | None = None) -> list[str]:
    """The aqm guest. nics: (tap fd, guest MAC) in order; the control NIC is QEMU's user-mode network."""
    argv = [QEMU, "-name", f"{name},process={name}", "-nodefaults", "-no-user-config", "-display", "none",
            "-no-reboot", "-accel", accel, "-cpu", cpu or ("qemu64" if accel == "tcg" else "host"),
            "-m", str(memory_mb), "-smp", str(cpus), "-kernel", str(image.vmlinuz), "-initrd", str(image.initramfs),
            "-append", cmdline, "-serial", f"file:{state_dir / 'console.log'}",
            "-pidfile", str(state_dir / "qemu.pid")]
    if image.share == "9p":
        argv += ["-virtfs", "local,path=/,mount_tag=hostroot,readonly=on,security_model=none,multidevs=remap"]
    else:
        argv += ["-chardev", f"socket,id=vfs,path={share_socket}",
                 "-device", "vhost-user-fs-pci,chardev=vfs,tag=hostroot",
                 "-object", f"memory-backend-memfd,id=mem,size={memory_mb}M,share=on", "-numa", "node,memdev=mem"]
    argv += ["-device", "virtio-serial-pci,id=vser",
             "-chardev", f"socket,id=exec,path={state_dir / 'exec.sock'},server=on,wait=off",
             "-device", f"virtserialport,bus=vser.0,chardev=exec,name={vm_guest.EXEC_PORT}"]
    for i, (fd, mac) in enumerate(nics):
        argv += ["-netdev", f"tap,id=data{i},fd={fd}", "-device", f"virtio-net-pci,netdev=data{i},mac={mac},romfile="]
    ctl = (f"user,id=ctl,restrict=on,ipv6=off,hostfwd=tcp:127.0.0.1:{port}-{CONTROL_ADDR}:{port},"
           f"guestfwd=tcp:{CLOCK_ADDR}:{CLOCK_PORT}-cmd:date +%s%N")
    return argv + ["-netdev", ctl, "-device", f"virtio-net-pci,netdev=ctl,mac={CONTROL_MAC},romfile="]


def virtiofsd_argv(view: Path, socket_path: Path) -> list[str]:
    """virtiofsd (QEMU 7.2's C daemon has no read-only mode) serving a read-only bind of the host's `/`
    made in a private mount namespace: the guest cannot write the host through it."""
    script = ('set -e; mount --rbind / "$1"; mount --make-rslave "$1"; '
              'for m in $(findmnt -Rrno TARGET "$1"); do mount -o remount,bind,ro "$m" || true; done; '
              'exec "$2" --socket-path="$3" -o source="$1" -o cache=auto -o sandbox=namespace')
    return ["unshare", "--mount", "--propagation", "private", "sh", "-c", script, "virtiofsd", str(view),
            VIRTIOFSD, str(socket_path)]


# ---------------------------------------------------------------- effects
def open_tap(namespace: str, ifname: str) -> int:
    """A tap named `ifname` created inside `namespace` (it lives as long as an fd to it is open)."""
    libc = ctypes.CDLL(None, use_errno=True)
    own = os.open("/proc/self/ns/net", os.O_RDONLY)
    target = os.open(f"/run/netns/{namespace}", os.O_RDONLY)
    try:
        if libc.setns(target, CLONE_NEWNET) != 0:
            raise LabError(f"setns {namespace}: {os.strerror(ctypes.get_errno())}")
        try:
            fd = os.open("/dev/net/tun", os.O_RDWR)
            fcntl.ioctl(fd, TUNSETIFF, struct.pack("16sH22x", ifname.encode(), IFF_TAP | IFF_NO_PI))
        finally:
            if libc.setns(own, CLONE_NEWNET) != 0:  # never leave this process in the lab namespace
                raise SystemExit(f"setns back to the root namespace failed: {os.strerror(ctypes.get_errno())}")
    finally:
        os.close(own)
        os.close(target)
    return fd


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _qemu_version() -> str:
    return procs.run([QEMU, "--version"]).stdout.splitlines()[0]


def choose_accel(image: vm_image.KernelImage) -> str:
    """KVM only if a test boot with it reaches the initramfs (result cached per host kernel and QEMU)."""
    forced = os.environ.get("TCPLAB_VM_ACCEL")
    if forced in ("tcg", "kvm"):
        return forced
    if not os.access("/dev/kvm", os.R_OK | os.W_OK):
        return "tcg"
    key = f"{os.uname().release} {_qemu_version()}"
    cache = vm_image.CACHE_ROOT / "accel.json"
    known = json.loads(cache.read_text()) if cache.exists() else {}
    if key not in known:
        argv = [QEMU, "-nodefaults", "-no-user-config", "-display", "none", "-no-reboot", "-accel", "kvm",
                "-cpu", "host", "-m", "256", "-kernel", str(image.vmlinuz), "-initrd", str(image.initramfs),
                "-append", "console=ttyS0 panic=-1 tcplab.probe=1", "-serial", "stdio"]
        try:
            out = subprocess.run(argv, capture_output=True, text=True, timeout=20, check=False).stdout
        except subprocess.TimeoutExpired:
            out = ""
        known[key] = "kvm" if "tcplab-init: probe ok" in out else "tcg"
        cache.write_text(json.dumps(known, indent=2))
        log.info("kvm test boot: %s", known[key])
    return known[key]


def missing_tools() -> list[str]:
    need = {QEMU: "qemu-system-x86", str(vm_image.BUSYBOX): "busybox-static"}
    return [f"{tool} (apt: {pkg})" for tool, pkg in need.items() if not shutil.which(tool)]


def up(state_dir: Path = STATE_DIR, prefix: str = LAB_PREFIX, kernel: str | None = None,
       timeout_s: float = 180.0) -> dict:
    if inventory_path(state_dir).exists() or netns.lab_namespaces(prefix):
        kind = lab_kind(state_dir)
        if kind != "vm" and netns.status(state_dir, prefix)["healthy"]:
            raise LabError(f"a {kind} lab is up in {state_dir}: run `tcplab lab down` first")
        if kind == "vm" and status(state_dir, prefix)["healthy"]:
            inv = json.loads(inventory_path(state_dir).read_text())
            if kernel not in (None, inv["vm"]["package"]):
                raise LabError(f"a vm lab with {inv['vm']['package']} is up: run `tcplab lab down` first")
            return inv
        down(state_dir, prefix)
    if missing := missing_tools():
        raise LabError("the VM lab needs " + ", ".join(missing) + ": run `make vm-deps`")
    image = vm_image.ensure_image(kernel)
    accel = choose_accel(image)
    topo = netns_topology(prefix)
    ends = [ep for role in ("client", "server") for ep in topo.endpoints(role)]
    fds: list[int] = []
    try:
        for argv in namespace_argv(topo, ("client", "server")):
            procs.run(argv)
        for ep in ends:  # each namespace's `to-aqm` is a tap born in that namespace
            fds.append(open_tap(topo.namespace(ep.role), ep.ifname))
            for argv in address_argv(topo, ep):
                procs.run(argv)
        for argv in route_argv(topo):
            procs.run(argv)
        macs = {(ep.role, ep.ifname): netns.link_mac(topo.namespace(ep.role), ep.ifname) for ep in ends}
        macs.update({("aqm", ep.ifname): GUEST_MACS[ep.ifname] for ep in topo.endpoints("aqm")})
        for argv in neigh_argv(topo, macs, roles=("client", "server")):
            procs.run(argv)
        state_dir.mkdir(parents=True, exist_ok=True)
        token_file = state_dir / "token"
        token_file.touch(mode=0o600)
        token_file.write_text(secrets.token_hex(32))
        port = free_port()
        guest_dir = state_dir / "guest"  # what the guest copies at boot: 0700, token 0600
        guest_dir.mkdir(mode=0o700, exist_ok=True)
        shutil.copy(token_file, guest_dir / "token")
        tap_macs = {ep.role: macs[(ep.role, ep.ifname)] for ep in ends}
        (guest_dir / "guest.json").write_text(json.dumps(guest_config(topo, port, tap_macs), indent=2))
        agents = {r: f"unix:{state_dir / f'agent-{r}.sock'}" for r in ("client", "server")}
        inv = netns.inventory_dict(topo, "vm", token_file, macs, {**agents, "aqm": f"tcp://127.0.0.1:{port}"},
                                   {"client": topo.namespace("client"), "server": topo.namespace("server"),
                                    "aqm": None})
        nics = [(fd, GUEST_MACS[topo.peer(ep).ifname]) for fd, ep in zip(fds, ends, strict=True)]
        inv["processes"] = _processes(image, accel, state_dir, guest_dir, topo.namespace("aqm"), nics, port)
        inv["vm"] = {**image.to_json(), "accel": accel, "control_port": port,
                     "console": str(state_dir / "console.log"), "pidfile": str(state_dir / "qemu.pid")}
        return _start(state_dir, inv, fds, timeout_s)
    except BaseException:
        for fd in fds:
            try:
                os.close(fd)
            except OSError:
                pass
        down(state_dir, prefix)
        raise


def _processes(image: vm_image.KernelImage, accel: str, state_dir: Path, guest_dir: Path, name: str,
               nics: list[tuple[int, str]], port: int) -> list[dict]:
    """The supervisor's extra children: [virtiofsd,] QEMU (with the tap fds)."""
    processes = []
    share_socket = None
    if image.share == "virtiofs":
        share_socket, view = state_dir / "virtiofsd.sock", state_dir / "hostroot"
        view.mkdir(exist_ok=True)
        share_socket.unlink(missing_ok=True)
        processes.append({"name": "virtiofsd", "argv": virtiofsd_argv(view, share_socket),
                          "ready_path": str(share_socket)})
    cmdline = kernel_cmdline(image.share, guest_dir, sys.executable, REPO_ROOT)
    argv = qemu_argv(image, accel, cmdline, state_dir, name, nics, port, share_socket,
                     cpus=int(os.environ.get("TCPLAB_VM_SMP", "1")), cpu=os.environ.get("TCPLAB_VM_CPU"))
    return [*processes, {"name": "qemu", "argv": argv, "pass_fds": [fd for fd, _ in nics]}]


def _start(state_dir: Path, inv: dict, fds: list[int], timeout_s: float) -> dict:
    """Start the supervisor (handing it the tap fds), then wait until all three agents answer."""
    (state_dir / "console.log").unlink(missing_ok=True)
    inventory_path(state_dir).write_text(json.dumps(inv, indent=2))
    started = time.monotonic()
    with open(state_dir / "lab.log", "ab") as log_file:
        sup = subprocess.Popen([sys.executable, "-m", "orchestrator.lab.supervisor", str(state_dir)],
                               stdin=subprocess.DEVNULL, stdout=log_file, stderr=log_file, pass_fds=fds,
                               start_new_session=True, cwd=str(REPO_ROOT))
    while fds:  # the supervisor and then QEMU hold them now
        os.close(fds.pop())
    inv["supervisor_pid"] = sup.pid
    inventory_path(state_dir).write_text(json.dumps(inv, indent=2))
    asyncio.run(netns._wait_for_agents(inv, Path(inv["token_file"]).read_bytes(), timeout_s, sup,
                                       check=lambda: _check_qemu(state_dir)))
    inv["vm"]["boot_s"] = round(time.monotonic() - started, 2)
    inv["vm"]["clock_offset_ns"] = asyncio.run(calibrate_clock(inv, state_dir))
    inventory_path(state_dir).write_text(json.dumps(inv, indent=2))
    return inv


async def calibrate_clock(inv: dict, state_dir: Path, rounds: int = 4, good_ns: int = 250_000) -> int:
    """Measure the guest's clock offset the way the run engine does (the agent's `clock` op) and step
    the guest clock by it over the exec port, until it is within `good_ns`; returns the last offset.
    (The boot-time sync through QEMU's guestfwd only gets within a few ms.)"""
    client = AgentClient("aqm", inv["hosts"]["aqm"]["agent"], Path(inv["token_file"]).read_bytes().strip())
    await client.connect("tcplab-lab")
    try:
        for _ in range(rounds):
            offset, _rtt = await client.clock_offset_ns(samples=9)
            if abs(offset) <= good_ns:
                break
            vm_guest.guest_request(state_dir / "exec.sock", {"clock_step_ns": -offset})
        return offset
    finally:
        await client.close()


def guest_exec(argv: list[str], state_dir: Path = STATE_DIR, timeout_s: float = 60.0) -> procs.Completed:
    """Run argv as root in the aqm guest over the exec port (the VM's `ip netns exec`)."""
    try:
        r = vm_guest.guest_exec(state_dir / "exec.sock", argv, timeout_s)
    except OSError as exc:
        raise LabError(f"exec in the aqm guest: {exc} (is the vm lab up?)") from None
    return procs.Completed(argv, r["rc"], r["stdout"], r["stderr"])


def _console_tail(state_dir: Path, lines: int = 15) -> str:
    try:
        return "\n".join((state_dir / "console.log").read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no console log)"


def _check_qemu(state_dir: Path) -> None:
    pids = _children(state_dir)
    for name in ("virtiofsd", "qemu"):
        if name in pids and not netns.pid_alive(pids[name]):
            raise LabError(f"{name} exited; see {state_dir / 'lab.log'}; guest console:\n{_console_tail(state_dir)}")


def _children(state_dir: Path) -> dict[str, int]:
    try:
        return json.loads((state_dir / "agents.json").read_text())
    except (OSError, json.JSONDecodeError):
        return {}


def _verified(pid: int | None, marker: str) -> int | None:
    """pid, if that process is alive and its command line names `marker` (never kill a reused pid)."""
    try:
        return pid if pid and netns.pid_alive(pid) and marker.encode() in Path(f"/proc/{pid}/cmdline").read_bytes() \
            else None
    except OSError:
        return None


def _vm_pids(state_dir: Path) -> list[int]:
    pids = _children(state_dir)
    found = {pids.get("qemu"), pids.get("virtiofsd")}
    try:
        found.add(int((state_dir / "qemu.pid").read_text().split()[0]))
    except (OSError, ValueError, IndexError):
        pass
    return sorted(p for p in found if _verified(p, str(state_dir)))


def lab_kind(state_dir: Path = STATE_DIR) -> str:
    try:
        return json.loads(inventory_path(state_dir).read_text())["kind"]
    except (OSError, json.JSONDecodeError, KeyError):
        return "vm" if (state_dir / "qemu.pid").exists() or (state_dir / "guest").exists() else "netns"


def down(state_dir: Path = STATE_DIR, prefix: str = LAB_PREFIX) -> list[str]:
    """Stop the supervisor (which stops QEMU), then QEMU/virtiofsd by verified pid if they outlived it,
    then everything netns.down removes; the taps vanish with QEMU's fds and the namespaces."""
    vm_pids = _vm_pids(state_dir)
    sup = netns._supervisor_pid(state_dir)
    removed = []
    if sup:
        netns._kill_pids([sup], grace_s=20)
        removed.append(f"supervisor {sup}")
    left = [p for p in vm_pids if _verified(p, str(state_dir))]
    netns._kill_pids(left)
    removed += [f"vm process {p}" for p in left]
    removed += netns.down(state_dir, prefix)
    shutil.rmtree(state_dir / "guest", ignore_errors=True)
    for name in ("qemu.pid", "virtiofsd.sock", "exec.sock"):
        (state_dir / name).unlink(missing_ok=True)
    if (state_dir / "hostroot").is_dir():
        (state_dir / "hostroot").rmdir()
    return removed


def _guest_links(state_dir: Path) -> dict[str, tuple[str, list[str]]]:
    try:
        out = guest_exec(["ip", "-j", "-br", "addr", "show"], state_dir, timeout_s=5).stdout
        return {lk["ifname"]: (lk["operstate"], [a["local"] for a in lk.get("addr_info", [])])
                for lk in json.loads(out or "[]")}
    except (LabError, ValueError, KeyError):
        return {}


def status(state_dir: Path = STATE_DIR, prefix: str = LAB_PREFIX) -> dict:
    st = netns.status(state_dir, prefix)
    pids = _children(state_dir)
    try:
        inv = json.loads(inventory_path(state_dir).read_text())
    except (OSError, json.JSONDecodeError):
        inv = {}
    vm = {k: inv.get("vm", {}).get(k) for k in ("package", "release", "accel", "share", "console", "boot_s")}
    qemu = pids.get("qemu")
    vm.update({"pid": qemu, "alive": bool(qemu and _verified(qemu, str(state_dir)))})
    agents = [a for a in st["agents"] if a["role"] in ("client", "server")]
    if inv.get("hosts"):
        agents.append({"role": "aqm", "pid": None, "alive": vm["alive"], "agent": inv["hosts"]["aqm"]["agent"]})
        seen = _guest_links(state_dir) if vm["alive"] else {}
        for ifname, i in inv["hosts"]["aqm"]["interfaces"].items():
            state, addrs = seen.get(ifname, ("?", [i["addr"]]))
            st["links"].append({"namespace": f"vm:{prefix}-aqm", "ifname": ifname, "state": state, "addr": addrs})
    healthy = (inv.get("kind") == "vm" and vm["alive"] and len(st["namespaces"]) == 2
               and len(agents) == 3 and all(a["alive"] for a in agents))
    return {"healthy": healthy, "kind": "vm", "inventory": st["inventory"], "namespaces": st["namespaces"],
            "agents": [a for a in agents if a["alive"]], "links": st["links"], "vm": vm}
