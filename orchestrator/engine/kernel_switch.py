"""Switching a testbed's hosts to the kernel a group of runs needs, where that is a restart and not an install:
the UML lab, whose hosts are processes (docs/uml-lab.md, "Kernel switch").

`tcplab run` takes a plan's runs in groups that need the same kernel variants (selection.run_order). On a UML
lab, before each group, every host whose running release is not its variant's build is restarted on that
build's `arch: um` binary and verified like a host after a kernel install (its new hello must report the
build's release, which names the key), and every host the group asks no kernel of and that runs another than
the lab's own goes back to the lab's own; then the group is preflighted against the new hellos as usual. A
variant with no `arch: um` build is not switched to: preflight refuses its runs naming the kernel.
"""
from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

from orchestrator.engine.runner import RunEngine
from orchestrator.engine.selection import kernel_key
from orchestrator.plan import RunSpec
from orchestrator.plan.model.kernels import release_matches
from schemas import protocol


def kernel_groups(specs: list[RunSpec]) -> list[list[RunSpec]]:
    """Consecutive runs with the same kernel variants per host, in order (the specs come in run order)."""
    groups: list[list[RunSpec]] = []
    for spec in specs:
        if groups and kernel_key(groups[-1][0]) == kernel_key(spec):
            groups[-1].append(spec)
        else:
            groups.append([spec])
    return groups


HOME = "home"
"""switches_needed's key for the hosts that go back to the lab's own kernel."""


def switches_needed(spec: RunSpec, caps: dict[str, protocol.Capabilities],
                    home_release: str | None = None) -> dict[str, list[str]]:
    """build key -> the hosts that must be restarted on that build for `spec` (pure): each host whose variant
    has a tcplab build and whose running release is not that build's. Under HOME, the hosts `spec` asks no
    kernel of (the running kernel stands in: the lab's own) that an earlier group left on another one
    (`home_release`: the release the lab came up with)."""
    out: dict[str, list[str]] = {}
    for role, hp in spec.hosts.items():
        c = caps.get(role)
        if c is None:
            continue
        if hp.kernel is None:
            if home_release is not None and c.kernel_release != home_release:
                out.setdefault(HOME, []).append(role)
            continue
        if not hp.kernel.build_key:
            continue
        if not release_matches(hp.kernel.release, c.kernel_release):
            out.setdefault(hp.kernel.build_key, []).append(role)
    return out


async def switch_hosts(engine: RunEngine, spec: RunSpec, state_dir: Path, say: Callable[[str], None]) -> None:
    """Restart the hosts `spec` needs on other kernels (a UML lab), then reconnect them (fresh hellos). A host
    the run asks no kernel of goes back to the lab's own kernel: a run whose variant the running kernel stands
    in for must not run on the variant an earlier group switched to."""
    from orchestrator.kernel.uml import find_uml_build
    from orchestrator.lab import uml

    home = uml.lab_kernel(state_dir)
    for key, roles in switches_needed(spec, engine.caps, home.release if home else None).items():
        kernel = home if key == HOME else find_uml_build(key)
        if kernel is None:
            say(f"kernel switch: no `arch: um` build {key[:12]} in the kernel cache; the runs that need it are "
                "refused")
            continue
        await engine.disconnect(roles)
        took = await asyncio.to_thread(uml.switch_kernel, state_dir, roles, kernel, engine.inv.prefix or uml.LAB_PREFIX)
        say("kernel switch: " + ", ".join(f"{r} -> {kernel.release} in {s:.1f} s" for r, s in took.items()))
        await engine.connect_all()


def as_switched(spec: RunSpec, caps: dict[str, protocol.Capabilities]) -> dict[str, protocol.Capabilities]:
    """The hellos `spec` would be judged against once its hosts were restarted on their builds (pure): each host
    switches_needed names reports its build's release; what else it can do is taken from the kernel it runs
    now (a dry run boots nothing: a build whose config differs from the lab's own is judged by the lab's)."""
    moved = {role: hp.kernel.release for role, hp in spec.hosts.items() if hp.kernel is not None}
    out = dict(caps)
    for roles in switches_needed(spec, caps).values():
        for role in roles:
            out[role] = caps[role].model_copy(update={"kernel_release": moved[role]})
    return out

