"""Reading and writing single pieces of host state (sysctls, module parameters, ethtool settings, neighbours,
qdiscs) and the read-back a run records as evidence. The executor (executor.py) composes them.

Only sysctls and module parameters that exist on this kernel are written (G-SYSCTL): an unknown name is
refused, never skipped.
"""
from __future__ import annotations

import json
import os
import re
from pathlib import Path

from pyroute2 import IPRoute

from agents import procs
from agents.host import ethtool
from agents.host.argv import readback_argv, tc_handle
from schemas.protocol import InterfaceReadback, Readback

SYSCTL_NAME = re.compile(r"^[a-z0-9_]+(\.[a-z0-9_-]+)+$")
MODULE_NAME = re.compile(r"^[a-z0-9_]+$")
PARAM_NAME = re.compile(r"^[A-Za-z0-9_]+$")


class StateError(Exception):
    def __init__(self, message: str, field: str | None = None):
        super().__init__(message)
        self.field = field


def sysctl_path(name: str) -> Path:
    if not SYSCTL_NAME.match(name):
        raise StateError(f"not a sysctl name: {name!r}", field=f"state.sysctls.{name}")
    return Path("/proc/sys") / name.replace(".", "/")


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
    if not MODULE_NAME.match(module):
        raise StateError(f"not a module name: {module!r}", field=f"state.module_params.{module}")
    return Path("/sys/module") / module


def module_param_path(module: str, param: str) -> Path:
    if not PARAM_NAME.match(param):
        raise StateError(f"not a module parameter: {module}.{param}", field=f"state.module_params.{module}")
    return module_dir(module) / "parameters" / param


def read_module_param(module: str, param: str) -> str:
    return module_param_path(module, param).read_text().strip()


def ensure_module(module: str) -> None:
    """A CC module loads on first use; its parameters must be set before that, so load it now (G-CC)."""
    if not module_dir(module).exists():
        procs.run(["modprobe", module], check=False)
    if not module_dir(module).exists():
        raise StateError(f"module {module} is not loaded and cannot be loaded on kernel {os.uname().release}",
                         field=f"state.module_params.{module}")


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


def read_driver(dev: str) -> str:
    done = procs.run(["ethtool", "-i", dev], check=False)
    for line in done.stdout.splitlines():
        if line.startswith("driver:"):
            return line.split(":", 1)[1].strip()
    return ""


def _read_unless_unsupported(argv: list[str], parse):
    """(parse(stdout), None), or (None, the driver's refusal) when it lacks the operation."""
    done = procs.run(argv, check=False)
    if reason := ethtool.unsupported_reason(done.returncode, done.stderr):
        return None, reason
    if done.returncode != 0:
        raise procs.CommandFailed(done.argv, done.returncode, done.stderr)
    return parse(done.stdout), None


def read_coalesce(dev: str) -> tuple[dict[str, int | bool] | None, str | None]:
    return _read_unless_unsupported(["ethtool", "-c", dev], ethtool.parse_coalesce)


def read_pause(dev: str) -> tuple[dict[str, bool] | None, str | None]:
    return _read_unless_unsupported(["ethtool", "--json", "-a", dev], ethtool.parse_pause_json)


def read_neighbours(dev: str) -> list[dict]:
    return json.loads(procs.run(ethtool.neigh_show_argv(dev)).stdout or "[]")


def read_features(dev: str) -> dict[str, dict]:
    out = json.loads(procs.run(readback_argv(dev)["features"]).stdout)
    return {k: v for k, v in out[0].items() if isinstance(v, dict)}


def read_interface(dev: str) -> InterfaceReadback:
    argv = readback_argv(dev)
    qdiscs = json.loads(procs.run(argv["tc_qdisc"]).stdout or "[]")
    coalesce, no_coalesce = read_coalesce(dev)
    pause, no_pause = read_pause(dev)
    unsupported = {op: why for op, why in (("coalesce", no_coalesce), ("pause", no_pause)) if why}
    return InterfaceReadback(
        tc_qdisc=qdiscs,
        tc_class_text=procs.run(argv["tc_class_text"]).stdout,
        htb_classes=read_htb_classes(dev),
        features=read_features(dev),
        driver=read_driver(dev),
        coalesce=coalesce, pause=pause, unsupported=unsupported,
        neighbours=read_neighbours(dev),
    )


def read_htb_classes(dev: str) -> list[dict]:
    """htb class parameters over netlink: iproute2 6.1 prints htb classes only as text, even with -j."""
    with IPRoute() as ipr:
        idx = ipr.link_lookup(ifname=dev)[0]
        out = []
        for msg in ipr.get_classes(index=idx):
            if msg.get_attr("TCA_KIND") != "htb":
                continue
            parms = msg.get_attr("TCA_OPTIONS").get_attr("TCA_HTB_PARMS")
            handle = msg["handle"]
            out.append({
                "classid": tc_handle(handle),
                "rate_bit": parms["rate"] * 8, "ceil_bit": parms["ceil"] * 8,
                "quantum_bytes": parms["quantum"], "prio": parms["prio"],
            })
        return out


def _words(path: str) -> list[str]:
    p = Path(path)
    return p.read_text().split() if p.exists() else []


def congestion_controls() -> dict[str, list[str]]:
    return {"available": _words("/proc/sys/net/ipv4/tcp_available_congestion_control"),
            "allowed": _words("/proc/sys/net/ipv4/tcp_allowed_congestion_control")}


def readback(interfaces: list[str], sysctl_names: list[str],
             module_params: dict[str, list[str]] | None = None) -> Readback:
    u = os.uname()
    return Readback(
        kernel_release=u.release,
        uname={"sysname": u.sysname, "release": u.release, "version": u.version, "machine": u.machine},
        congestion_controls=congestion_controls(),
        sysctls={n: read_sysctl(n) for n in sysctl_names if sysctl_path(n).exists()},
        module_params={m: {p: read_module_param(m, p) for p in params if module_param_path(m, p).exists()}
                       for m, params in (module_params or {}).items()},
        interfaces={dev: read_interface(dev) for dev in interfaces},
    )
