"""Lab supervisor: starts one agent per lab namespace, plus the inventory's extra `processes` (the VM
lab's QEMU), keeps them as its children, reaps them, and stops them (by pid) on SIGTERM. Started
detached by `tcplab lab up`; stopped by `tcplab lab down`."""
from __future__ import annotations

import ctypes
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from orchestrator.lab.netns import AGENT_ARTIFACTS, inventory_path


def agent_argv(role: str, host: dict, token_file: str, prefix: str) -> list[str]:
    argv = ["ip", "netns", "exec", host["namespace"], sys.executable, "-m", "agents", "--name", role,
            "--listen", host["agent"], "--token-file", token_file,
            "--artifacts", str(AGENT_ARTIFACTS / prefix / role)]
    for ifname in host["interfaces"]:
        argv += ["--interface", ifname]
    for sysctl_prefix in host.get("allow_sysctl", []):     # the testbed's allow-lists (none: the agent's defaults)
        argv += ["--allow-sysctl", sysctl_prefix]
    for module in host.get("allow_module", []):
        argv += ["--allow-module", module]
    return argv


def start_processes(specs: list[dict]) -> dict[str, subprocess.Popen]:
    """Extra children in order: {name, argv, pass_fds (inherited from `lab up`), ready_path (wait for it)}.
    The supervisor closes its copy of each passed fd, so the child holds the only one."""
    children = {}
    for spec in specs:
        fds = tuple(spec.get("pass_fds", ()))
        children[spec["name"]] = subprocess.Popen(spec["argv"], stdin=subprocess.DEVNULL, pass_fds=fds)
        for fd in fds:
            os.close(fd)
        deadline = time.monotonic() + 15
        while spec.get("ready_path") and not Path(spec["ready_path"]).exists() and time.monotonic() < deadline:
            time.sleep(0.05)
    return children


PR_SET_CHILD_SUBREAPER = 36


def reap_orphans(known: set[int]) -> None:
    """Reap exited descendants re-parented here (we are a child subreaper: PID 1 here reaps nothing),
    leaving our own children (`known`) to their Popen objects."""
    while True:
        try:
            info = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:
            return
        if info is None or info.si_pid in known:
            return
        os.waitpid(info.si_pid, 0)


def main(state_dir: str) -> int:
    inv = json.loads(inventory_path(Path(state_dir)).read_text())
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    children = start_processes(inv.get("processes", []))
    children.update({role: subprocess.Popen(agent_argv(role, host, inv["token_file"], inv["prefix"]),
                                            stdin=subprocess.DEVNULL)
                     for role, host in inv["hosts"].items() if host.get("namespace")})
    (Path(state_dir) / "agents.json").write_text(json.dumps({r: p.pid for r, p in children.items()}))
    stopping = False

    def stop(signum, frame):  # noqa: ARG001 - signal handler signature
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    known = {p.pid for p in children.values()}
    while not stopping and any([p.poll() is None for p in children.values()]):  # polls (reaps) every child
        reap_orphans(known)
        time.sleep(0.2)
    for p in children.values():
        if p.poll() is None:
            p.terminate()
    deadline = time.monotonic() + 15
    for p in children.values():
        try:
            p.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
    deadline = time.monotonic() + 3  # grandchildren that outlived their parent (virtiofsd's sandbox)
    while time.monotonic() < deadline:
        try:
            if os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG) is None:
                time.sleep(0.05)
        except ChildProcessError:
            break
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
