"""Disk guests as data (pure): the Debian base image a disk guest boots, and the files that make one copy of
it a particular host (name, SSH keys, its network as the lab wired it).

A disk guest is a real host: its own writable ext4 disk with Debian, systemd, sshd and python3, provisioned
over SSH by playbooks/site.yml like a physical machine, its kernel installed by playbooks/kernel-install.yml
and booted by what its own GRUB environment block names (orchestrator.lab.vm_firmware). The lab plays the
parts a machine room would: the cabling and addressing (systemd-networkd files written onto the disk, as
cloud-init does for a cloud VM), the firmware, and the power button.
"""
from __future__ import annotations

import hashlib
import json

SUITE = "bookworm"
MIRROR = "http://deb.debian.org/debian"
# what a testbed host needs before site.yml runs: an init, sshd and python3 for Ansible, the tools the agent
# drives, grub-editenv for the boot entry, and a distribution kernel (the known-good one) with its initramfs
PACKAGES = ("systemd-sysv", "udev", "dbus", "openssh-server", "python3", "python3-venv", "iproute2", "iperf3",
            "tcpdump", "ethtool", "kmod", "grub-common", "procps", "iputils-ping", "python3-apt", "initramfs-tools",
            "linux-image-amd64")
DISK_SIZE = "4G"
ROOT_LABEL = "tcplab-root"
CONTROL_IF = "ctl"

# Files every disk guest has, written into the base image. The lab's images skip fsync in dpkg (the
# installer does the same) and make no initramfs when a kernel is installed (the kernel hook is diverted
# away; the base kernel keeps the one debootstrap made): under TCG both cost minutes, and the lab's firmware
# builds the small initramfs a guest needs from the guest's own modules.
BASE_FILES: dict[str, tuple[int, str]] = {
    "etc/fstab": (0o644, f"LABEL={ROOT_LABEL} / ext4 rw,relatime,errors=remount-ro 0 1\n"),
    "etc/dpkg/dpkg.cfg.d/tcplab-unsafe-io": (0o644, "force-unsafe-io\n"),
    "etc/initramfs-tools/conf.d/tcplab-lab": (0o644, "# tcplab VM lab: the firmware builds the initramfs\n"),
    "etc/ssh/sshd_config.d/tcplab.conf": (0o644, "PermitRootLogin prohibit-password\nPasswordAuthentication no\n"
                                          "UseDNS no\n"),
    "etc/default/grub": (0o644, 'GRUB_DEFAULT=saved\nGRUB_TIMEOUT=1\nGRUB_DISTRIBUTOR="Debian"\n'
                         'GRUB_CMDLINE_LINUX_DEFAULT=""\n'),
    "etc/systemd/journald.conf.d/tcplab.conf": (0o644, "[Journal]\nStorage=volatile\n"),
}
# run in the chroot after debootstrap, in order (argv lists)
CHROOT_STEPS: tuple[tuple[str, ...], ...] = (
    ("systemctl", "enable", "systemd-networkd"),
    ("systemctl", "mask", "systemd-timesyncd.service", "apt-daily.timer", "apt-daily-upgrade.timer",
     "e2scrub_all.timer", "fstrim.timer", "man-db.timer"),
    ("sed", "-i", "s/^update_initramfs=.*/update_initramfs=no/", "/etc/initramfs-tools/update-initramfs.conf"),
    ("dpkg-divert", "--local", "--rename", "--divert", "/etc/kernel/postinst.d/initramfs-tools.tcplab-lab",
     "/etc/kernel/postinst.d/initramfs-tools"),
    ("mkdir", "-p", "-m", "0700", "/root/.ssh", "/boot/grub"),
    ("grub-editenv", "/boot/grub/grubenv", "create"),
    ("rm", "-f", "/etc/ssh/ssh_host_ecdsa_key", "/etc/ssh/ssh_host_ecdsa_key.pub", "/etc/ssh/ssh_host_rsa_key",
     "/etc/ssh/ssh_host_rsa_key.pub", "/etc/ssh/ssh_host_ed25519_key", "/etc/ssh/ssh_host_ed25519_key.pub"),
    ("apt-get", "clean"),
)


def recipe_key() -> str:
    """The base image's cache key: everything that goes into it."""
    doc = [SUITE, MIRROR, PACKAGES, DISK_SIZE, ROOT_LABEL, sorted(BASE_FILES.items()), CHROOT_STEPS]
    return hashlib.sha256(json.dumps(doc).encode()).hexdigest()[:12]


def debootstrap_argv(target: str) -> list[str]:
    return ["debootstrap", "--variant=minbase", f"--include={','.join(PACKAGES)}", SUITE, target, MIRROR]


def mkfs_argv(tree: str, image: str) -> list[str]:
    return ["mkfs.ext4", "-q", "-F", "-L", ROOT_LABEL, "-d", tree, image, DISK_SIZE]


def _link(name: str, mac: str) -> str:
    return f"[Match]\nMACAddress={mac}\n\n[Link]\nName={name}\n"


def _network(iface: dict, routes: list[list[str]], forwarding: bool) -> str:
    lines = ["[Match]", f"MACAddress={iface['mac']}", "", "[Link]", "RequiredForOnline=no", "",
             "[Network]", f"Address={iface['addr']}/{iface['plen']}", "LinkLocalAddressing=no", "IPv6AcceptRA=no"]
    if forwarding:
        lines.append("IPForward=ipv4")   # systemd 252 (bookworm)
    for subnet, via, dev in routes:
        if dev == iface["ifname"]:
            lines += ["", "[Route]", f"Destination={subnet}", f"Gateway={via}"]
    for addr, mac in iface["neighbours"]:
        lines += ["", "[Neighbor]", f"Address={addr}", f"LinkLayerAddress={mac}"]
    return "\n".join(lines) + "\n"


def guest_files(cfg: dict, authorized_key: str, host_keys: dict[str, bytes]) -> dict[str, tuple[int, bytes]]:
    """The files that make a copy of the base image this guest (path without leading `/` -> mode, bytes).
    `cfg` is the lab's guest config (orchestrator.lab.vm_config.guest_config): interfaces by MAC with
    addresses and static neighbours, routes, forwarding. `host_keys`: ssh_host_*_key{,.pub} file contents."""
    forwarding = cfg.get("sysctls", {}).get("net.ipv4.ip_forward") == "1"
    files: dict[str, tuple[int, bytes]] = {
        "etc/hostname": (0o644, f"{cfg['hostname']}\n".encode()),
        "etc/hosts": (0o644, f"127.0.0.1 localhost\n127.0.1.1 {cfg['hostname']}\n".encode()),
        "root/.ssh/authorized_keys": (0o600, f"{authorized_key.strip()}\n".encode()),
    }
    for i, iface in enumerate(cfg["interfaces"], 10):
        link = _link(iface["ifname"], iface["mac"])
        files[f"etc/systemd/network/{i}-{iface['ifname']}.link"] = (0o644, link.encode())
        files[f"etc/systemd/network/{i}-{iface['ifname']}.network"] = (
            0o644, _network(iface, cfg.get("routes", []), forwarding and iface["ifname"] != CONTROL_IF).encode())
    for name, data in host_keys.items():
        files[f"etc/ssh/{name}"] = (0o600 if not name.endswith(".pub") else 0o644, data)
    return files


def debugfs_write_script(files: dict[str, str], modes: dict[str, int]) -> str:
    """A debugfs -w command file that replaces each guest path with a local file, owned by root with its mode.
    `files`: guest path (absolute) -> local path."""
    out = []
    for guest, local in files.items():
        out += [f'rm "{guest}"', f'write "{local}" "{guest}"', f'sif "{guest}" mode 0{0o100000 | modes[guest]:o}',
                f'sif "{guest}" uid 0', f'sif "{guest}" gid 0']
    return "\n".join(out) + "\n"


def boot_cmdline(extra: str = "") -> str:
    """The kernel command line the lab's firmware passes (GRUB's GRUB_CMDLINE_LINUX, in the lab's words):
    the root disk, the serial console, and HPET as the clock source (QEMU's HPET runs on the host's clock;
    the TSC calibration under TCG drifts ~10 ppm)."""
    line = "root=/dev/vda rw console=ttyS0 panic=-1 mitigations=off clocksource=hpet net.ifnames=0"
    return f"{line} {extra}".strip()
