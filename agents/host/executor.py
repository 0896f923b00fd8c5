"""The host-state executor: apply a HostState, read it back, and reset to the hello-time snapshot.

Only interfaces, sysctls and modules on the agent's allow-lists are touched, and a request naming anything
else is refused whole before anything is written (no partial state). Everything apply changes is snapshotted
first (at hello, or on first write for sysctls and module parameters outside the baseline), and reset restores
exactly that. With a journal path, that baseline is kept on disk from the first write of an apply until reset
(agents/host/baseline.py), so an agent restarted after a crash still restores the host.
"""
from __future__ import annotations

import os
from pathlib import Path

from agents.events import blackout_off_argv
from agents.host import baseline, ethtool, linkinfo, modules, neighbours, routes
from agents.host.argv import ChainError, RawQdisc, chain_argv, offload_argv, root_delete_argv
from agents.host.baseline import Baseline, InterfaceSnapshot, Snapshot
from agents.host.errors import NotAllowed, StateError
from agents.host.readback import (
    read_coalesce,
    read_features,
    read_link,
    read_neighbours,
    read_pause,
    read_qdiscs,
    readback,
)
from agents.host.tunables import (
    module_param_path,
    read_module_param,
    read_sysctl,
    sysctl_path,
    write_module_param,
    write_sysctl,
)
from schemas import allowlist, procs, rawqdisc
from schemas.hoststate import HostState, InterfaceState, norm_module_param
from schemas.neighbours import permanent_neighbours
from schemas.nic import OFFLOAD_LONG_NAMES
from schemas.protocol import Readback
from schemas.qdiscs import kind_of
from schemas.routes import quickack_by_route


def snapshot_interface(dev: str) -> InterfaceSnapshot:
    feats = read_features(dev)
    root = [q for q in read_qdiscs(dev) if q.get("root")]
    return InterfaceSnapshot(
        features={short: bool(feats[long]["active"]) for short, long in OFFLOAD_LONG_NAMES.items() if long in feats},
        root_kind=root[0]["kind"] if root else "noqueue",
        coalesce=read_coalesce(dev)[0], pause=read_pause(dev)[0],
        neighbours=permanent_neighbours(read_neighbours(dev)), mtu=read_link(dev)[0],
        quickack=quickack_by_route(routes.read_routes(dev)))


def take_snapshot(interfaces: list[str], sysctl_names: list[str]) -> Snapshot:
    return Snapshot(sysctls={n: read_sysctl(n) for n in sysctl_names if sysctl_path(n).exists()},
                    interfaces={dev: snapshot_interface(dev) for dev in interfaces})


def snapshot_differences(want: Snapshot, got: Snapshot) -> list[str]:
    """Pure: what differs between the hello snapshot and the state after reset."""
    diffs = [f"sysctl {k}: {got.sysctls.get(k)!r} != snapshot {v!r}"
             for k, v in want.sysctls.items() if got.sysctls.get(k) != v]
    diffs += [f"module parameter {m}.{p}: {got.module_params.get((m, p))!r} != snapshot {v!r}"
              for (m, p), v in want.module_params.items() if got.module_params.get((m, p)) != v]
    for dev, w in want.interfaces.items():
        g = got.interfaces[dev]
        diffs += [f"{dev} offload {k}: {g.features.get(k)} != snapshot {v}"
                  for k, v in w.features.items() if g.features.get(k) != v]
        if w.mtu is not None and g.mtu != w.mtu:
            diffs.append(f"{dev} mtu {g.mtu} != snapshot {w.mtu}")
        if g.root_kind != w.root_kind:
            diffs.append(f"{dev} root qdisc {g.root_kind} != snapshot {w.root_kind}")
        for what in ("coalesce", "pause", "neighbours", "quickack"):
            if getattr(g, what) != getattr(w, what):
                diffs.append(f"{dev} {what} {getattr(g, what)} != snapshot {getattr(w, what)}")
    return diffs


def qdisc_modules(ifstate: InterfaceState) -> list[str]:
    """The modules of the chain's kinds that the kernel cannot load on demand (tcplab's own)."""
    return list(dict.fromkeys(m for stage in ifstate.qdiscs if (m := kind_of(stage).module) is not None))


class HostStateExecutor:
    """`sysctl_prefixes` and `modules` are the testbed's allow-lists (`{interface}` already expanded)."""

    def __init__(self, interfaces: list[str], sysctl_prefixes: list[str] | None = None,
                 modules: list[str] | None = None, journal: Path | None = None,
                 module_dirs: list[Path] | None = None):
        """`module_dirs`: where the testbed put module files (`<name>.ko`) this agent insmods (--module-dir)."""
        self.interfaces = list(interfaces)
        self.module_dirs = list(module_dirs or [])
        self.loaded_modules: list[str] = []   # loaded by apply, unloaded (last first) by reset
        self.journal = journal
        self.sysctl_prefixes = list(sysctl_prefixes if sysctl_prefixes is not None else
                                    allowlist.expand_prefixes(allowlist.DEFAULT_SYSCTL_PREFIXES, interfaces))
        self.modules = list(modules if modules is not None else allowlist.DEFAULT_MODULES)
        self.snapshot = Snapshot()
        self.touched_sysctls: set[str] = set()
        self.touched_params: set[tuple[str, str]] = set()

    def snapshot_now(self, sysctl_names: list[str]) -> None:
        self.snapshot = take_snapshot(self.interfaces, sysctl_names)

    def adopt_journal(self) -> bool:
        """Take over the baseline a previous agent left on this boot (it died between apply and reset): the
        next reset restores the host to it. False when there is none (or it was stale or unreadable)."""
        if self.journal is None:
            return False
        try:
            found = baseline.load(self.journal, baseline.current_boot_id())
        except baseline.BadJournal:
            baseline.clear(self.journal)   # untrusted: the hello snapshot is all there is
            raise
        if found is None:
            return False
        self.snapshot = found.snapshot
        self.touched_sysctls, self.touched_params = set(found.touched_sysctls), set(found.touched_params)
        self.loaded_modules = list(found.loaded_modules)
        return True

    def _persist(self) -> None:
        """Write the baseline (and what apply has touched) before the write that needs it restored."""
        if self.journal is not None:
            baseline.save(self.journal, Baseline(baseline.current_boot_id(), self.snapshot,
                                                 self.touched_sysctls, self.touched_params, self.loaded_modules))

    def check_allowed(self, state: HostState) -> None:
        """Refuse (NotAllowed) what the allow-lists do not cover, then (StateError) sysctls this kernel lacks and
        qdisc chains tc cannot build; all before anything is written."""
        for dev in state.interfaces:
            if dev not in self.interfaces:
                raise NotAllowed(f"interface {dev!r} is not on this agent's allow-list {self.interfaces}",
                                 field=f"state.interfaces.{dev}")
        for name in state.sysctls:
            if not allowlist.sysctl_allowed(name, self.sysctl_prefixes):
                raise NotAllowed(allowlist.sysctl_refusal(name, self.sysctl_prefixes), field=f"state.sysctls.{name}")
        for module in state.module_params:
            if not allowlist.module_allowed(module, self.modules):
                raise NotAllowed(allowlist.module_refusal(module, self.modules), field=f"state.module_params.{module}")
        for name in state.sysctls:
            if not sysctl_path(name).exists():
                raise StateError(f"sysctl {name} does not exist on kernel {os.uname().release}",
                                 field=f"state.sysctls.{name}")
        for dev, ifstate in state.interfaces.items():
            if ifstate.mtu is not None:
                _, lo, hi = read_link(dev)
                if not lo <= ifstate.mtu <= hi:
                    raise StateError(f"{dev} takes an MTU of {lo}..{hi}, not {ifstate.mtu}",
                                     field=f"state.interfaces.{dev}.mtu")
            try:
                chain_argv(dev, list(ifstate.qdiscs))   # pure: a leaf with a child, a kind without a builder
            except ChainError as exc:
                raise StateError(str(exc), field=f"state.interfaces.{dev}.qdiscs") from exc
            for module in qdisc_modules(ifstate):
                if not allowlist.module_allowed(module, self.modules):
                    raise NotAllowed(allowlist.module_refusal(module, self.modules),
                                     field=f"state.interfaces.{dev}.qdiscs")
            if ifstate.quickack is not None:   # every route restatable, before anything is written
                routes.quickack_changes(dev, routes.read_routes(dev), ifstate.quickack)

    def apply(self, state: HostState) -> Readback:
        self.check_allowed(state)
        try:
            return self._apply(state)
        except procs.CommandFailed as exc:   # a tool that failed or is missing: its own words, no traceback
            raise StateError(str(exc)) from exc

    def _apply(self, state: HostState) -> Readback:
        # every value a write below may change is in the baseline, on disk, before that write
        for name in state.sysctls:
            if name not in self.snapshot.sysctls and sysctl_path(name).exists():
                self.snapshot.sysctls[name] = read_sysctl(name)
            self.touched_sysctls.add(name)
        self._persist()
        for name, value in state.sysctls.items():
            write_sysctl(name, value)
        self._apply_module_params(state.module_params)
        if state.flush_tcp_metrics:
            procs.run(["ip", "tcp_metrics", "flush", "all"], check=False)
        for dev, ifstate in state.interfaces.items():
            self._apply_interface(dev, ifstate)
        return readback(self.interfaces, sorted(set(state.sysctls) | self.touched_sysctls),
                        {m: sorted(p) for m, p in state.module_params.items()})

    def _load(self, module: str, params: dict[str, str]) -> bool:
        """Load `module` with `params` (load-time values) unless it is loaded; the journal records it first, so
        a restarted agent still unloads it. True when this call loaded it."""
        if modules.is_loaded(module):
            return False
        self.loaded_modules.append(module)
        self._persist()
        try:
            modules.load(module, params, self.module_dirs)
        except StateError:
            self.loaded_modules.remove(module)
            self._persist()
            raise
        return True

    def _apply_module_params(self, params: dict[str, dict[str, str]]) -> None:
        for module, values in params.items():
            if self._load(module, values):
                continue   # the values went in with the load: nothing to snapshot, reset unloads it
            for param, value in values.items():
                key = (module, param)
                known = key in self.snapshot.module_params and key in self.touched_params
                if key not in self.snapshot.module_params and module_param_path(module, param).exists():
                    self.snapshot.module_params[key] = read_module_param(module, param)
                self.touched_params.add(key)
                if not known:
                    self._persist()
                path = module_param_path(module, param)
                if path.exists() and norm_module_param(read_module_param(module, param)) == norm_module_param(value):
                    continue   # already so (and maybe read-only at runtime, like a load-time parameter)
                write_module_param(module, param, value)   # names the module and parameter if missing

    def _apply_interface(self, dev: str, ifstate: InterfaceState) -> None:
        self._apply_mtu(dev, ifstate.mtu)
        self._apply_offloads(dev, ifstate.offloads)
        self._apply_coalesce(dev, ifstate.coalesce)
        self._apply_pause(dev, ifstate.pause)
        for addr, lladdr in ifstate.neighbours.items():
            self._run(neighbours.replace_argv(dev, addr, lladdr), f"state.interfaces.{dev}.neighbours.{addr}")
        if ifstate.quickack is not None:
            routes.set_quickack(dev, ifstate.quickack)
        self._reset_root(dev)
        for module in qdisc_modules(ifstate):
            self._load(module, {})
        for step in chain_argv(dev, list(ifstate.qdiscs)):
            try:
                if isinstance(step, RawQdisc):
                    rawqdisc.configure(step.dev, step.parent, step.handle, step.kind, step.options,
                                       nested_flag=step.nested)
                else:
                    procs.run(step)
            except procs.CommandFailed as exc:
                raise StateError(str(exc), field=f"state.interfaces.{dev}.qdiscs") from exc
            except (OSError, ValueError) as exc:   # pyroute2's NetlinkError is an OSError: the kernel's errno
                raise StateError(f"{dev}: {step.kind} qdisc {step.handle} refused by the kernel: {exc}",
                                 field=f"state.interfaces.{dev}.qdiscs") from exc

    def _apply_mtu(self, dev: str, mtu: int | None) -> None:
        if mtu is not None and read_link(dev)[0] != mtu:
            self._run(linkinfo.mtu_argv(dev, mtu), f"state.interfaces.{dev}.mtu")

    def _apply_offloads(self, dev: str, wanted: dict[str, bool]) -> None:
        feats = read_features(dev)
        for short, on in wanted.items():
            long = OFFLOAD_LONG_NAMES.get(short)
            if long is None or long not in feats:
                raise StateError(f"offload {short!r} is not a feature of {dev}",
                                 field=f"state.interfaces.{dev}.offloads.{short}")
            if bool(feats[long]["active"]) != on and feats[long].get("fixed"):
                raise StateError(f"offload {short} on {dev} is fixed {'on' if not on else 'off'}",
                                 field=f"state.interfaces.{dev}.offloads.{short}")
        changes = linkinfo.offload_request(feats, wanted)
        if changes:
            procs.run(offload_argv(dev, changes))

    def _apply_coalesce(self, dev: str, wanted: dict[str, int | bool]) -> None:
        """Set what differs; parameters the driver lacks may only be asked to be off (they are, trivially)."""
        if not wanted:
            return
        have, why = read_coalesce(dev)
        have = have or {}
        missing = sorted(k for k, v in wanted.items() if k not in have and v)
        if missing:
            raise StateError(f"{dev} has no coalescing parameter {', '.join(missing)}"
                             f"{f' ({why})' if why else ''}", field=f"state.interfaces.{dev}.coalesce")
        changes = {k: v for k, v in wanted.items() if k in have and have[k] != v}
        if changes:
            self._run(ethtool.coalesce_argv(dev, changes), f"state.interfaces.{dev}.coalesce")

    def _apply_pause(self, dev: str, wanted: dict[str, bool]) -> None:
        if not wanted:
            return
        have, why = read_pause(dev)
        if have is None:
            if any(wanted.values()):
                raise StateError(f"{dev} has no pause-frame settings ({why})", field=f"state.interfaces.{dev}.pause")
            return   # no pause frames at all: "off" holds
        changes = {k: v for k, v in wanted.items() if have.get(k) != v}
        if changes:
            self._run(ethtool.pause_argv(dev, changes), f"state.interfaces.{dev}.pause")

    @staticmethod
    def _run(argv: list[str], where: str) -> None:
        try:
            procs.run(argv)
        except procs.CommandFailed as exc:
            raise StateError(str(exc), field=where) from exc

    def _reset_root(self, dev: str) -> None:
        procs.run(root_delete_argv(dev), check=False)  # fails harmlessly when the root is the default

    def reset(self) -> list[str]:
        """Restore the hello snapshot; return the differences that remain (empty = exact)."""
        try:
            return self._reset()
        except procs.CommandFailed as exc:
            raise StateError(str(exc)) from exc

    def _reset(self) -> list[str]:
        for name in sorted(self.touched_sysctls):
            if name in self.snapshot.sysctls:
                write_sysctl(name, self.snapshot.sysctls[name])
        for (module, param) in sorted(self.touched_params):
            if (module, param) in self.snapshot.module_params:
                write_module_param(module, param, self.snapshot.module_params[(module, param)])
        for dev in self.interfaces:
            self._reset_interface(dev, self.snapshot.interfaces.get(dev) or InterfaceSnapshot())
        left = [why for m in reversed(self.loaded_modules) if (why := modules.unload(m)) is not None]
        after = take_snapshot(self.interfaces, sorted(self.snapshot.sysctls))
        after.module_params = {k: read_module_param(*k) for k in self.snapshot.module_params
                               if module_param_path(*k).exists()}
        self.touched_sysctls.clear()
        self.touched_params.clear()
        self.loaded_modules.clear()
        if self.journal is not None:
            baseline.clear(self.journal)   # what could be restored was; differences go to the manager (G-RESET)
        return snapshot_differences(self.snapshot, after) + left

    def _reset_interface(self, dev: str, snap: InterfaceSnapshot) -> None:
        self._reset_root(dev)
        self._apply_mtu(dev, snap.mtu)
        routes.set_quickack(dev, snap.quickack)
        # an ack_blackout's drop filter (agents/events.py) outlives a killed agent: only that filter goes
        procs.run(blackout_off_argv(dev, added_clsact=False)[0], check=False)
        self._apply_offloads(dev, snap.features)
        if snap.coalesce is not None:
            self._apply_coalesce(dev, snap.coalesce)
        if snap.pause is not None:
            self._apply_pause(dev, snap.pause)
        now = permanent_neighbours(read_neighbours(dev))
        for addr, lladdr in now.items():
            if snap.neighbours.get(addr) != lladdr:
                procs.run(neighbours.delete_argv(dev, addr), check=False)
        for addr, lladdr in snap.neighbours.items():
            if now.get(addr) != lladdr:
                procs.run(neighbours.replace_argv(dev, addr, lladdr))
