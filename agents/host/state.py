"""Effects on host state: sysctls, offloads, qdisc chains; read-back; hello-time snapshot and reset.

Only interfaces on the agent's allow-list are touched, and only sysctls that exist on this kernel are
written (G-SYSCTL): an unknown name is refused, never skipped.
"""
from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from pyroute2 import IPRoute

from agents import procs
from agents.host.argv import OFFLOAD_LONG_NAMES, chain_argv, offload_argv, readback_argv, root_delete_argv
from schemas.hoststate import HostState
from schemas.protocol import InterfaceReadback, Readback

SYSCTL_NAME = re.compile(r"^[a-z0-9_]+(\.[a-z0-9_-]+)+$")
# qdiscs a fresh interface may carry: resetting to them is `tc qdisc del root`
DEFAULT_ROOT_KINDS = frozenset({"noqueue", "pfifo_fast", "fq_codel", "mq", "fq", "pfifo"})


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


def read_features(dev: str) -> dict[str, dict]:
    out = json.loads(procs.run(readback_argv(dev)["features"]).stdout)
    return {k: v for k, v in out[0].items() if isinstance(v, dict)}


def read_interface(dev: str) -> InterfaceReadback:
    argv = readback_argv(dev)
    qdiscs = json.loads(procs.run(argv["tc_qdisc"]).stdout or "[]")
    return InterfaceReadback(
        tc_qdisc=qdiscs,
        tc_class_text=procs.run(argv["tc_class_text"]).stdout,
        htb_classes=read_htb_classes(dev),
        features=read_features(dev),
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
                "classid": f"{handle >> 16:x}:{handle & 0xFFFF:x}",
                "rate_bit": parms["rate"] * 8, "ceil_bit": parms["ceil"] * 8,
                "quantum_bytes": parms["quantum"], "prio": parms["prio"],
            })
        return out


def readback(interfaces: list[str], sysctl_names: list[str]) -> Readback:
    return Readback(
        kernel_release=os.uname().release,
        sysctls={n: read_sysctl(n) for n in sysctl_names if sysctl_path(n).exists()},
        interfaces={dev: read_interface(dev) for dev in interfaces},
    )


@dataclass
class Snapshot:
    """What the host looked like at hello; reset() returns it there."""
    sysctls: dict[str, str] = field(default_factory=dict)
    features: dict[str, dict[str, bool]] = field(default_factory=dict)
    root_kinds: dict[str, str] = field(default_factory=dict)


def take_snapshot(interfaces: list[str], sysctl_names: list[str]) -> Snapshot:
    snap = Snapshot()
    for name in sysctl_names:
        if sysctl_path(name).exists():
            snap.sysctls[name] = read_sysctl(name)
    for dev in interfaces:
        feats = read_features(dev)
        snap.features[dev] = {short: bool(feats[long]["active"])
                              for short, long in OFFLOAD_LONG_NAMES.items() if long in feats}
        root = [q for q in json.loads(procs.run(readback_argv(dev)["tc_qdisc"]).stdout) if q.get("root")]
        snap.root_kinds[dev] = root[0]["kind"] if root else "noqueue"
    return snap


class HostStateExecutor:
    def __init__(self, interfaces: list[str]):
        self.interfaces = list(interfaces)
        self.snapshot = Snapshot()
        self.touched_sysctls: set[str] = set()

    def snapshot_now(self, sysctl_names: list[str]) -> None:
        self.snapshot = take_snapshot(self.interfaces, sysctl_names)

    def check_allowed(self, state: HostState) -> None:
        for dev in state.interfaces:
            if dev not in self.interfaces:
                raise StateError(f"interface {dev!r} is not on this agent's allow-list {self.interfaces}",
                                 field=f"state.interfaces.{dev}")
        for name in state.sysctls:
            sysctl_path(name)

    def apply(self, state: HostState) -> Readback:
        self.check_allowed(state)
        for name, value in state.sysctls.items():
            if name not in self.snapshot.sysctls and sysctl_path(name).exists():
                self.snapshot.sysctls[name] = read_sysctl(name)
            write_sysctl(name, value)
            self.touched_sysctls.add(name)
        if state.flush_tcp_metrics:
            procs.run(["ip", "tcp_metrics", "flush", "all"], check=False)
        for dev, ifstate in state.interfaces.items():
            self._apply_offloads(dev, ifstate.offloads)
            self._reset_root(dev)
            for argv in chain_argv(dev, list(ifstate.qdiscs)):
                try:
                    procs.run(argv)
                except procs.CommandFailed as exc:
                    raise StateError(str(exc), field=f"state.interfaces.{dev}.qdiscs") from exc
        return readback(self.interfaces, sorted(set(state.sysctls) | self.touched_sysctls))

    def _apply_offloads(self, dev: str, wanted: dict[str, bool]) -> None:
        feats = read_features(dev)
        changes = {}
        for short, on in wanted.items():
            long = OFFLOAD_LONG_NAMES.get(short)
            if long is None or long not in feats:
                raise StateError(f"offload {short!r} is not a feature of {dev}",
                                 field=f"state.interfaces.{dev}.offloads.{short}")
            if bool(feats[long]["active"]) == on:
                continue
            if feats[long].get("fixed"):
                raise StateError(f"offload {short} on {dev} is fixed {'on' if not on else 'off'}",
                                 field=f"state.interfaces.{dev}.offloads.{short}")
            changes[short] = on
        if changes:
            procs.run(offload_argv(dev, changes))

    def _reset_root(self, dev: str) -> None:
        procs.run(root_delete_argv(dev), check=False)  # fails harmlessly when the root is the default

    def reset(self) -> list[str]:
        """Restore the hello snapshot; return the differences that remain (empty = exact)."""
        for name in sorted(self.touched_sysctls):
            if name in self.snapshot.sysctls:
                write_sysctl(name, self.snapshot.sysctls[name])
        for dev in self.interfaces:
            self._reset_root(dev)
            self._apply_offloads(dev, self.snapshot.features.get(dev, {}))
        after = take_snapshot(self.interfaces, sorted(self.snapshot.sysctls))
        diffs = [f"sysctl {k}: {after.sysctls.get(k)!r} != snapshot {v!r}"
                 for k, v in self.snapshot.sysctls.items() if after.sysctls.get(k) != v]
        for dev, feats in self.snapshot.features.items():
            diffs += [f"{dev} offload {k}: {after.features[dev].get(k)} != snapshot {v}"
                      for k, v in feats.items() if after.features[dev].get(k) != v]
            if after.root_kinds[dev] != self.snapshot.root_kinds[dev]:
                diffs.append(f"{dev} root qdisc {after.root_kinds[dev]} != snapshot "
                             f"{self.snapshot.root_kinds[dev]}")
        self.touched_sysctls.clear()
        return diffs
