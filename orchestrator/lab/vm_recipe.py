"""What a VM-lab kernel image is made of (pure): which Debian kernel package, which of its modules, the
guest's stage-1 `/init`, the initramfs archive and its name, and the argv of the tools that fetch and
unpack the package. orchestrator.lab.vm_image runs those tools and writes the files.

The initramfs is lab-independent: per-lab facts (the guest-file directory, interpreter, repository, host
paths to keep visible) reach the guest on the kernel command line (orchestrator.lab.vm_config) and in
files of the lab's state dir.
"""
from __future__ import annotations

import fnmatch
import gzip
import hashlib
import json
import lzma
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from orchestrator.plan.model.kernels import abi_pattern

DEFAULT_SERIES = "6.1.0"
# Debian kernel image packages: linux-image-6.1.0-56-amd64 (bookworm), linux-image-6.12.43+deb12-amd64
PACKAGE_RE = re.compile(r"^linux-image-(?P<abi>\d+\.\d+\.\d+(-\d+|\+deb\d+))-(?P<flavour>amd64|cloud-amd64|rt-amd64)"
                        r"(-unsigned)?$")
BUSYBOX = Path("/bin/busybox")  # from busybox-static: it must run with no libraries in the initramfs

# How the host's root file system reaches the guest, and the modules that needs. The generic flavour
# has 9p (QEMU exports the tree itself, read-only); the cloud flavour has only virtiofs (virtiofsd).
BOOT_MODULES = ["virtio_pci", "virtio_net", "virtio_console"]  # NICs, and the exec port (virtio-serial)
SHARE_MODULES = {"9p": ["9pnet_virtio", "9p"], "virtiofs": ["virtiofs"]}
# loaded at boot: veth for the agent's capability probe; tcp_diag (inet_diag), without which `ss` reads
# /proc/net/tcp and prints no TCP_INFO (cwnd, DCTCP alpha); every congestion control, because
# tcp_available_congestion_control lists loaded ones only
PRELOAD_MODULES = ["veth", "tcp_diag"]
PRELOAD_GLOBS = ["kernel/net/ipv4/tcp_*.ko*"]
NOT_CC = {"tcp_diag"}
# copied but loaded on demand (the guest's kernel.modprobe points at a busybox modprobe over this tree)
AUTOLOAD_GLOBS = ["kernel/net/sched/*.ko*", "kernel/drivers/net/ifb.ko*"]
# the guest's writable directories: INIT_SCRIPT mounts a tmpfs on each (mode), hiding the host's files there
GUEST_TMPFS = {"/tmp": "1777", "/var/tmp": "1777", "/run": "0755", "/dev/shm": "1777"}
PROBE_OK = "tcplab-init: probe ok"  # what INIT_SCRIPT prints and powers off with `tcplab.probe=1` (KVM test)


class ImageError(Exception):
    pass


@dataclass(frozen=True)
class KernelImage:
    package: str
    version: str
    release: str          # `uname -r` of the guest
    share: str            # "9p" or "virtiofs"
    vmlinuz: Path
    initramfs: Path
    build_s: float = 0.0  # 0 when everything came from the cache

    def to_json(self) -> dict:
        return {"package": self.package, "version": self.version, "release": self.release,
                "share": self.share, "vmlinuz": str(self.vmlinuz), "initramfs": str(self.initramfs),
                "build_s": round(self.build_s, 2)}


# ---------------------------------------------------------------- packages and versions
def check_package(name: str) -> str:
    """The package name must be one Debian kernel image (not a metapackage such as linux-image-amd64)."""
    if not PACKAGE_RE.match(name):
        raise ImageError(f"--kernel {name!r}: expected a Debian kernel image package such as "
                         f"linux-image-6.1.0-56-amd64 or linux-image-6.1.0-56-cloud-amd64")
    return name


def newest_package(names: Iterable[str], series: str = DEFAULT_SERIES, flavour: str = "amd64") -> str | None:
    """Newest `linux-image-<series>-N-<flavour>` among package names (by ABI number N)."""
    return newest_matching(names, f"linux-image-{series}-*-{flavour}")


def newest_matching(names: Iterable[str], pattern: str) -> str | None:
    """The package among `names` that `pattern` names: itself when it has no `*`, else the one whose digits
    at the `*` (the ABI number) are the largest."""
    if "*" not in pattern:
        return pattern if pattern in {n.strip() for n in names} else None
    rx, best = abi_pattern(pattern), None
    for name in names:
        m = rx.fullmatch(name.strip())
        if m and (best is None or int(m.group(1)) > best[0]):
            best = (int(m.group(1)), name.strip())
    return best[1] if best else None


def apt_version(show: str) -> str | None:
    """The Version field of `apt-cache show --no-all-versions` output."""
    m = re.search(r"^Version: (\S+)$", show, re.M)
    return m.group(1) if m else None


def one_release(deb_name: str, releases: list[str]) -> str:
    """The package's one /lib/modules/<release> (its `uname -r`)."""
    if len(releases) != 1:
        raise ImageError(f"{deb_name}: expected one /lib/modules/<release>, found {releases}")
    return releases[0]


def share_for_config(config: str) -> str:
    """Which sharing method this kernel supports (its /boot/config text)."""
    if re.search(r"^CONFIG_9P_FS=[ym]$", config, re.M) and re.search(r"^CONFIG_NET_9P_VIRTIO=[ym]$", config, re.M):
        return "9p"
    if re.search(r"^CONFIG_VIRTIO_FS=[ym]$", config, re.M):
        return "virtiofs"
    raise ImageError("this kernel has neither 9p nor virtiofs: the guest cannot see the host's files")


# ---------------------------------------------------------------- modules
def parse_modules_dep(text: str) -> dict[str, list[str]]:
    """modules.dep -> {relative path: [dependency paths]} (depmod lists every module, with or without deps)."""
    deps = {}
    for line in text.splitlines():
        if ":" in line:
            mod, _, rest = line.partition(":")
            deps[mod.strip()] = rest.split()
    return deps


def module_name(path: str) -> str:
    return re.sub(r"\.ko(\.xz|\.gz)?$", "", Path(path).name).replace("-", "_")


def closure(deps: dict[str, list[str]], roots: Iterable[str], builtin: Iterable[str] = ()) -> list[str]:
    """Module paths needed for `roots` (names or paths), dependencies first (insmod order); roots in
    `builtin` (names from modules.builtin) need nothing."""
    by_name = {module_name(p): p for p in deps}
    builtin = {module_name(b) for b in builtin}
    order: list[str] = []

    def visit(path: str, stack: tuple[str, ...]) -> None:
        if path in order or path in stack:
            return
        for dep in deps.get(path, []):
            visit(dep, (*stack, path))
        order.append(path)

    for root in roots:
        path = root if root in deps else by_name.get(root.replace("-", "_"))
        if path is None and module_name(root) in builtin:
            continue
        if path is None:
            raise ImageError(f"kernel module {root} is not in this kernel package (built in or missing)")
        visit(path, ())
    return order


def path_matches(path: str, pattern: str) -> bool:
    """Shell glob over a relative path, `*` within one component (as Path.glob)."""
    parts, pats = PurePosixPath(path).parts, PurePosixPath(pattern).parts
    return len(parts) == len(pats) and all(fnmatch.fnmatchcase(a, p) for a, p in zip(parts, pats, strict=True))


def globbed(modules: Iterable[str], patterns: list[str]) -> list[str]:
    """The modules (relative paths) matching any pattern, sorted; tcp_diag is not a congestion control."""
    return sorted(m for m in set(modules) if any(path_matches(m, p) for p in patterns) and module_name(m) not in NOT_CC)


def load_roots(modules: Iterable[str], share: str) -> list[str]:
    """What stage 1 loads: the boot and share modules, veth, tcp_diag and every congestion control."""
    return BOOT_MODULES + SHARE_MODULES[share] + PRELOAD_MODULES + globbed(modules, PRELOAD_GLOBS)


def load_order(deps: dict[str, list[str]], builtin: Iterable[str], share: str) -> list[str]:
    """The insmod order of stage 1 (/etc/tcplab/load)."""
    return closure(deps, load_roots(deps, share), builtin)


def subset(deps: dict[str, list[str]], builtin: Iterable[str], share: str) -> set[str]:
    """The modules kept from the package: what stage 1 loads and what `tc` may load on demand."""
    return set(load_order(deps, builtin, share)) | set(closure(deps, globbed(deps, AUTOLOAD_GLOBS)))


def subset_key() -> str:
    """Changes when the module lists change: the cached subset is then re-extracted from the .deb."""
    return hashlib.sha256(json.dumps([BOOT_MODULES, SHARE_MODULES, PRELOAD_MODULES, PRELOAD_GLOBS,
                                      AUTOLOAD_GLOBS]).encode()).hexdigest()[:12]


def uncompressed(rel: str, data: bytes) -> tuple[str, bytes]:
    """(path, bytes) of a module as kept: 6.12 ships .ko.xz, and busybox insmod takes plain .ko only."""
    if rel.endswith(".xz"):
        return rel[:-3], lzma.decompress(data)
    if rel.endswith(".gz"):
        return rel[:-3], gzip.decompress(data)
    return rel, data


# ---------------------------------------------------------------- the guest's stage 1
# what every initramfs of the lab starts with (this one's and the disk guests' firmware's): busybox's applets,
# the kernel's file systems, the console
INIT_PROLOGUE = r"""/bin/busybox --install -s /bin
export PATH=/bin
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
exec </dev/console >/dev/console 2>&1
"""
INIT_SCRIPT = r"""#!/bin/busybox sh
# tcplab VM guest, stage 1 (initramfs): modules; the host's root file system read-only; tmpfs for the
# writable directories; then switch_root into that view and exec stage 2 (orchestrator.lab.vm_guest)
# with the host's own interpreter and repository. busybox applets are used only here.
""" + INIT_PROLOGUE + r"""fail() { echo "tcplab-init: FAILED: $*"; poweroff -f; }
rel=$(uname -r)
for m in $(cat /etc/tcplab/load); do insmod "/lib/modules/$rel/$m" || fail "insmod $m"; done
share=; guest=; python=; repo=; keep=
for arg in $(cat /proc/cmdline); do
  case "$arg" in
    tcplab.share=*) share=${arg#*=} ;;
    tcplab.guest=*) guest=${arg#*=} ;;
    tcplab.python=*) python=${arg#*=} ;;
    tcplab.repo=*) repo=${arg#*=} ;;
    tcplab.keep=*) keep=$(echo "${arg#*=}" | tr , ' ') ;;
    tcplab.probe=1) echo "tcplab-init: probe ok"; poweroff -f ;;
  esac
done
mkdir -p /newroot
case "$share" in
  9p) mount -t 9p -o ro,trans=virtio,version=9p2000.L,msize=262144,cache=loose hostroot /newroot ;;
  virtiofs) mount -t virtiofs -o ro hostroot /newroot ;;
  *) false ;;
esac || fail "mount the host root over '$share'"
mkdir -p /guest && cp "/newroot$guest/"* /guest/ || fail "copy $guest"
# host directories under the tmpfs mounts below (a repository or venv in /tmp): set aside now, put back
# at their own path on top of the tmpfs at the end
n=0
for p in $keep; do
  n=$((n + 1)); mkdir -p "/keep/$n" && mount --bind "/newroot$p" "/keep/$n" || fail "keep $p"
done
mount -t tmpfs -o mode=1777 tmpfs /newroot/tmp || fail "tmpfs /tmp"
mount -t tmpfs -o mode=1777 tmpfs /newroot/var/tmp || fail "tmpfs /var/tmp"
mount -t tmpfs -o mode=0755 tmpfs /newroot/run || fail "tmpfs /run"
v=/newroot/run/tcplab-vm
mkdir -p -m 0700 "$v/root/bin" && cp /guest/* "$v/" && chmod 0600 "$v/token" || fail "guest files"
cp /bin/busybox "$v/root/bin/" && cp -a /lib "$v/root/" || fail "module tree"
w=/run/tcplab-vm
b=$w/root/bin/busybox
printf '#!%s sh\nexec %s chroot %s /bin/busybox modprobe "$@"\n' "$b" "$b" "$w/root" > "$v/modprobe"
chmod 0700 "$v/modprobe"
for d in dev proc sys; do mount --move "/$d" "/newroot/$d" || fail "move /$d"; done
mkdir -p /newroot/dev/shm && mount -t tmpfs -o mode=1777 tmpfs /newroot/dev/shm
n=0
for p in $keep; do
  n=$((n + 1)); mkdir -p "/newroot$p" && mount --move "/keep/$n" "/newroot$p" || fail "put back $p"
done
mount -t tracefs tracefs /newroot/sys/kernel/tracing
mount -t debugfs debugfs /newroot/sys/kernel/debug
echo "$w/modprobe" > /newroot/proc/sys/kernel/modprobe
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin HOME=/root LANG=C.UTF-8
export PYTHONPATH="$repo" PYTHONDONTWRITEBYTECODE=1
read up _ < /newroot/proc/uptime
echo "tcplab-init: [$up] stage 1 done, starting $python"
exec switch_root /newroot "$python" -m orchestrator.lab.vm_guest "$w/guest.json"
"""


def _cpio_entry(name: str, mode: int, data: bytes = b"", ino: int = 0, rdev: tuple[int, int] = (0, 0)) -> bytes:
    encoded = name.encode() + b"\0"
    fields = [ino, mode, 0, 0, 1, 0, len(data), 0, 0, rdev[0], rdev[1], len(encoded), 0]
    head = b"070701" + b"".join(f"{f:08x}".encode() for f in fields) + encoded
    head += b"\0" * (-len(head) % 4)
    return head + data + b"\0" * (-len(data) % 4)


def cpio_newc(entries: list[tuple[str, int, bytes, tuple[int, int]]]) -> bytes:
    """An uncompressed newc archive (what the kernel unpacks as initramfs); mtime 0, owner root."""
    members = [_cpio_entry(name, mode, data, ino, rdev) for ino, (name, mode, data, rdev) in enumerate(entries, 1)]
    return b"".join(members) + _cpio_entry("TRAILER!!!", 0)


def initramfs_entries(busybox: bytes, release: str, modules: dict[str, bytes], load: list[str],
                      extra_files: dict[str, bytes], init: str = INIT_SCRIPT
                      ) -> list[tuple[str, int, bytes, tuple[int, int]]]:
    """Archive members: busybox, /init, device nodes, the module tree, the insmod order."""
    files = {"init": (0o100755, init.encode()), "bin/busybox": (0o100755, busybox),
             "etc/tcplab/load": (0o100644, "".join(f"{m}\n" for m in load).encode())}
    for rel, data in {**modules, **extra_files}.items():
        files[f"lib/modules/{release}/{rel}"] = (0o100644, data)
    dirs = {"dev", "proc", "sys", "newroot", "tmp"}
    for path in files:
        parts = path.split("/")[:-1]
        dirs.update("/".join(parts[:i]) for i in range(1, len(parts) + 1))
    entries = [(d, 0o040755, b"", (0, 0)) for d in sorted(dirs)]
    entries += [("dev/console", 0o020600, b"", (5, 1)), ("dev/null", 0o020666, b"", (1, 3))]
    entries += [(p, mode, data, (0, 0)) for p, (mode, data) in sorted(files.items())]
    return entries


def recipe_hash(share: str, load: list[str], autoload: list[str], busybox: bytes) -> str:
    h = hashlib.sha256(INIT_SCRIPT.encode())
    h.update(json.dumps([share, load, autoload]).encode())
    h.update(hashlib.sha256(busybox).digest())
    return h.hexdigest()[:12]


def initramfs_name(deps: dict[str, list[str]], builtin: Iterable[str], share: str, busybox: bytes) -> str:
    """The initramfs file name for a module subset (its modules.dep): a hash of everything that goes in,
    so a code change rebuilds it and an unchanged recipe is found in the cache."""
    load = load_order(deps, builtin, share)
    return f"initramfs-{recipe_hash(share, load, sorted(set(deps) - set(load)), busybox)}.cpio"


def static_busybox(head: bytes) -> bool:
    """The first bytes of a busybox binary name no dynamic loader (the initramfs has no libraries)."""
    return b"/lib64/ld-linux" not in head[:4096]


# ---------------------------------------------------------------- argv builders
def apt_pkgnames_argv(prefix: str = "linux-image-") -> list[str]:
    return ["apt-cache", "pkgnames", prefix]


def apt_download_argv(package: str, opts: Iterable[str] = ()) -> list[str]:
    """`opts`: orchestrator.lab.apt_suite.options of an extra suite (none: the system's sources)."""
    return ["apt-get", "download", "-q", "-o", "APT::Sandbox::User=root", *opts, package]


def apt_version_argv(package: str, opts: Iterable[str] = ()) -> list[str]:
    return ["apt-cache", *opts, "show", "--no-all-versions", package]


def unpack_argv(deb: Path, dest: Path) -> list[str]:
    return ["dpkg-deb", "-x", str(deb), str(dest)]


def depmod_argv(base: Path, release: str) -> list[str]:
    return [str(BUSYBOX), "depmod", "-b", str(base), release]
