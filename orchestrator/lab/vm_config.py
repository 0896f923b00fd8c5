"""The VM lab's layout as data (pure): which roles are guests, how their data NICs reach their peers, what
each guest configures at boot, and the QEMU/virtiofsd argv that starts it.

The aqm host is always a guest; the client and server are guests by choice (`--vm-roles`), so their
kernel -- dctcp, a patched congestion control -- is the guest's, not this machine's. No data link
touches the root namespace:
- guest <-> namespace: a tap born inside the namespace, named as the namespace's interface (`to-aqm`);
  its fd goes to that guest's QEMU;
- guest <-> guest: a pair of QEMU `dgram` netdevs on UNIX datagram sockets in the guests' state dirs
  (each binds its own path and sends to its peer's: no start order, no bridge);
- guest <-> switch: a tap born inside the switch's namespace, named as the switch's port (`to-aqm`) and
  enslaved to its bridge, as a namespace host's veth end is; a socket pair joins only two ends, so guests
  on one switch meet at its bridge too.
"""
from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from orchestrator.lab.netns import AGENT_ARTIFACTS, LabError
from orchestrator.lab.topology import Endpoint, Topology, routes
from orchestrator.lab.vm_guest import EXEC_PORT
from orchestrator.lab.vm_recipe import GUEST_TMPFS, KernelImage

QEMU = "qemu-system-x86_64"
VIRTIOFSD = "/usr/lib/qemu/virtiofsd"  # QEMU 7.2's C daemon (package qemu-system-common)
CONTROL_MAC, CONTROL_ADDR = "52:54:00:7c:00:fe", "10.0.2.15"  # QEMU user-mode network defaults (per guest)
CLOCK_ADDR, CLOCK_PORT = "10.0.2.100", 37  # guestfwd: each connection runs `date` on the host
SAFE_PATH = re.compile(r"^/[A-Za-z0-9._/+-]*$")  # goes onto the kernel command line and into -serial file:
CMDLINE_MAX = 2047  # x86 COMMAND_LINE_SIZE (2048) with its NUL
EXEC_SOCKET = "exec.sock"


def vm_dir(state_dir: Path, role: str) -> Path:
    """Everything of one guest: console.log, qemu.pid, exec.sock, guest/ (token, guest.json), sockets."""
    return state_dir / f"vm-{role}"


def check_vm_roles(topo: Topology, vm_roles: tuple[str, ...]) -> tuple[str, ...]:
    """The guests in topology order; the aqm must be one (the namespaces cannot forward for a guest)."""
    unknown = [r for r in vm_roles if r not in topo.roles]
    if unknown:
        raise LabError(f"--vm-roles: no role {', '.join(unknown)} in the lab (roles: {', '.join(topo.roles)})")
    if "aqm" in topo.roles and "aqm" not in vm_roles:
        raise LabError("--vm-roles must include aqm: the VM lab's bottleneck host is always a guest")
    return tuple(r for r in topo.roles if r in vm_roles)


def namespace_nodes(topo: Topology, vm_roles: tuple[str, ...]) -> tuple[str, ...]:
    """What the VM lab builds as namespaces: every host that is not a guest, and every switch (a guest's
    port on a switch is a tap in the switch's namespace, so the switch exists whoever sits on it)."""
    return tuple(r for r in topo.roles if r not in vm_roles) + topo.switches


def parse_vm_roles(text: str, topo: Topology) -> tuple[str, ...]:
    """`aqm`, `client,aqm,server` or `all` (command line)."""
    roles = topo.roles if text.strip() == "all" else tuple(r.strip() for r in text.split(",") if r.strip())
    return check_vm_roles(topo, roles)


def guest_mac(topo: Topology, ep: Endpoint) -> str:
    """Locally administered and fixed per (link, side): the second end (the aqm's on the quickstart's links)
    ends in fe, the first in 01."""
    i, link = next((i, lk) for i, lk in enumerate(topo.links, 1) if ep in (lk.a, lk.b))
    return f"52:54:00:7c:{i:02x}:{'fe' if ep == link.b else '01'}"


@dataclass(frozen=True)
class Nic:
    """One data NIC of a guest: `tap` (fd of a tap in `namespace` named `tap_ifname`) or `dgram`."""
    ifname: str
    mac: str
    backend: str
    namespace: str | None = None
    tap_ifname: str | None = None
    local: Path | None = None
    remote: Path | None = None

    def netdev(self, index: int, fd: int | None = None) -> str:
        if self.backend == "tap":
            if fd is None:
                raise ValueError(f"{self.ifname}: a tap NIC needs its fd")
            return f"tap,id=data{index},fd={fd}"
        return (f"dgram,id=data{index},local.type=unix,local.path={self.local},"
                f"remote.type=unix,remote.path={self.remote}")


def guest_nics(topo: Topology, role: str, vm_roles: tuple[str, ...], state_dir: Path) -> list[Nic]:
    nics = []
    for ep in topo.endpoints(role):
        peer = topo.peer(ep)       # on a switch: the switch's port, where the tap goes
        if peer.role in vm_roles:
            nics.append(Nic(ep.ifname, guest_mac(topo, ep), "dgram",
                            local=vm_dir(state_dir, role) / f"{ep.ifname}.sock",
                            remote=vm_dir(state_dir, peer.role) / f"{peer.ifname}.sock"))
        else:
            nics.append(Nic(ep.ifname, guest_mac(topo, ep), "tap", namespace=topo.namespace(peer.role),
                            tap_ifname=peer.ifname))
    return nics


def lab_macs(topo: Topology, vm_roles: tuple[str, ...], namespace_macs: dict[tuple[str, str], str]
             ) -> dict[tuple[str, str], str]:
    """(role, ifname) -> MAC for every data interface: guests' are fixed, namespaces' read from the taps."""
    macs = dict(namespace_macs)
    for role in vm_roles:
        macs.update({(role, ep.ifname): guest_mac(topo, ep) for ep in topo.endpoints(role)})
    return macs


def guest_config(topo: Topology, role: str, port: int, macs: dict[tuple[str, str], str],
                 module_dirs: Iterable[str] = (), control: tuple[str, str] = (CONTROL_MAC, CONTROL_ADDR),
                 clock: bool = True, exec_port: int | None = None) -> dict:
    """<vm dir>/guest/guest.json for orchestrator.lab.vm_guest: interfaces by MAC, static neighbours,
    routes through the aqm (endpoints) or forwarding (aqm), the clock source and the agent's argv.
    Neighbours: every host on the interface's segment (its link's peer, or everyone on its switch).
    `module_dirs`: host directories of modules built for the guest kernel (the guest sees them read-only),
    each an agent --module-dir. `control`: the control NIC's (MAC, address); `clock`: set the clock from the
    host at boot (a UML host reads the machine's clock already); `exec_port`: serve the exec protocol on
    that TCP port of the control address (a UML host has no virtio-serial port)."""
    ctl_mac, ctl_addr = control
    interfaces = [{"ifname": ep.ifname, "mac": macs[(role, ep.ifname)], "addr": ep.addr, "plen": ep.plen,
                   "neighbours": [[p.addr, macs[(p.role, p.ifname)]] for p in topo.segment_peers(ep)]}
                  for ep in topo.endpoints(role)]
    interfaces.append({"ifname": "ctl", "mac": ctl_mac, "addr": ctl_addr, "plen": 24, "neighbours": []})
    agent = ["--name", role, "--listen", f"tcp://{ctl_addr}:{port}", "--token-file", "/run/tcplab-vm/token",
             "--artifacts", str(AGENT_ARTIFACTS / topo.prefix / role)]
    for ep in topo.endpoints(role):
        agent += ["--interface", ep.ifname]
    for d in module_dirs:
        agent += ["--module-dir", str(d)]
    cfg = {"hostname": topo.namespace(role), "interfaces": interfaces,
           "routes": [[subnet, via, dev] for r, subnet, via, dev in routes(topo) if r == role],
           "sysctls": {"net.ipv4.ip_forward": "1"} if role in topo.routers() else {}, "agent": agent}
    if clock:
        cfg["clock"] = [CLOCK_ADDR, CLOCK_PORT]
    if exec_port is not None:
        cfg["exec_listen"] = [ctl_addr, exec_port]
    return cfg


def paths_to_keep(needed: Iterable[Path]) -> list[str]:
    """Of the host directories the guest runs from (the repository, the interpreter's prefixes; resolved,
    absolute), those its tmpfs mounts would hide -- a clone or venv under /tmp. Stage 1 sets them aside
    before mounting the tmpfs and puts them back at their own path on top of it, so the absolute paths
    a venv and an editable install record stay valid. Nested ones are covered by their parent."""
    hidden = sorted({str(p) for p in needed if any(str(p) == d or str(p).startswith(f"{d}/") for d in GUEST_TMPFS)})
    for path in hidden:
        if path in GUEST_TMPFS:
            raise LabError(f"{path}: the guests mount tmpfs there; the repository and the interpreter must "
                           "live in a directory of their own (e.g. a clone under it)")
    return [p for p in hidden if not any(p.startswith(f"{q}/") for q in hidden)]


def kernel_cmdline(share: str, guest_dir: Path, python: str, repo: Path, keep: Sequence[str] = ()) -> str:
    """The guest's command line: the console, and where stage 1 finds its files (paths only: the token
    is never here, /proc/cmdline is world-readable). `keep`: host paths to keep visible (paths_to_keep)."""
    for path in (str(guest_dir), python, str(repo), *keep):
        if not SAFE_PATH.match(path):
            raise LabError(f"{path!r}: the VM lab needs paths without spaces, commas or shell characters")
    # clocksource=hpet: QEMU's HPET runs on the host's clock; the guest's own TSC calibration under TCG is
    # ~10 ppm off (0.7 ms/min of drift), HPET reads cost no measurable throughput
    line = (f"console=ttyS0 panic=-1 quiet mitigations=off clocksource=hpet tcplab.share={share} "
            f"tcplab.guest={guest_dir} tcplab.python={python} tcplab.repo={repo}")
    if keep:
        line += f" tcplab.keep={','.join(keep)}"
    if len(line) > CMDLINE_MAX:
        raise LabError(f"the guest's kernel command line would be {len(line)} characters (at most {CMDLINE_MAX}): "
                       "use shorter paths for the lab's state dir, the interpreter and the repository")
    return line


def qemu_argv(image: KernelImage, accel: str, cmdline: str, guest_state: Path, name: str,
              netdevs: list[tuple[str, str]], port: int, share_socket: Path | None = None,
              memory_mb: int = 1024, cpus: int = 1, cpu: str | None = None) -> list[str]:
    """One guest. netdevs: (-netdev value with id=dataN, guest MAC) in order; the control NIC is QEMU's
    user-mode network, restricted (the guest reaches nothing) with one host-loopback forward to the agent."""
    argv = [QEMU, "-name", f"{name},process={name}", "-nodefaults", "-no-user-config", "-display", "none",
            "-no-reboot", "-accel", accel, "-cpu", cpu or ("qemu64" if accel == "tcg" else "host"),
            "-m", str(memory_mb), "-smp", str(cpus), "-kernel", str(image.vmlinuz), "-initrd", str(image.initramfs),
            "-append", cmdline, "-serial", f"file:{guest_state / 'console.log'}",
            "-pidfile", str(guest_state / "qemu.pid")]
    if image.share == "9p":
        argv += ["-virtfs", "local,path=/,mount_tag=hostroot,readonly=on,security_model=none,multidevs=remap"]
    else:
        argv += ["-chardev", f"socket,id=vfs,path={share_socket}",
                 "-device", "vhost-user-fs-pci,chardev=vfs,tag=hostroot",
                 "-object", f"memory-backend-memfd,id=mem,size={memory_mb}M,share=on", "-numa", "node,memdev=mem"]
    argv += ["-device", "virtio-serial-pci,id=vser",
             "-chardev", f"socket,id=exec,path={guest_state / EXEC_SOCKET},server=on,wait=off",
             "-device", f"virtserialport,bus=vser.0,chardev=exec,name={EXEC_PORT}"]
    for i, (netdev, mac) in enumerate(netdevs):
        argv += ["-netdev", netdev, "-device", f"virtio-net-pci,netdev=data{i},mac={mac},romfile="]
    ctl = (f"user,id=ctl,restrict=on,ipv6=off,hostfwd=tcp:127.0.0.1:{port}-{CONTROL_ADDR}:{port},"
           f"guestfwd=tcp:{CLOCK_ADDR}:{CLOCK_PORT}-cmd:date +%s%N")
    return argv + ["-netdev", ctl, "-device", f"virtio-net-pci,netdev=ctl,mac={CONTROL_MAC},romfile="]


def kvm_probe_argv(image: KernelImage) -> list[str]:
    """A test boot with KVM that stage 1 ends at once with vm_recipe.PROBE_OK on stdout (tcplab.probe=1)."""
    return [QEMU, "-nodefaults", "-no-user-config", "-display", "none", "-no-reboot", "-accel", "kvm", "-cpu", "host",
            "-m", "256", "-kernel", str(image.vmlinuz), "-initrd", str(image.initramfs),
            "-append", "console=ttyS0 panic=-1 tcplab.probe=1", "-serial", "stdio"]


def virtiofsd_argv(view: Path, socket_path: Path) -> list[str]:
    """virtiofsd (QEMU 7.2's C daemon has no read-only mode) serving a read-only bind of the host's `/`
    made in a private mount namespace: the guest cannot write the host through it."""
    script = ('set -e; mount --rbind / "$1"; mount --make-rslave "$1"; '
              'for m in $(findmnt -Rrno TARGET "$1"); do mount -o remount,bind,ro "$m" || true; done; '
              'exec "$2" --socket-path="$3" -o source="$1" -o cache=auto -o sandbox=namespace')
    return ["unshare", "--mount", "--propagation", "private", "sh", "-c", script, "virtiofsd", str(view),
            VIRTIOFSD, str(socket_path)]


def plan_kernel_package(kernels: dict, runs: list, vm_roles: tuple[str, ...]) -> str | None:
    """The Debian kernel package a plan asks its guests to run (`lab up --kind vm --plan FILE`): the
    variants (plan `kernels:`) of every guest role over every run must be one package, since one VM lab
    boots one kernel; None when the plan names no kernel for them. kernels: name -> KernelVariant;
    runs: the plan's RunSpecs."""
    wanted = {run.hosts[r].kernel.name for run in runs for r in vm_roles
              if r in run.hosts and run.hosts[r].kernel is not None}
    packages: dict[str, list[str]] = {}
    for name in sorted(wanted):
        variant = kernels[name]
        if variant.package is None:
            raise LabError(f"kernel variant {name} is a source build: the VM lab boots Debian packages "
                           "(install builds on real hosts by hand: no kernel playbook yet, see playbooks/README.md)")
        packages.setdefault(variant.package, []).append(name)
    if len(packages) > 1:
        raise LabError("the plan's guests need different kernels (" + "; ".join(
            f"{p}: {', '.join(n)}" for p, n in packages.items()) + "): one VM lab boots one kernel, so run "
            "the plan's parts on separate labs")
    return next(iter(packages), None)


def disk_qemu_argv(accel: str, disk: Path, guest_state: Path, name: str, netdevs: list[tuple[str, str]],
                   ports: dict[str, int], memory_mb: int = 1024, cpus: int = 1, cpu: str | None = None) -> list[str]:
    """A disk guest's QEMU without its kernel: the firmware (orchestrator.lab.vm_firmware) adds -kernel,
    -initrd, -append and -qmp at each power-on. `ports`: guest TCP port -> host loopback port (sshd, agent)."""
    argv = [QEMU, "-name", f"{name},process={name}", "-nodefaults", "-no-user-config", "-display", "none",
            "-no-reboot", "-accel", accel, "-cpu", cpu or ("qemu64" if accel == "tcg" else "host"),
            "-m", str(memory_mb), "-smp", str(cpus), "-rtc", "base=utc",
            "-drive", f"file={disk},format=raw,if=virtio,cache=writeback,discard=unmap",
            "-serial", f"file:{guest_state / 'console.log'}", "-pidfile", str(guest_state / "qemu.pid")]
    for i, (netdev, mac) in enumerate(netdevs):
        argv += ["-netdev", netdev, "-device", f"virtio-net-pci,netdev=data{i},mac={mac},romfile="]
    forwards = ",".join(f"hostfwd=tcp:127.0.0.1:{host}-{CONTROL_ADDR}:{guest}" for guest, host in sorted(ports.items()))
    ctl = f"user,id=ctl,restrict=on,ipv6=off,{forwards}"
    return argv + ["-netdev", ctl, "-device", f"virtio-net-pci,netdev=ctl,mac={CONTROL_MAC},romfile="]
