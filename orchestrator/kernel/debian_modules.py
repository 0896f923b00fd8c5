"""Build an out-of-tree module of experiments/modules/ -- or an in-tree module Debian's config leaves out
(modbuild.SOURCE_MODULES: sch_dualpi2, from the kernel's source package) -- for a VM-lab guest kernel (effects).

`ensure_module("sch_aqm_mark")`: apt-get download the guest kernel's header packages (orchestrator.kernel.modbuild
.header_packages), dpkg-deb -x them into CACHE/headers/<release>/<version>/root (nothing is installed), point
the flavour Makefile at the unpacked common tree, `make -C <flavour dir> M=<copy of the sources> modules`,
and check `modinfo -F vermagic` against a module of the guest's own tree. The .ko is cached under
CACHE/build/<module>/<key> (key: sha256 of sources, headers version, compiler, make overrides); a second call
builds nothing. Packages come from whichever suite knows them (the system's, else Debian unstable:
orchestrator.lab.apt_suite). When the headers' compiler is not installed (7.2: gcc 16) the host's gcc builds
with modbuild.substitute_compiler_vars, and when the kbuild package's binaries need a newer glibc, objtool and
modpost come from the kernel's source package (orchestrator.kernel.debian_source).

    python -m orchestrator.kernel.debian_modules [--kernel linux-image-6.1.0-56-amd64] [--module sch_aqm_mark]
    python -m orchestrator.kernel.debian_modules --kernel linux-image-7.2.13+deb14-amd64 --module sch_dualpi2
"""
from __future__ import annotations

import argparse
import fcntl
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from orchestrator.kernel import argv as kargv
from orchestrator.kernel import debian_source
from orchestrator.kernel.modbuild import (
    MODULES_DIR,
    SOURCE_MODULES,
    BuiltModule,
    ModuleBuildError,
    build_dir,
    cache_key,
    check_vermagic,
    compiler_from_variables,
    compiler_version_argv,
    config_state,
    first_line,
    header_packages,
    headers_dir,
    module_sources,
    needs_newer_glibc,
    reference_module,
    relocated_makefile,
    source_module_files,
    source_package,
    substitute_compiler_vars,
)
from orchestrator.lab import vm_image
from orchestrator.lab.vm_recipe import check_package, unpack_argv

CACHE = Path(os.environ.get("TCPLAB_MODBUILD_CACHE", "/var/cache/tcplab/modules"))


def _ensure_headers(package: str, timeout_s: float) -> tuple[Path, str]:
    """The unpacked kernel build dir for the image `package`, and the headers package version."""
    hp = header_packages(package)
    version = vm_image.package_version(hp.flavour)
    hdir = headers_dir(CACHE, hp, version)
    hdir.mkdir(parents=True, exist_ok=True)
    root = hdir / "root"
    with open(hdir / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (hdir / "ready").exists():
            shutil.rmtree(root, ignore_errors=True)
            for name in hp.names:
                debs = sorted(hdir.glob(f"{name}_*.deb")) or [vm_image._download(name, hdir, timeout_s)]
                vm_image._run(unpack_argv(debs[-1], root), timeout=timeout_s)
            makefile = hp.flavour_dir(root) / "Makefile"
            makefile.write_text(relocated_makefile(makefile.read_text(), root))
            if not (hp.flavour_dir(root) / "scripts" / "Makefile.build").exists():
                raise ModuleBuildError(f"{hp.kbuild} did not provide the scripts the headers link to")
            (hdir / "ready").write_text(" ".join(hp.names) + "\n")
    return hp.flavour_dir(root), version


def guest_vermagic(package: str, timeout_s: float) -> str:
    """vermagic of a module of the guest's own tree (the VM lab's cached image; built if missing)."""
    image = vm_image.ensure_image(package, timeout_s=timeout_s)
    ref = reference_module((image.vmlinuz.parent / "lib" / "modules" / image.release).rglob("*.ko"))
    if ref is None:
        raise ModuleBuildError(f"no module in the image of {package} to compare vermagic with")
    return vm_image._run(kargv.modinfo_vermagic(ref), timeout=60)


def _kbuild_runs(kdir: Path) -> bool:
    """Whether the kbuild package's binaries run here (objtool stands for them: one package, one glibc)."""
    done = subprocess.run([str(kdir / "tools/objtool/objtool")], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "SRCARCH": "x86"}, check=False)
    return not needs_newer_glibc(done.stdout + done.stderr)


def _sources(name: str, package: str, config: str, timeout_s: float) -> dict[str, bytes]:
    """experiments/modules/<name>/'s files, or for an in-tree module its file from the kernel's source package."""
    if (MODULES_DIR / name).is_dir():
        sources = module_sources(MODULES_DIR / name)
        if f"{name}.c" not in sources:
            raise ModuleBuildError(f"{MODULES_DIR / name} has no {name}.c")
        return sources
    if name not in SOURCE_MODULES:
        raise ModuleBuildError(f"no module {name}: neither {MODULES_DIR / name} nor one of {sorted(SOURCE_MODULES)}")
    rel, option = SOURCE_MODULES[name]
    if config_state(config, option) in ("y", "m"):
        raise ModuleBuildError(f"{package} has {option}={config_state(config, option)}: nothing to build")
    tree = debian_source.ensure_source(source_package(package), CACHE, timeout_s)
    return source_module_files(name, tree.file(rel))


def _make_vars(package: str, kdir: Path, compiler: str, config: str, timeout_s: float) -> tuple[str, list[str]]:
    """The compiler to build with and the make overrides (none when the headers' own toolchain runs here)."""
    host = compiler if shutil.which(compiler) else "gcc"
    if host == compiler and _kbuild_runs(kdir):
        return compiler, []
    tools = None
    if not _kbuild_runs(kdir):
        tree = debian_source.ensure_source(source_package(package), CACHE, timeout_s)
        tools = debian_source.host_tools(tree, config, host, timeout_s)
    return host, substitute_compiler_vars(config, host, tools)


def ensure_module(name: str = "sch_aqm_mark", package: str | None = None, timeout_s: float = 900.0) -> BuiltModule:
    """Build (or take from the cache) <name>.ko for the guest kernel `package` (default: the VM lab's, the
    newest linux-image-6.1.0-*-amd64): experiments/modules/<name>/, or modbuild.SOURCE_MODULES' file."""
    package = check_package(package or vm_image.default_package())
    kdir, version = _ensure_headers(package, timeout_s)
    config = (kdir / ".config").read_text()
    compiler, make_vars = _make_vars(package, kdir, compiler_from_variables((kdir / ".kernelvariables").read_text()),
                                     config, timeout_s)
    cc = first_line(vm_image._run(compiler_version_argv(compiler), timeout=60))
    sources = _sources(name, package, config, timeout_s)
    key = cache_key(sources, version, " ".join([cc, *make_vars]))
    bdir = build_dir(CACHE, name, key)
    release = header_packages(package).release
    meta = bdir / "build.json"
    if meta.exists():
        data = json.loads(meta.read_text())
        return BuiltModule(name, bdir / f"{name}.ko", data["vermagic"], release, key, 0.0)
    bdir.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f"{key[:16]}.", dir=bdir.parent))
    try:
        for fname, data in sources.items():
            (work / fname).write_bytes(data)
        started = time.monotonic()
        vm_image._run(kargv.module_build(kdir, work, jobs=2, make_vars=make_vars), timeout=timeout_s)
        build_s = time.monotonic() - started
        vermagic = first_line(vm_image._run(kargv.modinfo_vermagic(work / f"{name}.ko"), timeout=60))
        check_vermagic(vermagic, guest_vermagic(package, timeout_s))
        (work / "build.json").write_text(json.dumps(
            {"vermagic": vermagic, "build_s": round(build_s, 2), "headers_version": version, "compiler": cc,
             "make_vars": make_vars, "package": package}, indent=1))
        work.chmod(0o755)
        if bdir.exists():  # a concurrent build finished first
            shutil.rmtree(work)
        else:
            work.rename(bdir)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return BuiltModule(name, bdir / f"{name}.ko", vermagic, release, key, build_s)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m orchestrator.kernel.debian_modules",
                                description=__doc__.splitlines()[0])
    p.add_argument("--kernel", help="guest kernel image package (default: the VM lab's)")
    p.add_argument("--module", default="sch_aqm_mark")
    args = p.parse_args(argv)
    try:
        built = ensure_module(args.module, args.kernel)
    except vm_image.ImageError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(built.to_json(), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
