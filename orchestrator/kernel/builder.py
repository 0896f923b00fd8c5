"""Building a kernel variant (effects): pinned inputs (sources.py) -> tree -> patches -> config -> `make
bindeb-pkg` -> out-of-tree modules -> a cache entry (cache.py) with metadata.json (docs/kernels.md). A
User-Mode Linux variant (`arch: um`) makes the `linux` binary and its module tree instead of packages
(umbuild.py).

Every step runs an argv list (argv.py) with its output appended to the build log; a failing step raises
BuildError naming the step, the command and the log's last lines. The config is checked after
`olddefconfig`: every line of every fragment (and the LOCALVERSION) must have survived, or the build stops
naming the dropped symbols.
"""
from __future__ import annotations

import datetime as dt
import logging
import os
import shutil
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from orchestrator.kernel import argv, cache, umbuild
from orchestrator.kernel.sources import SourceError, fetch_tree, plan_file, resolve
from orchestrator.kernel.spec import REPRODUCIBLE_ENV, BuildInputs, dropped_symbols, localversion, parse_config
from orchestrator.plan.model.kernels import KernelVariant
from schemas.digest import sha256_file

log = logging.getLogger(__name__)
STEP_TIMEOUT_S = 6 * 3600          # a Debian-config build on 2 cores takes hours; a hung step does not
DEBIAN_CONFIG_OFF = ("SYSTEM_TRUSTED_KEYS", "SYSTEM_REVOCATION_KEYS", "MODULE_SIG_KEY")  # Debian's signing keys


class BuildError(RuntimeError):
    """A step of a kernel build failed; the message names the step and what it printed last."""


@dataclass(frozen=True)
class Outcome:
    entry: cache.Entry
    hit: bool


Progress = Callable[[str], None]


class _Steps:
    """Runs a build's commands, logging each with its output, and remembers them for metadata.json."""

    def __init__(self, logfile: Path, progress: Progress) -> None:
        self.logfile, self.progress, self.commands = logfile, progress, []

    def run(self, step: str, cmd: list[str], cwd: Path | None = None, env: dict | None = None) -> str:
        self.progress(step)
        self.commands.append({"step": step, "argv": cmd, **({"env": env} if env else {})})
        started = time.monotonic()
        with open(self.logfile, "a") as out:
            out.write(f"\n### {step}: {' '.join(cmd)}\n")
            out.flush()
            try:
                done = subprocess.run(cmd, cwd=cwd, env={**os.environ, **(env or {})}, stdout=out,
                                      stderr=subprocess.STDOUT, timeout=STEP_TIMEOUT_S, check=False)
            except subprocess.TimeoutExpired:
                raise BuildError(f"{step}: timed out after {STEP_TIMEOUT_S} s ({' '.join(cmd)})") from None
        log.info("kernel build step=%s seconds=%.1f rc=%d", step, time.monotonic() - started, done.returncode)
        if done.returncode != 0:
            tail = self.logfile.read_text(errors="replace").strip().splitlines()[-12:]
            raise BuildError(f"{step} failed (exit {done.returncode}): {' '.join(cmd)}\n  " + "\n  ".join(tail))
        return ""


def _debian_config(inputs: BuildInputs, work: Path, steps: _Steps) -> Path:
    """Debian's config for the source's series: the newest linux-image-<series>.0-*-amd64 apt knows."""
    from orchestrator.lab.vm_image import resolve_package

    series = inputs.source.name.removeprefix("linux-source-") if inputs.source.kind == "debian-package" else None
    if series is None:
        raise BuildError("config_base debian needs a Debian source package (linux-source-X.Y); use defconfig or "
                         "tinyconfig for a git tree or a tarball")
    package = resolve_package(f"linux-image-{series}.0-*-amd64")
    steps.run("download Debian's config", argv.apt_download(package), cwd=work)
    deb = next(work.glob(f"{package}_*.deb"))
    steps.run("unpack Debian's config", argv.deb_extract(deb, work / "image"))
    config = next((work / "image" / "boot").glob("config-*"))
    shutil.copy(config, work / "debian.config")
    shutil.rmtree(work / "image")
    deb.unlink()
    return work / "debian.config"


def configure(inputs: BuildInputs, tree: Path, work: Path, plan_dir: Path, steps: _Steps, jobs: int) -> str:
    """Base config, fragments and LOCALVERSION merged, olddefconfig, every requested line checked."""
    um = argv.arch_vars(inputs.arch)
    if inputs.config_base == "debian":
        if inputs.arch != "x86_64":
            raise BuildError(f"config_base debian is Debian's x86_64 config: no base for arch {inputs.arch}; use "
                             "defconfig or tinyconfig")
        shutil.copy(_debian_config(inputs, work, steps), tree / ".config")
        steps.run("disable Debian's signing keys", argv.scripts_config(
            tree, *[op for k in DEBIAN_CONFIG_OFF for op in ("--set-str", k, "")]))
    else:
        steps.run(" ".join(["make", *um, inputs.config_base]), argv.make(tree, inputs.config_base, jobs=jobs,
                                                                         extra=um))
    lv = work / "localversion.config"
    lv.write_text(f'CONFIG_LOCALVERSION="{localversion(inputs)}"\n# CONFIG_LOCALVERSION_AUTO is not set\n')
    fragments = [plan_file(plan_dir, f.name, "config fragment") for f in inputs.fragments] + [lv]
    steps.run("merge config fragments", argv.merge_config(tree, fragments), env={"ARCH": inputs.arch} if um else None)
    steps.run(" ".join(["make", *um, "olddefconfig"]), argv.make(tree, "olddefconfig", jobs=jobs, extra=um))
    final = parse_config((tree / ".config").read_text())
    dropped = [f"{frag.name}: {d}" for frag in fragments
               for d in dropped_symbols(parse_config(frag.read_text()), final)]
    if dropped:
        raise BuildError("config fragment lines did not survive olddefconfig (a dependency unmet, or a symbol this "
                         "tree does not have): " + "; ".join(dropped))
    return (tree / ".config").read_text()


CHANGELOG_DATE = "$(date -R)"      # scripts/package/mkdebian dates the Debian changelog with the build's clock


def date_changelog_from_epoch(tree: Path) -> bool:
    """The kernel's own packaging script dates the changelog with `date -R`: date it from SOURCE_DATE_EPOCH
    instead (a packaging script, not kernel code: recorded as a step). False when the script does not."""
    script = tree / "scripts" / "package" / "mkdebian"
    text = script.read_text() if script.exists() else ""
    if CHANGELOG_DATE not in text:
        return False
    script.write_text(text.replace(CHANGELOG_DATE, '$(date -R -d "@${SOURCE_DATE_EPOCH}")'))
    return True


def repack_clamped(deb: Path, work: Path, steps: _Steps) -> None:
    """dpkg-deb here does not clamp member mtimes to SOURCE_DATE_EPOCH: unpack, set them, pack again."""
    root = work / "repack"
    shutil.rmtree(root, ignore_errors=True)
    steps.run(f"unpack {deb.name}", argv.deb_raw_extract(deb, root))
    steps.run(f"clamp mtimes of {deb.name}", argv.clamp_mtimes(root))
    deb.unlink()
    steps.run(f"repack {deb.name}", argv.deb_build(root, deb), env=REPRODUCIBLE_ENV)
    shutil.rmtree(root)


def build_modules(inputs: BuildInputs, tree: Path, work: Path, plan_dir: Path, release: str, steps: _Steps,
                  jobs: int, env: dict[str, str] | None = None) -> list[Path]:
    """Each out-of-tree module built against the variant's own tree (with `env`, the kernel's build
    environment); its vermagic must name the release."""
    out = []
    for mod in inputs.modules:
        src = work / "modules" / Path(mod.name).name
        shutil.copytree(plan_file(plan_dir, mod.name, "module tree"), src)
        steps.run(f"build module {mod.name}", argv.module_build(tree, src, jobs=jobs,
                                                                make_vars=argv.arch_vars(inputs.arch)), env=env)
        for ko in sorted(src.glob("*.ko")):
            vermagic = subprocess.run(argv.modinfo_vermagic(ko), capture_output=True, text=True,
                                      check=False).stdout.strip()
            if vermagic.split(" ")[0] != release:
                raise BuildError(f"module {ko.name}: vermagic {vermagic!r} does not name release {release}")
            out.append(ko)
    return out


def package_debian(inputs: BuildInputs, tree: Path, work: Path, out: Path, plan_dir: Path, release: str,
                   steps: _Steps, jobs: int) -> None:
    """`make bindeb-pkg`, the variant's modules, and the packages (mtimes clamped) and .ko files into `out`."""
    if date_changelog_from_epoch(tree):
        steps.commands.append({"step": "date the Debian changelog from SOURCE_DATE_EPOCH",
                               "argv": ["edit", "scripts/package/mkdebian"]})
    steps.run("make bindeb-pkg", argv.make(tree, "bindeb-pkg", jobs=jobs), env=REPRODUCIBLE_ENV)
    modules = build_modules(inputs, tree, work, plan_dir, release, steps, jobs)
    debs = sorted(tree.parent.glob("*.deb"))          # bindeb-pkg writes them next to the tree
    if not any(d.name.startswith(f"linux-image-{release}_") for d in debs):
        raise BuildError(f"make bindeb-pkg made no linux-image-{release} package (found: "
                         f"{', '.join(d.name for d in debs) or 'none'})")
    for deb in debs:
        repack_clamped(deb, work, steps)
        shutil.move(deb, out / deb.name)
    if modules:
        (out / "modules").mkdir()
        for ko in modules:
            shutil.copy(ko, out / "modules" / ko.name)


def package_um(inputs: BuildInputs, tree: Path, work: Path, out: Path, plan_dir: Path, release: str,
               steps: _Steps, jobs: int) -> None:
    """A User-Mode Linux build: the `linux` binary and the module tree (in-tree and the variant's own modules,
    indexed by depmod) into `out` (umbuild.py has the layout)."""
    for step in umbuild.compile_steps(tree, out, work, jobs):
        steps.run(step.name, step.argv, env=step.env)
    built = build_modules(inputs, tree, work, plan_dir, release, steps, jobs, env=umbuild.build_env(work))
    for module_dir in sorted({ko.parent for ko in built}):
        step = umbuild.module_install_step(tree, module_dir, out)
        steps.run(step.name, step.argv, env=step.env)
    for link in umbuild.tree_links(out, release):
        link.unlink(missing_ok=True)
    step = umbuild.index_step(out, release)
    steps.run(step.name, step.argv, env=step.env)
    if not (umbuild.modules_root(out, release) / "modules.dep").exists():
        raise BuildError(f"depmod wrote no modules.dep under {umbuild.modules_root(out, release)}")
    shutil.copy2(tree / umbuild.BINARY, out / umbuild.BINARY)


def build(name: str, variant: KernelVariant, plan_dir: Path, root: Path = cache.DEFAULT_ROOT,
          jobs: int | None = None, progress: Progress = lambda _: None, command: str = "") -> Outcome:
    """Build variant `name` (or find it cached by key); SourceError/BuildError name what failed."""
    inputs = resolve(name, variant, plan_dir)       # fails at once on a missing file or an unreachable source
    key = inputs.key
    if (hit := cache.entry(root, key)) is not None:
        return Outcome(hit, True)
    jobs = jobs or os.cpu_count() or 1
    with cache.locked(root, key):
        if (hit := cache.entry(root, key)) is not None:   # another builder finished it while we waited
            return Outcome(hit, True)
        started, t0 = dt.datetime.now(dt.UTC), time.monotonic()
        tmp = cache.temp_dir(root, key)
        out = tmp / "out"
        out.mkdir()
        steps = _Steps(out / "build.log", progress)
        try:
            progress("fetch source")
            tree = fetch_tree(inputs, tmp)
            for p in inputs.patches:
                steps.run(f"apply {p.name}", argv.patch(tree, plan_file(plan_dir, p.name, "patch")))
            config = configure(inputs, tree, tmp, plan_dir, steps, jobs)
            kernelversion = subprocess.run(argv.make(tree, "kernelversion", extra=("-s", *argv.arch_vars(
                inputs.arch))), capture_output=True, text=True, check=True).stdout.strip()
            release = kernelversion + localversion(inputs)
            if inputs.arch == umbuild.ARCH:
                package_um(inputs, tree, tmp, out, plan_dir, release, steps, jobs)
            else:
                package_debian(inputs, tree, tmp, out, plan_dir, release, steps, jobs)
            (out / "config").write_text(config)
            outputs = [{"name": str(p.relative_to(out)), "sha256": sha256_file(p), "size": p.stat().st_size}
                       for p in sorted(out.rglob("*")) if p.is_file() and p.name != "build.log"]
            meta = {"key": key, "variant": name, "arch": inputs.arch, "release": release,
                    "kernelversion": kernelversion,
                    "inputs": inputs.canonical(), "outputs": outputs, "started_at": started.isoformat(),
                    "finished_at": dt.datetime.now(dt.UTC).isoformat(),
                    "duration_s": round(time.monotonic() - t0, 1), "jobs": jobs, "command": command,
                    "steps": steps.commands}
            entry = cache.publish(out, root, key, meta)
        except (SourceError, BuildError):
            shutil.rmtree(root / f"failed-{key}", ignore_errors=True)
            os.replace(out, root / f"failed-{key}") if out.exists() else None   # keep the log to read
            raise
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return Outcome(entry, False)


def dry_run(name: str, variant: KernelVariant, plan_dir: Path, root: Path = cache.DEFAULT_ROOT) -> tuple[str, bool]:
    """(key, cached?) without building anything."""
    inputs = resolve(name, variant, plan_dir)
    return inputs.key, cache.entry(root, inputs.key) is not None
