"""Disk guests in the VM lab (effects): `tcplab lab up --kind vm --disk`.

A disk guest is provisioned like a physical host, not started ready-made: `lab up` gives it its own copy of
the Debian base image (orchestrator.lab.vm_disk), writes onto it the host's name, the lab's SSH key, its own
host key and its network as the lab wired it, and powers it on through the lab's firmware
(orchestrator.lab.vm_firmware), which boots what the guest's GRUB environment names. The lab then waits for
sshd, not for an agent: `tcplab provision` runs playbooks/site.yml over SSH, which installs and starts the
agent (as a systemd unit) exactly as on hardware. The inventory carries each guest's SSH access (QEMU
forwards a loopback port to the guest's sshd, another to its agent).
"""
from __future__ import annotations

import json
import shlex
import socket
import sys
import time
from collections.abc import Callable
from pathlib import Path

from orchestrator.lab import vm_disk, vm_disk_recipe
from orchestrator.lab.netns import LabError
from orchestrator.lab.vm_config import CONTROL_ADDR, Nic, disk_qemu_argv

SSH_PORT = 22
AGENT_PORT = 7717
AGENT_ARTIFACTS = "/var/lib/tcplab/artifacts"
LAB_KEY = "lab_ed25519"


def lab_ssh_key(state_dir: Path) -> tuple[Path, str]:
    return vm_disk.ssh_keypair(state_dir / "ssh", LAB_KEY)


def prepare(state_dir: Path, gdir: Path, role: str, cfg: dict, base: Path, accel: str, nics: list[Nic],
            fds: dict[tuple[str, str], int], ports: dict[int, int], cpus: int, cpu: str | None) -> dict:
    """The guest's disk and firmware.json; returns the supervisor's process spec (the firmware)."""
    _key, public = lab_ssh_key(state_dir)
    keys = vm_disk.host_keys(gdir / "hostkey")
    disk = gdir / "disk.img"
    if not disk.exists():                      # a guest keeps its disk (what was installed) until `lab down`
        vm_disk.make_guest_disk(base, disk, vm_disk_recipe.guest_files(cfg, public, keys))
    netdevs = [(nic.netdev(i, fds.get((role, nic.ifname))), nic.mac) for i, nic in enumerate(nics)]
    argv = disk_qemu_argv(accel, disk, gdir, cfg["hostname"], netdevs, ports, cpus=cpus, cpu=cpu)
    pass_fds = [fds[(role, nic.ifname)] for nic in nics if nic.backend == "tap"]
    (gdir / "firmware.json").write_text(json.dumps({"disk": str(disk), "argv": argv, "pass_fds": pass_fds,
                                                    "cmdline": vm_disk_recipe.boot_cmdline()}, indent=2))
    known_hosts = state_dir / "ssh" / "known_hosts"
    line = f"[127.0.0.1]:{ports[SSH_PORT]} {keys['ssh_host_ed25519_key.pub'].decode().split(' tcplab')[0].strip()}\n"
    existing = known_hosts.read_text() if known_hosts.exists() else ""
    known_hosts.write_text("".join(x + "\n" for x in existing.splitlines()
                                   if not x.startswith(f"[127.0.0.1]:{ports[SSH_PORT]} ")) + line)
    return {"name": f"qemu-{role}", "argv": [sys.executable, "-m", "orchestrator.lab.vm_firmware", str(gdir)],
            "pass_fds": pass_fds}


def ssh_vars(state_dir: Path, port: int) -> dict[str, str]:
    """Ansible's connection variables for a guest (its forwarded sshd on loopback, the lab's key)."""
    key, _ = lab_ssh_key(state_dir)
    return {"ansible_host": "127.0.0.1", "ansible_port": str(port), "ansible_user": "root",
            "ansible_ssh_private_key_file": str(key),
            "ansible_ssh_common_args": f"-o UserKnownHostsFile={state_dir / 'ssh' / 'known_hosts'} "
                                       "-o StrictHostKeyChecking=yes -o ControlMaster=auto -o ControlPersist=120s"}


def agent_listen(port: int = AGENT_PORT) -> str:
    return f"tcp://{CONTROL_ADDR}:{port}"


def ssh_ready(port: int, timeout_s: float = 2.0) -> bool:
    """sshd's banner on the forwarded port (QEMU accepts the TCP connection before the guest listens)."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout_s) as s:
            s.settimeout(timeout_s)
            return s.recv(64).startswith(b"SSH-")
    except OSError:
        return False


def wait_for_ssh(ports: dict[str, int], timeout_s: float, check: Callable[[], None]) -> dict[str, float]:
    """Until every guest's sshd answers; returns seconds to each."""
    started, ready = time.monotonic(), {}
    while len(ready) < len(ports):
        check()
        for role, port in ports.items():
            if role not in ready and ssh_ready(port):
                ready[role] = round(time.monotonic() - started, 1)
        if time.monotonic() - started > timeout_s:
            missing = sorted(set(ports) - set(ready))
            raise LabError(f"sshd of guest(s) {', '.join(missing)} did not answer within {timeout_s:.0f}s")
        time.sleep(0.5)
    return ready


def ssh_argv(inv: dict, role: str, command: list[str]) -> list[str]:
    """`ssh` into a disk guest as root (for `tcplab lab exec`)."""
    g = inv["hosts"][role]["ssh"]
    return ["ssh", "-q", "-p", g["ansible_port"], "-i", g["ansible_ssh_private_key_file"],
            *g["ansible_ssh_common_args"].split(), "-o", "BatchMode=yes", "root@127.0.0.1", "--",
            shlex.join(command)]   # sshd hands the remote shell one string: quote each argument for it
