"""What `tcplab lab up` is asked to build (pure but for loading files): the lab kind, the plan's topology,
which hosts are guests and the kernel package they boot, from the command line, the plan and a testbed
profile (docs/profiles.md). The command line wins where it says something; it must not contradict the
profile or the plan."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from orchestrator.kernel.uml import UmlKernel
from orchestrator.lab.netns import LAB_PREFIX, LabError
from orchestrator.lab.topology import lab_topology, netns_topology
from orchestrator.lab.vm_config import parse_vm_roles, plan_kernel_package
from orchestrator.plan.model.profile import GUESTS_WITH_KERNEL, Profile
from orchestrator.plan.model.topology import Graph

DEFAULT_KIND = "netns"


@dataclass(frozen=True)
class LabRequest:
    kind: str
    graph: Graph | None           # None: the quickstart's chain
    vm_roles: tuple[str, ...]     # the guests (vm); () for a netns lab
    kernel: str | None            # a package, or a pattern with `*` (vm_image.resolve_package)
    uml_kernel: UmlKernel | None = None   # uml: the kernel every host runs (None: the stock one)


def guests_of(profile: Profile, specs: list, roles: list[str]) -> str:
    """The profile's guests for a plan as `--vm-roles` text; `with_kernel`: every role some run gives a kernel
    variant, and the aqm. specs: the plan's RunSpecs under the profile."""
    g = profile.testbed.guests
    if g == "all":
        return "all"
    if g == GUESTS_WITH_KERNEL:
        wanted = {r for s in specs for r, h in s.hosts.items() if h.kernel is not None} | {"aqm"}
    else:
        wanted = set(g)
    chosen = [r for r in roles if r in wanted]
    if not chosen:
        raise LabError(f"profile {profile.name}: none of the guests it names ({', '.join(sorted(wanted))}) is a "
                       f"host of the plan ({', '.join(roles)})")
    return ",".join(chosen)


def build_deb(key: str) -> str:
    """The linux-image package of a `tcplab kernel build` (by key prefix, release or variant name)."""
    from orchestrator.kernel import cache

    found = cache.find(cache.DEFAULT_ROOT, key)
    if len(found) != 1:
        raise LabError(f"--kernel-build {key}: {len(found)} builds match in {cache.DEFAULT_ROOT} (`tcplab kernel ls`)")
    e = found[0]
    debs = sorted(e.path.glob(f"linux-image-{e.release}_*.deb"))
    if not debs:
        raise LabError(f"build {e.key[:16]} has no linux-image-{e.release} package")
    return str(debs[0])


def uml_build(key: str) -> UmlKernel:
    """The `arch: um` kernel of a `tcplab kernel build` (key prefix, release or variant name)."""
    from orchestrator.kernel.uml import find_uml_build

    found = find_uml_build(key)
    if found is None:
        raise LabError(f"--kernel-build {key}: no `arch: um` build matches in the kernel cache (`tcplab kernel ls`)")
    return found


def lab_request(kind: str | None, plan_path: Path | None, profile_path: Path | None, kernel: str | None,
                vm_roles: str | None, kernel_build: str | None = None) -> LabRequest:
    from orchestrator.plan import expand, load_plan
    from orchestrator.plan.checks.profile_loader import load_profile
    from orchestrator.plan.model.topology import plan_graph

    profile = load_profile(profile_path) if profile_path else None
    if profile is not None:
        if profile.testbed.kind == "physical":
            raise LabError(f"profile {profile.name} is for a physical testbed: `tcplab run --inventory "
                           "inventory.ini --profile ...` on its hosts; `lab up` builds netns and vm labs")
        if kind not in (None, profile.testbed.kind):
            raise LabError(f"--kind {kind}, but profile {profile.name} is for a {profile.testbed.kind} lab")
        kind = profile.testbed.kind
    kind = kind or DEFAULT_KIND
    if kind == "uml":
        if kernel or vm_roles:
            raise LabError("--kernel and --vm-roles are for --kind vm: every host of a UML lab is a UML kernel "
                           "(--kernel-build KEY picks an `arch: um` build)")
        uml_kernel = uml_build(kernel_build) if kernel_build else None
        graph = None
        if plan_path is not None:
            from orchestrator.plan import load_plan
            from orchestrator.plan.model.topology import plan_graph
            plan = load_plan(plan_path)
            graph = plan_graph(plan.roles, plan.topology)
        elif profile is not None:
            raise LabError("--profile adapts a plan: give --plan FILE too")
        return LabRequest(kind, graph, (), None, uml_kernel)
    if (kernel or vm_roles or kernel_build) and kind != "vm":
        raise LabError("--kernel, --kernel-build and --vm-roles need --kind vm (--kernel-build: or uml)")
    if kernel_build:
        if kernel:
            raise LabError("give --kernel (a Debian package) or --kernel-build (a tcplab build), not both")
        kernel = build_deb(kernel_build)
    if plan_path is None:
        if profile is not None:
            raise LabError("--profile adapts a plan: give --plan FILE too")
        roles = parse_vm_roles(vm_roles or "aqm", netns_topology(LAB_PREFIX)) if kind == "vm" else ()
        return LabRequest(kind, None, roles, kernel)
    plan = load_plan(plan_path)
    graph = plan_graph(plan.roles, plan.topology)
    if kind != "vm":
        return LabRequest(kind, graph, (), None)
    specs = expand(plan, profile=profile)
    topo = lab_topology(graph, LAB_PREFIX)
    if profile is not None:
        roles = parse_vm_roles(vm_roles or guests_of(profile, specs, list(plan.roles)), topo)
        wanted = profile.testbed.kernel
    else:
        roles = parse_vm_roles(vm_roles or "aqm", topo)
        wanted = plan_kernel_package(plan.kernels, specs, roles)
    if kernel and wanted and kernel != wanted:
        source = f"profile {profile.name}" if profile else str(plan_path)
        raise LabError(f"--kernel {kernel}, but {source} asks for {wanted}")
    return LabRequest(kind, graph, roles, kernel or wanted)
