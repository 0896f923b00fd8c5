"""The commands of a kernel build, as argv lists (pure): never a shell string. Run by orchestrator/kernel/builder.py
and sources.py; recorded in each build's metadata so the build can be repeated by hand."""
from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path


def apt_download(package: str, version: str | None = None, opts: Iterable[str] = ()) -> list[str]:
    """`opts`: an extra suite's apt options (orchestrator.kernel.sources.apt_options; none: the machine's)."""
    return ["apt-get", "download", "-q", "-o", "APT::Sandbox::User=root", *opts,
            f"{package}={version}" if version else package]


def apt_candidate(package: str) -> list[str]:
    return ["apt-cache", "policy", package]


def deb_extract(deb: Path, dest: Path) -> list[str]:
    return ["dpkg-deb", "-x", str(deb), str(dest)]


def untar(tarball: Path, dest: Path) -> list[str]:
    return ["tar", "-xaf", str(tarball), "-C", str(dest)]


def git_ls_remote(url: str, ref: str) -> list[str]:
    return ["git", "ls-remote", "--exit-code", url, ref]


def git_rev_parse(repo: str, ref: str) -> list[str]:
    return ["git", "-C", repo, "rev-parse", "--verify", f"{ref}^{{commit}}"]


def git_worktree_copy(repo: str, commit: str, dest: Path) -> list[str]:
    """A tree of `commit` without history: `git archive` into tar, unpacked by the caller (untar)."""
    return ["git", "-C", repo, "archive", "--format=tar", "-o", str(dest), commit]


def patch(tree: Path, patch_file: Path) -> list[str]:
    return ["patch", "-d", str(tree), "-p1", "--forward", "--batch", "--no-backup-if-mismatch", "-i",
            str(patch_file)]


def arch_vars(arch: str) -> tuple[str, ...]:
    """make variables that choose the architecture: none for the host's own (x86_64), `ARCH=um` for User-Mode
    Linux (every make of a um tree needs it, config targets included: without it kconfig reads x86's Kconfig)."""
    return () if arch == "x86_64" else (f"ARCH={arch}",)


def make(tree: Path, *targets: str, jobs: int = 1, extra: tuple[str, ...] = ()) -> list[str]:
    return ["make", "-C", str(tree), f"-j{jobs}", *extra, *targets]


def modules_install(tree: Path, dest: Path, arch: str, module_dir: Path | None = None) -> list[str]:
    """The tree's modules (or, with `module_dir`, an out-of-tree module's: into `extra/`) installed under
    dest/lib/modules/<release>/, debug info stripped (INSTALL_MOD_STRIP=1: a quarter of the size)."""
    ext = (f"M={module_dir}",) if module_dir is not None else ()
    return ["make", "-C", str(tree), *arch_vars(arch), *ext, f"INSTALL_MOD_PATH={dest}", "INSTALL_MOD_STRIP=1",
            "modules_install"]


def depmod(root: Path, release: str) -> list[str]:
    """modules.dep (and the other indexes modprobe reads) for root/lib/modules/<release>."""
    return ["depmod", "-b", str(root), release]


def merge_config(tree: Path, fragments: list[Path]) -> list[str]:
    """Merge fragments into tree/.config (-m: no olddefconfig yet; the builder runs it and checks survivors)."""
    return [str(tree / "scripts" / "kconfig" / "merge_config.sh"), "-m", "-O", str(tree), str(tree / ".config"),
            *[str(f) for f in fragments]]


def scripts_config(tree: Path, *ops: str) -> list[str]:
    """scripts/config on tree/.config (`--disable X`, `--set-str X ""`)."""
    return [str(tree / "scripts" / "config"), "--file", str(tree / ".config"), *ops]


def deb_raw_extract(deb: Path, dest: Path) -> list[str]:
    """A package's files and its DEBIAN/ control directory, to be rebuilt (deb_build)."""
    return ["dpkg-deb", "-R", str(deb), str(dest)]


def clamp_mtimes(root: Path) -> list[str]:
    """Every file's and directory's mtime set to the epoch the build pretends (SOURCE_DATE_EPOCH 0)."""
    return ["find", str(root), "-exec", "touch", "-h", "-d", "@0", "{}", "+"]


def deb_build(root: Path, deb: Path) -> list[str]:
    return ["dpkg-deb", "--root-owner-group", "-b", str(root), str(deb)]


def module_build(tree: Path, module_dir: Path, jobs: int = 1, make_vars: list[str] | tuple[str, ...] = ()) -> list[str]:
    """`make_vars`: VAR=value overrides (modbuild.substitute_compiler_vars)."""
    return ["make", "-C", str(tree), f"-j{jobs}", f"M={module_dir}", *make_vars, "modules"]


def modinfo_vermagic(ko: Path) -> list[str]:
    return ["modinfo", "-F", "vermagic", str(ko)]


def toolchain_versions() -> dict[str, list[str]]:
    """The tools whose versions are part of the build key."""
    return {"gcc": ["gcc", "--version"], "ld": ["ld", "--version"], "make": ["make", "--version"]}
