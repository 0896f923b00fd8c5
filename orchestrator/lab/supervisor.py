"""Lab supervisor: starts one agent per lab namespace, plus the inventory's extra `processes` (the VM
lab's QEMU), keeps them as its children, reaps them, restarts an agent that died (killed, crashed: a
testbed host's service manager would), and stops them (by pid) on SIGTERM. Started detached by
`tcplab lab up`; stopped by `tcplab lab down`. agents.json always holds the live agents' pids."""
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
from schemas.atomic import write_atomic


def agent_argv(role: str, host: dict, token_file: str, prefix: str) -> list[str]:
    argv = ["ip", "netns", "exec", host["namespace"], sys.executable, "-m", "agents", "--name", role,
            "--listen", host["agent"], "--token-file", token_file,
            "--artifacts", str(AGENT_ARTIFACTS / prefix / role), "--trace-prefix", prefix]
    for ifname in host["interfaces"]:
        argv += ["--interface", ifname]
    for sysctl_prefix in host.get("allow_sysctl", []):     # the testbed's allow-lists (none: the agent's defaults)
        argv += ["--allow-sysctl", sysctl_prefix]
    for module in host.get("allow_module", []):
        argv += ["--allow-module", module]
    return argv


def start_processes(specs: list[dict]) -> dict[str, subprocess.Popen]:
    """Extra children in order: {name, argv, pass_fds (inherited from `lab up`), ready_path (wait for it),
    stdout (a file its output is appended to; default the supervisor's)}. The supervisor closes its copy of
    each passed fd, so the child holds the only one."""
    children = {}
    for spec in specs:
        fds = tuple(spec.get("pass_fds", ()))
        out = open(spec["stdout"], "ab") if spec.get("stdout") else None   # noqa: SIM115 - the child keeps it
        try:
            children[spec["name"]] = subprocess.Popen(spec["argv"], stdin=subprocess.DEVNULL, pass_fds=fds,
                                                      stdout=out, stderr=subprocess.STDOUT if out else None)
        finally:
            if out is not None:
                out.close()
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


RESTART_DELAY_S = 1.0
MAX_RESTARTS = 5              # per agent within RESTART_WINDOW_S; beyond, it stays down (a crash loop)
RESTART_WINDOW_S = 60.0


def restart_allowed(history: list[float], now: float) -> bool:
    """Whether an agent that died may be started again, given when it was restarted before (pure)."""
    return sum(1 for t in history if now - t < RESTART_WINDOW_S) < MAX_RESTARTS


def changed_processes(running: list[dict], wanted: list[dict]) -> list[dict]:
    """The specs of `wanted` whose process must be (re)started: new names, or another argv or output (pure)."""
    old = {spec["name"]: spec for spec in running}
    return [spec for spec in wanted if old.get(spec["name"]) != spec]


def restart_processes(children: dict[str, subprocess.Popen], specs: list[dict]) -> None:
    """Stop each spec's current process (by its Popen: never a reused pid) and start the spec in its place."""
    for spec in specs:
        old = children.get(spec["name"])
        if old is not None and old.poll() is None:
            old.terminate()
            try:
                old.wait(timeout=10)
            except subprocess.TimeoutExpired:
                old.kill()
                old.wait()
        print(f"supervisor: process restarted name={spec['name']} old_pid={old.pid if old else None}",
              file=sys.stderr, flush=True)
    children.update(start_processes(specs))


def main(state_dir: str) -> int:
    inv = json.loads(inventory_path(Path(state_dir)).read_text())
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    specs = inv.get("processes", [])
    children = start_processes(specs)
    agents = {role: agent_argv(role, host, inv["token_file"], inv["prefix"])
              for role, host in inv["hosts"].items() if host.get("namespace")}
    # the namespaces are new: a reset baseline an earlier lab's crashed agent left describes hosts that are gone
    # (--new-host drops it); an agent restarted below, on these namespaces, adopts its predecessor's
    children.update({role: subprocess.Popen([*argv, "--new-host"], stdin=subprocess.DEVNULL)
                     for role, argv in agents.items()})
    agents_file = Path(state_dir) / "agents.json"
    agents_file.write_text(json.dumps({r: p.pid for r, p in children.items()}))
    restarts: dict[str, list[float]] = {role: [] for role in agents}
    stopping = False

    def stop(signum, frame):  # noqa: ARG001 - signal handler signature
        nonlocal stopping
        stopping = True

    reload = False

    def hup(signum, frame):  # noqa: ARG001 - signal handler signature
        nonlocal reload
        reload = True

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    # SIGHUP: the inventory's `processes` changed (a UML host to restart on another kernel): restart those
    signal.signal(signal.SIGHUP, hup)
    known = {p.pid for p in children.values()}
    while not stopping and any([p.poll() is None for p in children.values()]):  # polls (reaps) every child
        reap_orphans(known)
        time.sleep(0.2)
        if reload and not stopping:
            reload = False
            wanted = json.loads(inventory_path(Path(state_dir)).read_text()).get("processes", [])
            restart_processes(children, changed_processes(specs, wanted))
            specs = wanted
            known = {p.pid for p in children.values()}
            write_atomic(agents_file, json.dumps({r: p.pid for r, p in children.items()}))
        now = time.monotonic()
        dead = [r for r in agents if children[r].poll() is not None and restart_allowed(restarts[r], now)]
        if dead and not stopping:
            time.sleep(RESTART_DELAY_S)   # its socket path is reused: let the old one's close finish
            for role in dead:
                print(f"supervisor: agent restarted host={role} old_pid={children[role].pid} "
                      f"returncode={children[role].returncode}", file=sys.stderr, flush=True)
                restarts[role].append(now)
                children[role] = subprocess.Popen(agents[role], stdin=subprocess.DEVNULL)
            known = {p.pid for p in children.values()}
            write_atomic(agents_file, json.dumps({r: p.pid for r, p in children.items()}))
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
