"""What this machine gives the VM lab (effects): its tools, KVM or TCG, taps born inside a namespace, free
loopback ports, and the interpreter and directories the guests run from."""
from __future__ import annotations

import fcntl
import json
import logging
import os
import shutil
import socket
import struct
import subprocess
import sys
from pathlib import Path

from orchestrator.lab import vm_image, vm_recipe
from orchestrator.lab.netns import LabError
from orchestrator.lab.vm_config import QEMU, kvm_probe_argv
from orchestrator.lab.vm_recipe import PROBE_OK
from orchestrator.netns_socket import in_netns
from schemas import procs

log = logging.getLogger("tcplab.lab")
REPO_ROOT = Path(__file__).resolve().parents[2]
TUNSETIFF, IFF_TAP, IFF_NO_PI = 0x400454CA, 0x0002, 0x1000


def open_tap(namespace: str, ifname: str) -> int:
    """A tap named `ifname` created inside `namespace` (it lives as long as an fd to it is open)."""
    def make() -> int:
        fd = os.open("/dev/net/tun", os.O_RDWR)
        fcntl.ioctl(fd, TUNSETIFF, struct.pack("16sH22x", ifname.encode(), IFF_TAP | IFF_NO_PI))
        return fd

    try:
        return in_netns(namespace, make)
    except OSError as exc:
        raise LabError(f"tap {ifname} in {namespace}: {exc}") from None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _qemu_version() -> str:
    return procs.run([QEMU, "--version"]).stdout.splitlines()[0]


def choose_accel(image: vm_recipe.KernelImage) -> str:
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
        try:
            out = subprocess.run(kvm_probe_argv(image), capture_output=True, text=True, timeout=20,
                                 check=False).stdout
        except subprocess.TimeoutExpired:
            out = ""
        known[key] = "kvm" if PROBE_OK in out else "tcg"
        cache.write_text(json.dumps(known, indent=2))
        log.info("kvm test boot: %s", known[key])
    return known[key]


def missing_tools() -> list[str]:
    need = {QEMU: "qemu-system-x86", str(vm_recipe.BUSYBOX): "busybox-static"}
    return [f"{tool} (apt: {pkg})" for tool, pkg in need.items() if not shutil.which(tool)]



def free_ports(count: int) -> list[int]:
    ports: list[int] = []
    while len(ports) < count:
        if (port := free_port()) not in ports:
            ports.append(port)
    return ports



def guest_interpreter() -> tuple[str, list[Path]]:
    """The interpreter the guests run (this one: its directory resolved, its name kept, so a venv is
    still found by its pyvenv.cfg) and every host directory it and the repository need."""
    exe = Path(sys.executable)
    prefixes = {sys.prefix, sys.exec_prefix, sys.base_prefix, sys.base_exec_prefix}
    needed = [REPO_ROOT, exe.parent.resolve(), exe.resolve().parent, *(Path(p).resolve() for p in prefixes)]
    return str(exe.parent.resolve() / exe.name), needed
