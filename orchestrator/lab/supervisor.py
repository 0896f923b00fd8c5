"""Lab supervisor: starts one agent per lab namespace, keeps them as its children, reaps them, and
stops them (by pid) on SIGTERM. Started detached by `tcplab lab up`; stopped by `tcplab lab down`."""
from __future__ import annotations

import json
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
    return argv


def main(state_dir: str) -> int:
    inv = json.loads(inventory_path(Path(state_dir)).read_text())
    children = {role: subprocess.Popen(agent_argv(role, host, inv["token_file"], inv["prefix"]),
                                       stdin=subprocess.DEVNULL)
                for role, host in inv["hosts"].items()}
    (Path(state_dir) / "agents.json").write_text(json.dumps({r: p.pid for r, p in children.items()}))
    stopping = False

    def stop(signum, frame):  # noqa: ARG001 - signal handler signature
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    while not stopping and any(p.poll() is None for p in children.values()):
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
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
