"""User-Mode Linux builds (`arch: um`), the pure part: the steps after the config as argv lists, and where a
build's files are in its cache entry (docs/kernels.md, "UML kernels").

A um build makes no Debian packages. `make ARCH=um linux modules` gives the `linux` binary (a program: each
host of the UML lab is one process running it) and the in-tree modules; `modules_install` puts those under
`<entry>/modules/lib/modules/<release>/kernel/`, the variant's out-of-tree modules under `.../extra/`, and
depmod indexes them all, so `modprobe -d <entry>/modules` finds them and `insmod` takes them by path.

    <entry>/linux                                   the UML kernel, not stripped (see BINARY)
    <entry>/modules/lib/modules/<release>/          modules.dep, kernel/**/*.ko, extra/<module>.ko
    <entry>/config, build.log, metadata.json        as for every build; metadata `arch: um`
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from orchestrator.kernel import argv
from orchestrator.kernel.spec import REPRODUCIBLE_ENV

ARCH = "um"
# The binary is kept as linked: stripping it saves space, but the symbols are what a gdb session on a UML
# host (`gdb -p <pid>`, the point of running a kernel as a process) reads; tracing needs only kallsyms.
BINARY = "linux"
MODULES = "modules"                     # INSTALL_MOD_PATH inside the entry
EXTRA = "extra"                          # where modules_install puts out-of-tree modules (INSTALL_MOD_DIR default)
# Where the build's temporary directory (the tree, the out-of-tree modules' copies) reads in the debug info. The
# UML defconfig has DEBUG_INFO: without the map, the directory's absolute path (it holds the builder's pid) is in
# the binary and, through the build ids, in every module, so two builds of one key differed in every file
# (Documentation/kbuild/reproducible-builds.rst: "Absolute filenames").
DEBUG_PREFIX = "/tcplab-build"
# modules_install links these to the tree it ran in: a temporary directory, gone once the build is published
TREE_LINKS = ("build", "source")


@dataclass(frozen=True)
class Step:
    name: str
    argv: list[str]
    env: dict[str, str] | None = None


def build_env(work: Path) -> dict[str, str]:
    """The environment of every compiling step: the fixed timestamp, user and host, and the build directory
    mapped to DEBUG_PREFIX in the debug info (C and assembler)."""
    prefix_map = f"-fdebug-prefix-map={work}={DEBUG_PREFIX}"
    return {**REPRODUCIBLE_ENV, "KCFLAGS": prefix_map, "KAFLAGS": prefix_map}


def compile_steps(tree: Path, out: Path, work: Path, jobs: int) -> list[Step]:
    """The kernel and its in-tree modules, built (in `work`, the build's temporary directory) and installed
    into the entry being written (`out`)."""
    um = argv.arch_vars(ARCH)
    return [Step("make ARCH=um linux modules", argv.make(tree, "linux", "modules", jobs=jobs, extra=um),
                 build_env(work)),
            Step("make ARCH=um modules_install", argv.modules_install(tree, out / MODULES, ARCH), REPRODUCIBLE_ENV)]


def module_install_step(tree: Path, module_dir: Path, out: Path) -> Step:
    """An out-of-tree module built against the UML tree (builder.build_modules, with ARCH=um; its vermagic
    checked) installed into `extra/`."""
    return Step(f"install module {module_dir.name}",
                argv.modules_install(tree, out / MODULES, ARCH, module_dir=module_dir), REPRODUCIBLE_ENV)


def index_step(out: Path, release: str) -> Step:
    """depmod over everything installed (modules_install runs it too, but before the out-of-tree modules)."""
    return Step("depmod", argv.depmod(out / MODULES, release))


def modules_root(entry: Path, release: str) -> Path:
    """The directory that holds modules.dep."""
    return entry / MODULES / "lib" / "modules" / release


def extra_dir(entry: Path, release: str) -> Path:
    """The variant's out-of-tree modules, one `<name>.ko` each (what an agent's --module-dir takes)."""
    return modules_root(entry, release) / EXTRA


def tree_links(entry: Path, release: str) -> list[Path]:
    return [modules_root(entry, release) / name for name in TREE_LINKS]
