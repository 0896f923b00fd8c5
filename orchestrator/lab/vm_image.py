"""Kernel images for the VM lab (effects): fetch a Debian kernel package with apt, unpack it with
dpkg-deb, resolve its modules with busybox depmod, write the module subset and the initramfs.

What goes in (package names, module selection, the stage-1 `/init`, the archive) is decided by the pure
orchestrator.lab.vm_recipe. Everything lands in CACHE_ROOT/<package>/<version>/ -- the .deb, vmlinuz, the
module subset, and the initramfs named after a hash of its recipe -- so a second `lab up --kind vm` builds
nothing.
"""
from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from orchestrator.lab import apt_suite
from orchestrator.lab.vm_recipe import (
    BUSYBOX,
    DEFAULT_SERIES,
    ImageError,
    KernelImage,
    apt_download_argv,
    apt_pkgnames_argv,
    apt_version,
    apt_version_argv,
    check_package,
    cpio_newc,
    depmod_argv,
    initramfs_entries,
    initramfs_name,
    load_order,
    newest_matching,
    one_release,
    parse_modules_dep,
    share_for_config,
    static_busybox,
    subset,
    subset_key,
    uncompressed,
    unpack_argv,
)

CACHE_ROOT = Path(os.environ.get("TCPLAB_VM_CACHE", "/var/cache/tcplab/vm"))


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
    return resolve_package(f"linux-image-{DEFAULT_SERIES}-*-amd64")


def resolve_package(pattern: str) -> str:
    """The package a name with one `*` for the ABI number (a profile's `linux-image-6.1.0-*-amd64`) means: the
    newest apt knows, else the newest cached (offline). A name without `*` is itself."""
    if "*" not in pattern:
        return pattern
    try:
        names = _run(apt_pkgnames_argv(), timeout=60).split()
    except ImageError:
        names = []
    found = newest_matching(names, pattern) or newest_matching((p.name for p in CACHE_ROOT.glob("linux-image-*")),
                                                                pattern)
    if not found:
        raise ImageError(f"no {pattern} package known to apt (run apt-get update) or cached in {CACHE_ROOT}")
    return found


def suite_options(suite: str, timeout: float = 300.0) -> list[str]:
    """apt options for the extra `suite` (apt_suite): its private list is written and its index fetched when
    missing or older than a day."""
    sdir = apt_suite.suite_dir(CACHE_ROOT, suite)
    opts = apt_suite.options(sdir)
    (sdir / "lists" / "partial").mkdir(parents=True, exist_ok=True)
    (sdir / "cache" / "archives" / "partial").mkdir(parents=True, exist_ok=True)
    with open(sdir / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        files = [Path("/etc/apt/sources.list"), *sorted(Path("/etc/apt/sources.list.d").glob("*"))]
        sources = [p.read_text() for p in files if p.is_file()]
        (sdir / "sources.list").write_text(apt_suite.sources_line(apt_suite.mirror_from_sources(sources), suite))
        stamp = sdir / "updated"
        if not stamp.exists() or time.time() - stamp.stat().st_mtime > apt_suite.MAX_LIST_AGE_S:
            _run(apt_suite.update_argv(opts), timeout=timeout)
            stamp.touch()
    return opts


def apt_show(package: str) -> tuple[str, list[str]]:
    """`apt-cache show` of `package` and the apt options that find it: the system's sources first, then each
    extra suite (apt_suite.EXTRA_SUITES: a 7.2 kernel is in unstable only). Asked each time, like apt."""
    try:
        found = (_run(apt_version_argv(package), timeout=60), [])
    except ImageError as exc:
        found, first = None, exc
        for suite in apt_suite.EXTRA_SUITES:
            opts = suite_options(suite)
            try:
                found = (_run(apt_version_argv(package, opts), timeout=60), opts)
                break
            except ImageError:
                continue
        if found is None:
            raise first from None
    return found


def package_version(package: str) -> str:
    """apt's candidate version of `package`; offline, the newest-used cached one."""
    try:
        version = apt_version(apt_show(package)[0])
    except ImageError as exc:
        cached = _cached_versions(package)
        if cached:
            return cached[-1].parent.name
        raise ImageError(f"apt knows no package {package} (apt-get update?) and none is cached: {exc}") from None
    if version is None:
        raise ImageError(f"apt-cache show {package}: no Version field")
    return version


def _download(package: str, dest: Path, timeout: float) -> Path:
    tmp = Path(tempfile.mkdtemp(prefix="download.", dir=dest))
    try:
        _run(apt_download_argv(package, apt_show(package)[1]), timeout=timeout, cwd=tmp)
        debs = list(tmp.glob("*.deb"))
        if len(debs) != 1:
            raise ImageError(f"apt-get download {package} produced {len(debs)} .deb files")
        final = dest / debs[0].name
        debs[0].replace(final)
        return final
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _parts(package: str) -> list[str]:
    """The packages to download for a kernel image (itself, or 7.x's base/binary/modules)."""
    return apt_suite.split_parts(package, apt_suite.depends(apt_show(package)[0]))


def _read_modules(moddir: Path) -> tuple[dict[str, list[str]], list[str]]:
    """modules.dep and modules.builtin of a module tree (depmod has run)."""
    builtin = moddir / "modules.builtin"
    return (parse_modules_dep((moddir / "modules.dep").read_text()),
            builtin.read_text().split() if builtin.exists() else [])


def _unpack(debs: list[Path], vdir: Path, timeout: float) -> None:
    """vmlinuz, config and the module subset (vm_recipe.subset, uncompressed) out of the .deb(s): one image
    package (6.1, 6.12: /boot and /lib/modules) or 7.x's split parts (apt_suite.split_parts: everything under
    /usr/lib/modules/<release>, modules as .ko.xz)."""
    tree = Path(tempfile.mkdtemp(prefix="unpack.", dir=vdir))
    try:
        for deb in debs:
            _run(unpack_argv(deb, tree), timeout=timeout)
        if not (tree / "lib/modules").exists() and (tree / "usr/lib/modules").exists():
            (tree / "lib").mkdir(exist_ok=True)
            (tree / "usr/lib/modules").rename(tree / "lib/modules")  # where depmod -b looks
        release = one_release(debs[0].name, [p.name for p in (tree / "lib/modules").iterdir()])
        moddir = tree / "lib/modules" / release
        for name, boot, usr in (("vmlinuz", f"boot/vmlinuz-{release}", moddir / "vmlinuz"),
                                ("config", f"boot/config-{release}", moddir / "config")):
            shutil.copy(tree / boot if (tree / boot).exists() else usr, vdir / name)
        _run(depmod_argv(tree, release), timeout=timeout)
        deps, builtin = _read_modules(moddir)
        wanted = subset(deps, builtin, share_for_config((vdir / "config").read_text()))
        out = vdir / "lib/modules" / release
        shutil.rmtree(vdir / "lib", ignore_errors=True)
        for rel in sorted(wanted):
            name, data = uncompressed(rel, (moddir / rel).read_bytes())
            (out / name).parent.mkdir(parents=True, exist_ok=True)
            (out / name).write_bytes(data)
        for name in ("modules.order", "modules.builtin", "modules.builtin.modinfo"):
            if (moddir / name).exists():
                shutil.copy(moddir / name, out / name)
        _run(depmod_argv(vdir, release), timeout=timeout)  # modules.dep/.alias of the subset
        (vdir / "release").write_text(release)
        (vdir / "subset").write_text(subset_key())
    finally:
        shutil.rmtree(tree, ignore_errors=True)


def _build_initramfs(vdir: Path, release: str, share: str) -> Path:
    if not BUSYBOX.exists():
        raise ImageError(f"{BUSYBOX} missing: install busybox-static (make vm-deps)")
    busybox = BUSYBOX.read_bytes()
    if not static_busybox(busybox):
        raise ImageError(f"{BUSYBOX} is dynamically linked: install busybox-static (make vm-deps)")
    moddir = vdir / "lib/modules" / release
    deps, builtin = _read_modules(moddir)
    path = vdir / initramfs_name(deps, builtin, share, busybox)
    if path.exists():
        return path
    modules = {rel: (moddir / rel).read_bytes() for rel in deps}
    extra = {p.name: p.read_bytes() for p in moddir.glob("modules.*")}
    load = load_order(deps, builtin, share)
    path.with_suffix(".part").write_bytes(cpio_newc(initramfs_entries(busybox, release, modules, load, extra)))
    path.with_suffix(".part").replace(path)
    for old in set(vdir.glob("initramfs-*.cpio")) - {path}:  # an older recipe's (QEMU read it at start)
        old.unlink()
    return path


def ensure_image(package: str | None = None, timeout_s: float = 600.0, deb: Path | None = None) -> KernelImage:
    """Download/unpack/build what is missing for `package` (default: newest 6.1 generic) and return it; or, with
    `deb`, for a kernel package already on disk (a `tcplab kernel build`, docs/kernels.md)."""
    started = time.monotonic()
    if deb is not None:
        package, version = deb.name.split("_")[0], deb.name.split("_")[1]
    else:
        package = check_package(package or default_package())
        version = package_version(package)
    vdir = CACHE_ROOT / package / version
    vdir.mkdir(parents=True, exist_ok=True)
    with open(CACHE_ROOT / package / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # two `lab up`s building the same image wait for each other
        built = False
        subset_file = vdir / "subset"
        if not (vdir / "release").exists() or not subset_file.exists() or subset_file.read_text() != subset_key():
            debs = sorted(vdir.glob("*.deb")) or ([Path(shutil.copy(deb, vdir))] if deb is not None
                                                  else [_download(p, vdir, timeout_s) for p in _parts(package)])
            _unpack(debs, vdir, timeout_s)
            built = True
        release = (vdir / "release").read_text().strip()
        share = share_for_config((vdir / "config").read_text())
        before = set(vdir.glob("initramfs-*.cpio"))
        initramfs = _build_initramfs(vdir, release, share)
        built |= initramfs not in before
        (vdir / "vmlinuz").touch()  # newest-used ordering for offline fallback
    return KernelImage(package, version, release, share, vdir / "vmlinuz", initramfs,
                       time.monotonic() - started if built else 0.0)


def package_deb(package: str, timeout_s: float = 600.0) -> Path:
    """The .deb of a Debian kernel image package at apt's version, from the cache or downloaded into it
    (what `tcplab kernel install` copies to hosts that have no internet)."""
    package = check_package(package)
    vdir = CACHE_ROOT / package / package_version(package)
    vdir.mkdir(parents=True, exist_ok=True)
    with open(CACHE_ROOT / package / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        debs = sorted(vdir.glob("*.deb"))
        return debs[0] if debs else _download(package, vdir, timeout_s)
