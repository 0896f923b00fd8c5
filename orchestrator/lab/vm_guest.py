"""Stage 2 of a VM lab guest (the aqm, and the endpoints when they are guests too): PID 1 inside the
VM, run by the host's own interpreter over the read-only shared root (stage 1 is the initramfs /init in
orchestrator.lab.vm_image).

It sets the clock from the host, names and addresses the interfaces by the MACs the host assigned
(`to-client`, `to-server` or `to-aqm`, and the control interface), writes static neighbours, turns on
forwarding (aqm) or adds the routes through the aqm (endpoints), then starts the agent as its child,
reaps every orphan (it is PID 1), and powers the VM off when the agent exits. The configuration is
/run/tcplab-vm/guest.json, written by orchestrator.lab.vm.

It also serves the exec port (virtio-serial `tcplab.exec`, a UNIX socket in the lab's state dir on the
host, so root on the host only): one JSON line {id, argv, timeout} -- or {id, clock_step_ns}, with
which `lab up` corrects the clock -- in, one JSON line {id, rc, stdout, stderr} out. It is the VM's
`ip netns exec`: `tcplab lab exec ROLE ...`, the fixture capture. Both ends of that protocol live here
(the host end imports nothing else).
"""
from __future__ import annotations

import ctypes
import fcntl
import hmac
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

RB_POWER_OFF = 0x4321FEDC
EXEC_PORT = "tcplab.exec"


def setup_argv(cfg: dict, names_by_mac: dict[str, str]) -> list[list[str]]:
    """Every command that configures the guest's network (pure). names_by_mac: current name per MAC."""
    cmds = [["ip", "link", "set", "dev", "lo", "up"]]
    for ifc in cfg["interfaces"]:
        current = names_by_mac.get(ifc["mac"].lower())
        if current is None:
            raise SystemExit(f"tcplab-guest: no interface with MAC {ifc['mac']} (have {names_by_mac})")
        if current != ifc["ifname"]:
            cmds.append(["ip", "link", "set", "dev", current, "name", ifc["ifname"]])
        if "mtu" in ifc:
            cmds.append(["ip", "link", "set", "dev", ifc["ifname"], "mtu", str(int(ifc["mtu"]))])
        cmds.append(["ip", "addr", "add", f"{ifc['addr']}/{ifc['plen']}", "dev", ifc["ifname"]])
        cmds.append(["ip", "link", "set", "dev", ifc["ifname"], "up"])
        for addr, mac in ifc.get("neighbours", []):
            cmds.append(["ip", "neigh", "replace", addr, "lladdr", mac, "dev", ifc["ifname"], "nud", "permanent"])
    cmds += [["ip", "route", "add", subnet, "via", via, "dev", dev] for subnet, via, dev in cfg.get("routes", [])]
    cmds += [["sysctl", "-eqw", f"{key}={value}"] for key, value in cfg.get("sysctls", {}).items()]
    return cmds


def clock_estimate(samples: list[tuple[int, int, int]]) -> int:
    """Offset (host realtime - guest monotonic) from (t_send_mono, host_realtime, t_recv_mono) samples,
    taking the one with the shortest round trip and assuming the host answered halfway."""
    t1, host, t2 = min(samples, key=lambda s: s[2] - s[0])
    return host - (t1 + t2) // 2


def _names_by_mac() -> dict[str, str]:
    return {(p / "address").read_text().strip().lower(): p.name for p in Path("/sys/class/net").iterdir()
            if (p / "address").exists()}


def _host_time(addr: str, port: int) -> tuple[int, int, int]:
    t1 = time.monotonic_ns()
    with socket.create_connection((addr, port), timeout=5) as s:
        data = b""
        while chunk := s.recv(64):
            data += chunk
    return t1, int(data.split()[0]), time.monotonic_ns()


def sync_clock(addr: str, port: int, tries: int = 5) -> str:
    samples = [_host_time(addr, port) for _ in range(tries)]
    offset = clock_estimate(samples)
    time.clock_settime_ns(time.CLOCK_REALTIME, time.monotonic_ns() + offset)
    rtt = min(s[2] - s[0] for s in samples)
    return f"clock set from the host (best round trip {rtt / 1e6:.1f} ms)"


def run_request(req: dict) -> dict:
    if "clock_step_ns" in req:  # the host measured our offset (as the engine does) and corrects it
        step = int(req["clock_step_ns"])
        time.clock_settime_ns(time.CLOCK_REALTIME, time.clock_gettime_ns(time.CLOCK_REALTIME) + step)
        return {"rc": 0, "stdout": f"stepped {step} ns\n", "stderr": ""}
    argv, timeout = req.get("argv"), float(req.get("timeout", 60))
    if not isinstance(argv, list) or not argv or not all(isinstance(a, str) for a in argv):
        return {"rc": 2, "stdout": "", "stderr": "exec: argv must be a non-empty list of strings"}
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False,
                              stdin=subprocess.DEVNULL)
        return {"rc": done.returncode, "stdout": done.stdout, "stderr": done.stderr}
    except FileNotFoundError as exc:
        return {"rc": 127, "stdout": "", "stderr": str(exc)}
    except subprocess.TimeoutExpired as exc:
        return {"rc": 124, "stdout": "", "stderr": f"timed out after {exc.timeout}s"}


def _exec_port() -> Path | None:
    root = Path("/sys/class/virtio-ports")
    for port in root.iterdir() if root.is_dir() else []:
        if (port / "name").read_text().strip() == EXEC_PORT:
            return Path("/dev") / port.name
    return None


def serve_exec(port: Path) -> None:
    """Forever: requests from the host, one per line. The port stays open: closing it would discard
    what a host client already sent. Reads return EOF (0) while no host client is connected; the port
    then raises SIGIO when one connects or data arrives (O_ASYNC), so the loop sleeps instead of polling."""
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGIO})
    while True:
        try:
            fd = os.open(port, os.O_RDWR)
            fcntl.fcntl(fd, fcntl.F_SETOWN, os.getpid())
            fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) | os.O_ASYNC)
            buf = b""
            while True:
                chunk = os.read(fd, 65536)
                if not chunk:
                    buf = b""
                    signal.sigtimedwait({signal.SIGIO}, 2.0)
                    continue
                buf += chunk
                while b"\n" in buf:
                    line, buf = buf.split(b"\n", 1)
                    try:
                        req = json.loads(line)
                        reply = {"id": req.get("id"), **run_request(req)}
                    except (ValueError, AttributeError) as exc:
                        reply = {"id": None, "rc": 2, "stdout": "", "stderr": f"exec: bad request: {exc}"}
                    data = memoryview(json.dumps(reply).encode() + b"\n")
                    while data:
                        data = data[os.write(fd, data):]
        except OSError:
            time.sleep(0.5)


MAX_REQUEST = 1 << 20          # one request line over TCP; argv is all it carries


def serve_exec_tcp(addr: str, port: int, token: bytes) -> None:
    """Forever: the exec protocol on addr:port (a UML host's control address: it has no virtio-serial port).
    One client at a time; a request must carry the lab's token (`token` field), compared in constant time.
    The control network exists only inside the lab's own namespace; the token keeps the other hosts out."""
    with socket.create_server((addr, port), backlog=4) as server:
        while True:
            conn, _ = server.accept()
            with conn:
                conn.settimeout(30)
                try:
                    _serve_exec_conn(conn, token)
                except (OSError, ValueError):
                    pass


def _serve_exec_conn(conn: socket.socket, token: bytes) -> None:
    buf = b""
    while len(buf) <= MAX_REQUEST:
        chunk = conn.recv(65536)
        if not chunk:
            return
        buf += chunk
        while b"\n" in buf:
            line, buf = buf.split(b"\n", 1)
            req = json.loads(line)
            if not isinstance(req, dict) or not hmac.compare_digest(str(req.pop("token", "")).encode(), token):
                conn.sendall(json.dumps({"id": None, "rc": 13, "stdout": "",
                                         "stderr": "exec: bad or missing token"}).encode() + b"\n")
                return
            conn.sendall(json.dumps({"id": req.get("id"), **run_request(req)}).encode() + b"\n")


def guest_exec(socket_path: Path, argv: list[str], timeout_s: float = 60.0) -> dict:
    """Host end: run argv in the guest; {rc, stdout, stderr}."""
    return guest_request(socket_path, {"argv": argv, "timeout": timeout_s}, timeout_s + 15)


def guest_request(socket_path: Path | socket.socket, request: dict, timeout_s: float = 30.0) -> dict:
    """Host end of one request, over the guest's exec socket path or a socket already connected to its exec
    port (it is closed afterwards). Replies meant for an earlier client (one that gave up) carry another
    id and are skipped."""
    req_id = os.urandom(8).hex()
    sock = socket_path if isinstance(socket_path, socket.socket) else socket.socket(socket.AF_UNIX)
    with sock as s:
        s.settimeout(timeout_s)
        if not isinstance(socket_path, socket.socket):
            s.connect(str(socket_path))
        s.sendall(json.dumps({**request, "id": req_id}).encode() + b"\n")
        buf = b""
        while True:
            chunk = s.recv(65536)
            if not chunk:
                raise ConnectionError("the guest closed the exec port without an answer")
            buf += chunk
            while b"\n" in buf:
                line, buf = buf.split(b"\n", 1)
                reply = json.loads(line)
                if reply.get("id") == req_id:
                    return reply


def _token_file(cfg: dict) -> str:
    agent = cfg["agent"]
    return agent[agent.index("--token-file") + 1]


def say(msg: str) -> None:
    print(f"tcplab-guest: [{time.clock_gettime(time.CLOCK_BOOTTIME):.2f}] {msg}", flush=True)


def main(config_path: str) -> int:
    cfg = json.loads(Path(config_path).read_text())
    Path("/proc/sys/kernel/hostname").write_text(cfg.get("hostname", "tcplab-guest"))
    for argv in setup_argv(cfg, _names_by_mac()):
        done = subprocess.run(argv, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            say(f"{' '.join(argv)}: {done.stderr.strip()}")
    if cfg.get("clock"):  # over the control interface, so after the network is up
        try:
            say(sync_clock(*cfg["clock"]))
        except (OSError, ValueError, IndexError) as exc:
            say(f"clock not set from the host: {exc}")
    port = _exec_port()
    if port and os.fork() == 0:  # its children are its own; PID 1 below reaps only what it leaves
        serve_exec(port)
        os._exit(0)
    if cfg.get("exec_listen"):
        addr, tcp_port = cfg["exec_listen"]
        port = f"tcp {addr}:{tcp_port}"
        if os.fork() == 0:
            serve_exec_tcp(addr, int(tcp_port), Path(_token_file(cfg)).read_bytes().strip())
            os._exit(0)
    agent = subprocess.Popen([sys.executable, "-m", "agents", *cfg["agent"]], stdin=subprocess.DEVNULL)
    say(f"network configured; exec port {port}; agent pid {agent.pid}")
    while True:  # PID 1: reap everything; the agent's exit ends the VM
        try:
            pid, status = os.wait()
        except ChildProcessError:
            break
        if pid == agent.pid:
            say(f"agent exited (status {status}); powering off")
            break
    os.sync()
    ctypes.CDLL(None, use_errno=True).reboot(RB_POWER_OFF)
    return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
