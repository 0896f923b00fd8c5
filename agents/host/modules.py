"""Kernel modules the agent loads for a plan: a congestion control with its load-time parameters
(`module_params`), and the module of a qdisc kind of tcplab's own (`QdiscKind.module`, e.g. sch_aqm_mark).

A module is loaded from the agent's module directories (`--module-dir`, a `<name>.ko` there: a VM-lab guest
insmods the host's build) or else by `modprobe` (a host where a playbook installed it under
/lib/modules/<release>/extra and ran depmod). The argv builders are pure; the module name must be on the
agent's allow-list (checked by the executor before) and match the module-name pattern, and every parameter is
`name=value` with a value of one printable token, so a plan can add nothing else to the command line.
"""
from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping
from pathlib import Path

from agents.host.errors import StateError
from agents.host.tunables import MODULE_NAME, PARAM_NAME, module_dir
from schemas import procs

# one printable token: no blank, no quote or backslash (insmod and modprobe would read them as syntax)
PARAM_VALUE = re.compile(r"^[!#-&(-\[\]-~]{1,256}$")


def param_words(module: str, params: Mapping[str, str]) -> list[str]:
    """`name=value` words for insmod/modprobe, in name order; refuses what is not one plain token."""
    words = []
    for name, value in sorted(params.items()):
        where = f"state.module_params.{module}.{name}"
        if not PARAM_NAME.fullmatch(name):
            raise StateError(f"not a module parameter name: {module}.{name}", field=where)
        if not PARAM_VALUE.fullmatch(str(value)):
            raise StateError(f"{module}.{name}={value!r}: a module parameter value is one printable token "
                             "without blanks, quotes or backslashes", field=where)
        words.append(f"{name}={value}")
    return words


def load_argv(module: str, params: Mapping[str, str], ko: Path | None) -> list[str]:
    """insmod <dir>/<module>.ko name=value ... when the agent has the file, else modprobe <module> name=value ..."""
    if not MODULE_NAME.fullmatch(module):
        raise StateError(f"not a module name: {module!r}", field=f"state.module_params.{module}")
    return [*(["insmod", str(ko)] if ko is not None else ["modprobe", module]), *param_words(module, params)]


def unload_argv(module: str) -> list[str]:
    if not MODULE_NAME.fullmatch(module):
        raise ValueError(f"not a module name: {module!r}")
    return ["rmmod", module]


def module_file(module: str, dirs: Iterable[Path]) -> Path | None:
    """<dir>/<module>.ko in the first of the agent's module directories that has it."""
    for d in dirs:
        ko = Path(d) / f"{module}.ko"
        if ko.is_file():
            return ko
    return None


def loadable(dirs: Iterable[Path], allowed: Iterable[str]) -> list[str]:
    """Allow-listed modules this agent has a file of in its module directories (whether loaded or not)."""
    ok = set(allowed)
    return sorted({ko.stem for d in dirs for ko in Path(d).glob("*.ko")
                   if ko.stem in ok and MODULE_NAME.fullmatch(ko.stem)})


def builtin_modules(text: str) -> set[str]:
    """The names in a kernel's modules.builtin ("kernel/net/sched/sch_dualpi2.ko" per line), as the kernel
    names modules (dashes read as underscores)."""
    return {Path(line.strip()).name.removesuffix(".ko").replace("-", "_") for line in text.splitlines()
            if line.strip()}


def is_builtin(module: str) -> bool:
    """Built into the running kernel (a tcplab kernel build with CONFIG_NET_SCH_DUALPI2=y): nothing to load, and
    /sys/module has no entry for a built-in module without parameters."""
    try:
        text = (Path("/lib/modules") / os.uname().release / "modules.builtin").read_text()
    except OSError:
        return False
    return module in builtin_modules(text)


def is_loaded(module: str) -> bool:
    """Loaded, or built in (so loading it is neither needed nor possible)."""
    return module_dir(module).exists() or is_builtin(module)


def load(module: str, params: Mapping[str, str], dirs: Iterable[Path]) -> bool:
    """Load `module` with `params` unless it is loaded (or built in) already; True when this call loaded it.
    The kernel's refusal (vermagic, unknown or invalid parameter) is a StateError naming the module."""
    if is_loaded(module):
        return False
    argv = load_argv(module, params, module_file(module, dirs))
    try:
        done = procs.run(argv, check=False)
    except procs.ToolMissing as exc:
        raise StateError(f"module {module} is not loaded and cannot be: {exc}",
                         field=f"state.module_params.{module}") from None
    if done.returncode != 0 or not is_loaded(module):
        why = (done.stderr or done.stdout).strip() or f"exit {done.returncode}"
        raise StateError(f"module {module} could not be loaded on kernel {os.uname().release}: {' '.join(argv)}: {why}",
                         field=f"state.module_params.{module}")
    return True


def unload(module: str) -> str | None:
    """rmmod; None when it is gone, else why not (in use, ...)."""
    done = procs.run(unload_argv(module), check=False)
    if is_loaded(module):
        return f"module {module} is still loaded after rmmod: {(done.stderr or '').strip() or done.returncode}"
    return None
