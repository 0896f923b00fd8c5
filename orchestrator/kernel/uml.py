"""Which User-Mode Linux kernel the UML lab boots (docs/kernels.md, "UML kernels").

Two kinds, one description (`UmlKernel`):
- a tcplab build of an `arch: um` variant, from the kernel cache; the **stock** one is
  experiments/kernels/uml-lab.yaml's `uml-6.1` (event tracing with tcp:tcp_probe, HZ 1000, the studies'
  qdiscs and congestion controls built in, the project's modules built against it);
- Debian's `user-mode-linux` package: /usr/bin/linux.uml and /usr/lib/uml/modules/<release>/ (HZ 100, no
  tracing: no tcp_probe).

`stock_uml()` is the stock build when the cache holds it, else Debian's; `ensure_stock_uml(build=True)` builds
it first. The pure part (`kernel_of_build`, `kernel_of_debian`) describes what is on disk; the rest looks.
"""
from __future__ import annotations

import subprocess
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from orchestrator.kernel import cache, umbuild
from orchestrator.kernel.spec import BuildInputs, parse_config

REPO_ROOT = Path(__file__).resolve().parents[2]
STOCK_PLAN = REPO_ROOT / "experiments" / "kernels" / "uml-lab.yaml"
STOCK_VARIANT = "uml-6.1"
DEBIAN_PACKAGE = "user-mode-linux"
DEBIAN_BINARY = Path("/usr/bin/linux.uml")
DEBIAN_MODULES = Path("/usr/lib/uml/modules")      # <release>/ holds modules.dep directly (no lib/modules/)
TRACING = "CONFIG_EVENT_TRACING"                    # tracefs events: tcp:tcp_probe, net:*, qdisc:*
QUERY_TIMEOUT_S = 15.0


class UmlKernelError(RuntimeError):
    """No UML kernel to boot, or a build that is not one; the message says what to do."""


@dataclass(frozen=True)
class UmlKernel:
    """A UML kernel a lab host can run: `binary umid=... mem=... root=/dev/root rootfstype=hostfs ...`.

    `modules_root` is the directory that holds modules.dep and the module tree (`kernel/...`), whichever
    layout the kernel came with: `<entry>/modules/lib/modules/<release>` for a build,
    `/usr/lib/uml/modules/<release>` for Debian's (whose qdiscs and congestion controls are there:
    `insmod <modules_root>/kernel/net/sched/sch_netem.ko`; the stock build has them built in).
    `extra_modules` holds the variant's out-of-tree modules as `<name>.ko` (an agent's --module-dir; None for
    Debian's). `source` says where it came from: `build:<variant>` or `debian:user-mode-linux=<version>`."""

    binary: Path
    modules_root: Path | None
    release: str
    build_key: str | None
    tracing: bool
    source: str
    extra_modules: Path | None = None

    def to_json(self) -> dict:
        """As a lab's inventory records it (paths as text)."""
        return {k: str(v) if isinstance(v, Path) else v for k, v in asdict(self).items()}

    @property
    def install_root(self) -> Path | None:
        """The directory that contains `lib/modules/<release>` (`modprobe -d`, `depmod -b`): a build's
        `<entry>/modules`; None for Debian's, whose tree is not laid out that way."""
        if self.build_key is None or self.modules_root is None:
            return None
        return self.modules_root.parents[2]


# ------------------------------------------------------------------ pure


def tracing_enabled(config: str) -> bool:
    return parse_config(config).get(TRACING) == "y"


def kernel_of_build(entry: Path, metadata: dict, config: str) -> UmlKernel:
    """A cached um build as a UmlKernel (UmlKernelError for a build of another arch)."""
    if metadata.get("arch") != umbuild.ARCH:
        raise UmlKernelError(f"build {metadata.get('key', entry.name)[:16]} ({metadata.get('variant')}) is for "
                             f"{metadata.get('arch', 'x86_64')}, not a User-Mode Linux kernel (arch: um)")
    release = metadata["release"]
    extra = umbuild.extra_dir(entry, release)
    return UmlKernel(binary=entry / umbuild.BINARY, modules_root=umbuild.modules_root(entry, release),
                     release=release, build_key=metadata["key"], tracing=tracing_enabled(config),
                     source=f"build:{metadata.get('variant', '?')}",
                     extra_modules=extra if any(p.suffix == ".ko" for p in _listing(extra)) else None)


def kernel_of_debian(binary: Path, release: str, modules_root: Path | None, version: str) -> UmlKernel:
    """Debian's package as a UmlKernel: its config has no event tracing (no tcp_probe)."""
    return UmlKernel(binary=binary, modules_root=modules_root, release=release, build_key=None, tracing=False,
                     source=f"debian:{DEBIAN_PACKAGE}={version}")


def _listing(path: Path) -> list[Path]:
    return sorted(path.iterdir()) if path.is_dir() else []


# ------------------------------------------------------------------ effects: reading the cache and the system


def stock_variant():
    """The stock variant as the plan file declares it: (name, KernelVariant, the plan's directory)."""
    from orchestrator.plan import load_plan

    return STOCK_VARIANT, load_plan(STOCK_PLAN).kernels[STOCK_VARIANT], STOCK_PLAN.parent


def stock_uml_inputs() -> BuildInputs:
    """The stock variant's pinned inputs, and so its build key. Reads only (the plan, the files' hashes, apt's
    candidate version of linux-source-6.1, the toolchain's versions); SourceError when one cannot be pinned."""
    from orchestrator.kernel.sources import resolve

    name, variant, plan_dir = stock_variant()
    return resolve(name, variant, plan_dir)


def _of_entry(e: cache.Entry) -> UmlKernel:
    config = (e.path / "config").read_text() if (e.path / "config").exists() else ""
    return kernel_of_build(e.path, e.metadata, config)


def find_uml_build(key_or_release: str | None = None, root: Path = cache.DEFAULT_ROOT) -> UmlKernel | None:
    """A cached UML build: by key prefix, release or variant name (the newest um build that matches), or with
    None the stock variant's exact build (its inputs as they are now: an edited fragment is another build).
    None when there is none."""
    from orchestrator.kernel.sources import SourceError

    if key_or_release is None:
        try:
            e = cache.entry(root, stock_uml_inputs().key)
        except SourceError:
            return None
        return _of_entry(e) if e is not None and e.metadata.get("arch") == umbuild.ARCH else None
    found = [e for e in cache.find(root, key_or_release) if e.metadata.get("arch") == umbuild.ARCH]
    return _of_entry(found[0]) if found else None


def _query(cmd: list[str]) -> str:
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=QUERY_TIMEOUT_S, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return done.stdout.strip() if done.returncode == 0 else ""


def debian_uml(binary: Path = DEBIAN_BINARY, modules: Path = DEBIAN_MODULES) -> UmlKernel | None:
    """Debian's user-mode-linux package, or None when it is not installed. The release is the binary's own
    (`linux.uml --version` prints it and exits: it boots nothing)."""
    if not binary.is_file():
        return None
    release = _query([str(binary), "--version"]).splitlines()[-1:] or [""]
    release_dirs = [p for p in _listing(modules) if (p / "modules.dep").exists()]
    if not release[0]:
        if len(release_dirs) != 1:
            return None
        release = [release_dirs[0].name]
    root = modules / release[0]
    version = _query(["dpkg-query", "-W", "-f=${Version}", DEBIAN_PACKAGE]) or "unknown"
    return kernel_of_debian(binary, release[0], root if (root / "modules.dep").exists() else None, version)


def stock_uml(root: Path = cache.DEFAULT_ROOT) -> UmlKernel:
    """The stock build if the cache holds it, else Debian's package; UmlKernelError when there is neither."""
    kernel = find_uml_build(None, root) or debian_uml()
    if kernel is None:
        raise UmlKernelError(f"no UML kernel: the stock build is not cached and {DEBIAN_PACKAGE} is not installed; "
                             f"build it (`tcplab kernel build {STOCK_PLAN.relative_to(REPO_ROOT)} {STOCK_VARIANT}` or "
                             f"`tcplab kernel uml --build`) or `apt-get install {DEBIAN_PACKAGE}`")
    return kernel


def ensure_stock_uml(build: bool, root: Path = cache.DEFAULT_ROOT, jobs: int | None = None,
                     progress: Callable[[str], None] | None = None) -> UmlKernel:
    """The stock build, built into the cache first when `build` and it is not there (minutes: docs/kernels.md);
    without `build`, stock_uml(). SourceError/BuildError name what failed."""
    if not build:
        return stock_uml(root)
    if (found := find_uml_build(None, root)) is not None:
        return found
    return ensure_uml_build(STOCK_PLAN, STOCK_VARIANT, root, jobs, progress)


def ensure_uml_build(plan: Path, name: str, root: Path = cache.DEFAULT_ROOT, jobs: int | None = None,
                     progress: Callable[[str], None] | None = None) -> UmlKernel:
    """The `arch: um` variant `name` of `plan`, built into the cache first when it is not there. Progress goes
    to `progress`, or to a rich status line as `tcplab kernel build` shows it. SourceError/BuildError name what
    failed."""
    from orchestrator.kernel import builder
    from orchestrator.plan import load_plan

    variant = load_plan(plan).kernels[name]
    where = plan.resolve()
    command = f"tcplab kernel build {where.relative_to(REPO_ROOT) if where.is_relative_to(REPO_ROOT) else where} {name}"
    if progress is not None:
        outcome = builder.build(name, variant, plan.parent, root, jobs=jobs, progress=progress, command=command)
    else:
        from rich.console import Console

        with Console(stderr=True).status(f"building {name}") as status:
            outcome = builder.build(name, variant, plan.parent, root, jobs=jobs, command=command,
                                    progress=lambda step: status.update(f"{name}: {step}"))
    if outcome.entry.metadata.get("arch") != umbuild.ARCH:
        raise UmlKernelError(f"{plan}: kernel variant {name} is not an `arch: um` build")
    return _of_entry(outcome.entry)
