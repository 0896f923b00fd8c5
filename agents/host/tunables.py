"""Kernel tunables the agent reads and writes as files: sysctls under /proc/sys and module parameters under
/sys/module/<module>/parameters, plus the congestion-control lists /proc/sys reports.

Only sysctls and module parameters that exist on this kernel are written (G-SYSCTL): an unknown name is
refused, never skipped. Names are checked against a pattern before they become paths; whether the agent may
write them at all (its allow-lists, schemas/allowlist.py) is decided before, by the executor.
"""
from __future__ import annotations

import os
import re
from pathlib import Path

from agents.host.errors import StateError
from schemas.allowlist import MODULE_NAME_PATTERN, PARAM_NAME_PATTERN, SYSCTL_NAME_PATTERN

SYSCTL_NAME = re.compile(SYSCTL_NAME_PATTERN)
MODULE_NAME = re.compile(MODULE_NAME_PATTERN)
PARAM_NAME = re.compile(PARAM_NAME_PATTERN)


def sysctl_path(name: str) -> Path:
    """/proc/sys path of a dotted name; a `/` inside a component is a `.` of the name (eth0/100: eth0.100)."""
    if not SYSCTL_NAME.fullmatch(name):
        raise StateError(f"not a sysctl name: {name!r}", field=f"state.sysctls.{name}")
    return Path("/proc/sys", *(part.replace("/", ".") for part in name.split(".")))


def read_sysctl(name: str) -> str:
    return " ".join(sysctl_path(name).read_text().split())


def write_sysctl(name: str, value: str) -> None:
    path = sysctl_path(name)
    if not path.exists():
        raise StateError(f"sysctl {name} does not exist on kernel {os.uname().release}",
                         field=f"state.sysctls.{name}")
    try:
        path.write_text(value)
    except OSError as exc:
        raise StateError(f"sysctl {name}={value!r} refused by the kernel: {exc.strerror}",
                         field=f"state.sysctls.{name}") from exc


def module_dir(module: str) -> Path:
    if not MODULE_NAME.fullmatch(module):
        raise StateError(f"not a module name: {module!r}", field=f"state.module_params.{module}")
    return Path("/sys/module") / module


def module_param_path(module: str, param: str) -> Path:
    if not PARAM_NAME.fullmatch(param):
        raise StateError(f"not a module parameter: {module}.{param}", field=f"state.module_params.{module}")
    return module_dir(module) / "parameters" / param


def read_module_param(module: str, param: str) -> str:
    return module_param_path(module, param).read_text().strip()


def write_module_param(module: str, param: str, value: str) -> None:
    where = f"state.module_params.{module}.{param}"
    path = module_param_path(module, param)
    if not path.exists():
        raise StateError(f"module {module} has no parameter {param} on kernel {os.uname().release}", field=where)
    if not os.stat(path).st_mode & 0o200:
        raise StateError(f"parameter {module}.{param} is read-only at runtime (a boot/load-time parameter)",
                         field=where)
    try:
        path.write_text(value)
    except OSError as exc:
        raise StateError(f"{module}.{param}={value!r} refused by the kernel: {exc.strerror}", field=where) from exc


def _words(path: str) -> list[str]:
    p = Path(path)
    return p.read_text().split() if p.exists() else []


def congestion_controls() -> dict[str, list[str]]:
    return {"available": _words("/proc/sys/net/ipv4/tcp_available_congestion_control"),
            "allowed": _words("/proc/sys/net/ipv4/tcp_allowed_congestion_control")}
