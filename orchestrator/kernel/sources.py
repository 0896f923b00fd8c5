"""A variant's inputs, pinned (effects: reads files, asks apt and git): the source and its exact version, every
patch, fragment and module tree hashed, the toolchain's versions. Everything that can fail before a build
starts fails here, at once and clearly: a patch file that is not there, a Debian package apt does not know,
a git URL this machine cannot reach (no internet: said in seconds, not after a clone times out)."""
from __future__ import annotations

import functools
import hashlib
import re
import shutil
import subprocess
from pathlib import Path
from urllib.parse import urlparse

from orchestrator.kernel import argv
from orchestrator.kernel.spec import BuildInputs, FileInput, SourceRef
from orchestrator.lab import apt_suite, vm_image, vm_recipe
from orchestrator.lab.vm_recipe import ImageError
from orchestrator.plan.model.kernels import KernelVariant
from schemas import procs
from schemas.digest import sha256_file

REMOTE_TIMEOUT_S = 15.0
MAX_INPUT_FILES = 2000          # files hashed in one module tree


class SourceError(RuntimeError):
    """A build input that is missing, unreadable or unreachable; the message names it."""


def run(cmd: list[str], timeout: float, cwd: Path | None = None) -> str:
    """schemas.procs.run, its failures as SourceError (the last lines of what the tool said)."""
    try:
        return procs.run(cmd, timeout=timeout, cwd=str(cwd) if cwd else None).stdout
    except procs.CommandFailed as exc:
        raise SourceError(f"{' '.join(cmd)} exited {exc.returncode}: {' / '.join(exc.stderr.splitlines()[-3:])}") \
            from None
    except subprocess.TimeoutExpired:
        raise SourceError(f"{' '.join(cmd)}: no result within {timeout:.0f} s") from None


def tree_sha256(root: Path) -> str:
    """A module source tree's hash: every regular file's relative path and content (build products left out)."""
    h = hashlib.sha256()
    files = sorted(p for p in root.rglob("*") if p.is_file() and p.suffix not in (".o", ".ko", ".cmd", ".mod")
                   and not p.name.startswith("."))
    if len(files) > MAX_INPUT_FILES:
        raise SourceError(f"module tree {root}: more than {MAX_INPUT_FILES} files")
    for p in files:
        h.update(str(p.relative_to(root)).encode() + b"\0" + sha256_file(p).encode() + b"\n")
    return h.hexdigest()


def plan_file(plan_dir: Path, name: str, what: str) -> Path:
    path = (plan_dir / name).resolve()
    if not path.exists():
        raise SourceError(f"{what} {name}: no such file ({path})")
    return path


def is_remote(url: str) -> bool:
    return urlparse(url).scheme in ("http", "https", "git", "ssh") or re.match(r"^[\w.-]+@[\w.-]+:", url) is not None


def git_commit(url: str, ref: str, plan_dir: Path) -> str:
    """The commit `ref` names: asked of the remote (`git ls-remote`, REMOTE_TIMEOUT_S) or of a local repository."""
    if is_remote(url):
        try:
            out = run(argv.git_ls_remote(url, ref), REMOTE_TIMEOUT_S)
        except SourceError as exc:
            raise SourceError(f"git source {url} is unreachable from this machine (no internet access, or the "
                              f"server refused): {exc}. Use a local clone (`git: /path/to/linux`), a tarball on "
                              "disk, or a Debian source package (`package: linux-source-6.1`)") from None
        return out.split()[0]
    repo = str(plan_file(plan_dir, url, "git repository"))
    return run(argv.git_rev_parse(repo, ref), 60).strip()


def apt_version(package: str) -> str:
    """apt's candidate version of a Debian source package (which `apt-get download` fetches): the machine's
    own sources first, then the extra suites the labs know (orchestrator.lab.apt_suite: linux-source-7.2 is in
    unstable only)."""
    try:
        out = run(argv.apt_candidate(package), 60)
    except SourceError as exc:
        raise SourceError(f"apt cannot tell the version of {package}: {exc}") from None
    m = re.search(r"Candidate: (\S+)", out)
    if m and m.group(1) != "(none)":
        return m.group(1)
    try:
        version = vm_recipe.apt_version(vm_image.apt_show(package)[0])
    except ImageError:
        version = None
    if version is None:
        raise SourceError(f"apt knows no package {package}, in the machine's sources or in the extra suites "
                          f"{', '.join(apt_suite.EXTRA_SUITES)} (apt-get update?)")
    return version


def apt_options(package: str) -> list[str]:
    """The apt options that find `package`: none when the machine's sources have it, else its extra suite's."""
    try:
        return vm_image.apt_show(package)[1]
    except ImageError as exc:
        raise SourceError(f"apt knows no package {package}: {exc}") from None


@functools.cache
def _toolchain() -> tuple[tuple[str, str], ...]:
    out = []
    for tool, cmd in argv.toolchain_versions().items():
        try:
            out.append((tool, run(cmd, 30).splitlines()[0].strip()))
        except SourceError as exc:
            raise SourceError(f"the kernel build needs {tool}: {exc}") from None
    return tuple(out)


def toolchain() -> dict[str, str]:
    """gcc, ld and make versions, asked once per process (`tcplab run` pins every variant of a plan)."""
    return dict(_toolchain())


def source_ref(variant: KernelVariant, plan_dir: Path) -> SourceRef:
    src = variant.source
    if src is None:
        raise SourceError("a distribution package is installed, not built (no `source`)")
    if src.package is not None:
        return SourceRef("debian-package", src.package, apt_version(src.package))
    if src.tarball is not None:
        path = plan_file(plan_dir, src.tarball, "tarball")
        return SourceRef("tarball", str(path), sha256_file(path))
    assert src.git is not None and src.ref is not None
    return SourceRef("git", src.git, git_commit(src.git, src.ref, plan_dir))


def resolve(name: str, variant: KernelVariant, plan_dir: Path) -> BuildInputs:
    """The pinned inputs of variant `name` (paths relative to `plan_dir`), or SourceError naming what is wrong."""
    src = variant.source
    if src is None:
        raise SourceError(f"kernel variant {name} is a distribution package ({variant.package}): nothing to build")
    files = [FileInput(p, sha256_file(plan_file(plan_dir, p, "patch"))) for p in src.patches]
    frags = [FileInput(c, sha256_file(plan_file(plan_dir, c, "config fragment"))) for c in src.config]
    mods = [FileInput(m, tree_sha256(plan_file(plan_dir, m, "module tree"))) for m in variant.modules]
    return BuildInputs(variant=name, source=source_ref(variant, plan_dir), config_base=src.config_base,
                       patches=tuple(files), fragments=tuple(frags), modules=tuple(mods),
                       localversion=src.localversion, toolchain=toolchain(), arch=src.arch)


def fetch_tree(inputs: BuildInputs, work: Path) -> Path:
    """Unpack the source into `work` and return the tree's top directory."""
    s = inputs.source
    if s.kind == "debian-package":
        run(argv.apt_download(s.name, s.version, apt_options(s.name)), 900, cwd=work)
        deb = next(work.glob(f"{s.name}_*.deb"))
        run(argv.deb_extract(deb, work / "pkg"), 600)
        tarball = next((work / "pkg" / "usr" / "src").glob("linux-source-*.tar.*"))
        deb.unlink()
    elif s.kind == "tarball":
        tarball = Path(s.name)
    else:
        tarball = work / "git.tar"
        run(argv.git_worktree_copy(s.name, s.version, tarball), 900)
        (work / "tree").mkdir()
        run(argv.untar(tarball, work / "tree"), 900)
        tarball.unlink()
        return work / "tree"
    (work / "src").mkdir()
    run(argv.untar(tarball, work / "src"), 1800)
    if s.kind == "debian-package":
        shutil.rmtree(work / "pkg")
    tops = [p for p in (work / "src").iterdir() if p.is_dir()]
    if len(tops) != 1 or not (tops[0] / "Makefile").exists():
        raise SourceError(f"{s.name}: the tarball does not hold one kernel tree (found {[p.name for p in tops]})")
    return tops[0]
