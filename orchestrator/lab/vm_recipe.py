"""Kernel images for the VM lab (`tcplab lab up --kind vm`): fetch a Debian kernel package, unpack it and
build the guest initramfs.

Pure parts (package names, module closure, the guest's stage-1 `/init`, the cpio writer, argv builders)
are kept apart from the effects (apt, dpkg-deb, busybox depmod, files). Everything lands in
CACHE_ROOT/<package>/<version>/ -- the .deb, vmlinuz, the module subset, and the initramfs named after a
hash of its recipe -- so a second `lab up --kind vm` builds nothing. The initramfs is lab-independent:
per-lab facts (state dir, interpreter, repository) reach the guest on the kernel command line and in
files of the state dir (see orchestrator.lab.vm).
"""
from __future__ import annotations

import fcntl
import gzip
import hashlib
import json
import lzma
import os
import re
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

CACHE_ROOT = Path(os.environ.get("TCPLAB_VM_CACHE", "/var/cache/tcplab/vm"))
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


# ---------------------------------------------------------------- pure: names, versions, modules
def check_package(name: str) -> str:
    """The package name must be one Debian kernel image (not a metapackage such as linux-image-amd64)."""
    if not PACKAGE_RE.match(name):
        raise ImageError(f"--kernel {name!r}: expected a Debian kernel image package such as "
                         f"linux-image-6.1.0-56-amd64 or linux-image-6.1.0-56-cloud-amd64")
    return name


def newest_package(names: Iterable[str], series: str = DEFAULT_SERIES, flavour: str = "amd64") -> str | None:
    """Newest `linux-image-<series>-N-<flavour>` among package names (by ABI number N)."""
    best: tuple[int, str] | None = None
    for name in names:
        m = re.fullmatch(rf"linux-image-{re.escape(series)}-(\d+)-{re.escape(flavour)}", name.strip())
        if m and (best is None or int(m.group(1)) > best[0]):
            best = (int(m.group(1)), name.strip())
    return best[1] if best else None


def parse_modules_dep(text: str) -> dict[str, list[str]]:
    """modules.dep -> {relative path: [dependency paths]}."""
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


def share_for_config(config: str) -> str:
    """Which sharing method this kernel supports (its /boot/config text)."""
    if re.search(r"^CONFIG_9P_FS=[ym]$", config, re.M) and re.search(r"^CONFIG_NET_9P_VIRTIO=[ym]$", config, re.M):
        return "9p"
    if re.search(r"^CONFIG_VIRTIO_FS=[ym]$", config, re.M):
        return "virtiofs"
    raise ImageError("this kernel has neither 9p nor virtiofs: the guest cannot see the host's files")


# ---------------------------------------------------------------- pure: the guest's stage 1
INIT_SCRIPT = r"""#!/bin/busybox sh
# tcplab VM guest, stage 1 (initramfs): modules; the host's root file system read-only; tmpfs for the
# writable directories; then switch_root into that view and exec stage 2 (orchestrator.lab.vm_guest)
# with the host's own interpreter and repository. busybox applets are used only here.
/bin/busybox --install -s /bin
export PATH=/bin
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
exec </dev/console >/dev/console 2>&1
fail() { echo "tcplab-init: FAILED: $*"; poweroff -f; }
rel=$(uname -r)
for m in $(cat /etc/tcplab/load); do insmod "/lib/modules/$rel/$m" || fail "insmod $m"; done
share=; guest=; python=; repo=
for arg in $(cat /proc/cmdline); do
  case "$arg" in
    tcplab.share=*) share=${arg#*=} ;;
    tcplab.guest=*) guest=${arg#*=} ;;
    tcplab.python=*) python=${arg#*=} ;;
    tcplab.repo=*) repo=${arg#*=} ;;
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
                      extra_files: dict[str, bytes]) -> list[tuple[str, int, bytes, tuple[int, int]]]:
    """Archive members: busybox, /init, device nodes, the module tree, the insmod order."""
    files = {"init": (0o100755, INIT_SCRIPT.encode()), "bin/busybox": (0o100755, busybox),
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


# ---------------------------------------------------------------- argv builders
def apt_download_argv(package: str) -> list[str]:
    return ["apt-get", "download", "-q", "-o", "APT::Sandbox::User=root", package]


def apt_version_argv(package: str) -> list[str]:
    return ["apt-cache", "show", "--no-all-versions", package]


def unpack_argv(deb: Path, dest: Path) -> list[str]:
    return ["dpkg-deb", "-x", str(deb), str(dest)]


def depmod_argv(base: Path, release: str) -> list[str]:
    return [str(BUSYBOX), "depmod", "-b", str(base), release]


# ---------------------------------------------------------------- effects
def _run(argv: list[str], timeout: float, cwd: Path | None = None) -> str:
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, cwd=cwd, check=False)
    except subprocess.TimeoutExpired:
        raise ImageError(f"{' '.join(argv)}: no result within {timeout:.0f}s") from None
    except FileNotFoundError:
        raise ImageError(f"{argv[0]} is not installed") from None
    if done.returncode != 0:
        raise ImageError(f"{' '.join(argv)} exited {done.returncode}: {(done.stderr or done.stdout).strip()}")
    return done.stdout


def _cached_versions(package: str) -> list[Path]:
    return sorted((CACHE_ROOT / package).glob("*/vmlinuz"), key=lambda p: p.stat().st_mtime)


def default_package() -> str:
    """The newest linux-image-6.1.0-N-amd64 apt knows, else the newest one in the cache."""
    try:
        names = _run(["apt-cache", "pkgnames", "linux-image-"], timeout=60).split()
    except ImageError:
        names = []
    found = newest_package(names) or newest_package(p.name for p in CACHE_ROOT.glob("linux-image-*"))
    if not found:
        raise ImageError("no linux-image-6.1.0-*-amd64 package known to apt (run apt-get update) or cached "
                         f"in {CACHE_ROOT}")
    return found


def package_version(package: str) -> str:
    try:
        out = _run(apt_version_argv(package), timeout=60)
        m = re.search(r"^Version: (\S+)$", out, re.M)
        if m:
            return m.group(1)
    except ImageError as exc:
        cached = _cached_versions(package)
        if cached:
            return cached[-1].parent.name
        raise ImageError(f"apt knows no package {package} (apt-get update?) and none is cached: {exc}") from None
    raise ImageError(f"apt-cache show {package}: no Version field")


def _download(package: str, dest: Path, timeout: float) -> Path:
    tmp = Path(tempfile.mkdtemp(prefix="download.", dir=dest))
    try:
        _run(apt_download_argv(package), timeout=timeout, cwd=tmp)
        debs = list(tmp.glob("*.deb"))
        if len(debs) != 1:
            raise ImageError(f"apt-get download {package} produced {len(debs)} .deb files")
        final = dest / debs[0].name
        debs[0].replace(final)
        return final
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _unpack(deb: Path, vdir: Path, timeout: float) -> None:
    """vmlinuz, config and the module subset (SHARE/PRELOAD/AUTOLOAD closures) out of the .deb."""
    tree = Path(tempfile.mkdtemp(prefix="unpack.", dir=vdir))
    try:
        _run(unpack_argv(deb, tree), timeout=timeout)
        releases = [p.name for p in (tree / "lib/modules").iterdir()]
        if len(releases) != 1:
            raise ImageError(f"{deb.name}: expected one /lib/modules/<release>, found {releases}")
        release = releases[0]
        moddir = tree / "lib/modules" / release
        shutil.copy(tree / f"boot/vmlinuz-{release}", vdir / "vmlinuz")
        shutil.copy(tree / f"boot/config-{release}", vdir / "config")
        _run(depmod_argv(tree, release), timeout=timeout)
        deps = parse_modules_dep((moddir / "modules.dep").read_text())
        share = share_for_config((vdir / "config").read_text())
        builtin = _builtin(moddir)
        wanted = (set(closure(deps, _load_roots(moddir, share), builtin))
                  | set(closure(deps, _globbed(moddir, AUTOLOAD_GLOBS))))
        out = vdir / "lib/modules" / release
        shutil.rmtree(vdir / "lib", ignore_errors=True)
        for rel in sorted(wanted):  # uncompressed (6.12 ships .ko.xz): busybox insmod takes them as they are
            dest = out / re.sub(r"\.(xz|gz)$", "", rel)
            dest.parent.mkdir(parents=True, exist_ok=True)
            data = (moddir / rel).read_bytes()
            dest.write_bytes(lzma.decompress(data) if rel.endswith(".xz")
                             else gzip.decompress(data) if rel.endswith(".gz") else data)
        for name in ("modules.order", "modules.builtin", "modules.builtin.modinfo"):
            if (moddir / name).exists():
                shutil.copy(moddir / name, out / name)
        _run(depmod_argv(vdir, release), timeout=timeout)  # modules.dep/.alias of the subset
        (vdir / "release").write_text(release)
        (vdir / "subset").write_text(subset_key())
    finally:
        shutil.rmtree(tree, ignore_errors=True)


def subset_key() -> str:
    """Changes when the module lists change: the cached subset is then re-extracted from the .deb."""
    return hashlib.sha256(json.dumps([BOOT_MODULES, SHARE_MODULES, PRELOAD_MODULES, PRELOAD_GLOBS,
                                      AUTOLOAD_GLOBS]).encode()).hexdigest()[:12]


def _builtin(moddir: Path) -> list[str]:
    return (moddir / "modules.builtin").read_text().split() if (moddir / "modules.builtin").exists() else []


def _load_roots(moddir: Path, share: str) -> list[str]:
    return BOOT_MODULES + SHARE_MODULES[share] + PRELOAD_MODULES + _globbed(moddir, PRELOAD_GLOBS)


def _globbed(moddir: Path, patterns: list[str]) -> list[str]:
    found = sorted(str(p.relative_to(moddir)) for pat in patterns for p in moddir.glob(pat))
    return [f for f in found if module_name(f) not in NOT_CC]


def _build_initramfs(vdir: Path, release: str, share: str) -> Path:
    if not BUSYBOX.exists():
        raise ImageError(f"{BUSYBOX} missing: install busybox-static (make vm-deps)")
    busybox = BUSYBOX.read_bytes()
    if b"/lib64/ld-linux" in busybox[:4096]:
        raise ImageError(f"{BUSYBOX} is dynamically linked: install busybox-static (make vm-deps)")
    moddir = vdir / "lib/modules" / release
    deps = parse_modules_dep((moddir / "modules.dep").read_text())
    load = closure(deps, _load_roots(moddir, share), _builtin(moddir))
    autoload = sorted(set(deps) - set(load))
    path = vdir / f"initramfs-{recipe_hash(share, load, autoload, busybox)}.cpio"
    if path.exists():
        return path
    modules = {rel: (moddir / rel).read_bytes() for rel in deps}
    extra = {p.name: p.read_bytes() for p in moddir.glob("modules.*")}
    path.with_suffix(".part").write_bytes(cpio_newc(initramfs_entries(busybox, release, modules, load, extra)))
    path.with_suffix(".part").replace(path)
    for old in set(vdir.glob("initramfs-*.cpio")) - {path}:  # an older recipe's (QEMU read it at start)
        old.unlink()
    return path


def ensure_image(package: str | None = None, timeout_s: float = 600.0) -> KernelImage:
    """Download/unpack/build what is missing for `package` (default: newest 6.1 generic) and return it."""
    started = time.monotonic()
    package = check_package(package or default_package())
    version = package_version(package)
    vdir = CACHE_ROOT / package / version
    vdir.mkdir(parents=True, exist_ok=True)
    with open(CACHE_ROOT / package / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # two `lab up`s building the same image wait for each other
        built = False
        subset = vdir / "subset"
        if not (vdir / "release").exists() or not subset.exists() or subset.read_text() != subset_key():
            debs = sorted(vdir.glob("*.deb")) or [_download(package, vdir, timeout_s)]
            _unpack(debs[0], vdir, timeout_s)
            built = True
        release = (vdir / "release").read_text().strip()
        share = share_for_config((vdir / "config").read_text())
        before = set(vdir.glob("initramfs-*.cpio"))
        initramfs = _build_initramfs(vdir, release, share)
        built |= initramfs not in before
        (vdir / "vmlinuz").touch()  # newest-used ordering for offline fallback
    return KernelImage(package, version, release, share, vdir / "vmlinuz", initramfs,
                       time.monotonic() - started if built else 0.0)
