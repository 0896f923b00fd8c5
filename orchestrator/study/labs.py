"""The labs a study runs on (effects): for each plan, the lab its profile names with the plan's topology, brought
up as `tcplab lab up --plan PLAN --profile PROFILE` would. A lab that was already up and fits is used and left
up; a lab this study brought up is taken down when the next plan needs another topology and at the end. A lab
it did not bring up is never taken down: a plan that does not fit it is reported and skipped."""
from __future__ import annotations

import json
from pathlib import Path

from rich.console import Console

LAB_KINDS = ("netns", "uml")     # the kinds a study brings up itself (a VM lab or a testbed: --inventory)


class StudyLabs:
    def __init__(self, loaded, inventory: Path | None, console: Console) -> None:
        self.loaded, self.given, self.console = loaded, inventory, console
        self.started: str | None = None          # the kind of the lab this study brought up, if any

    def __enter__(self) -> StudyLabs:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.started is not None:
            self._down()

    def _down(self) -> None:
        from orchestrator.lab import netns, uml

        (uml.down if self.started == "uml" else netns.down)()
        self.started = None

    def inventory_for(self, plan_path: Path) -> Path | None:
        """The inventory to run `plan_path` on, the lab brought up first if need be; None (said) when it cannot."""
        from orchestrator.lab import netns, uml
        from orchestrator.lab.netns import LabError, inventory_path
        from orchestrator.lab.request import lab_request
        from orchestrator.lab.vm import lab_kind

        if self.given is not None:
            return self.given
        profile = self.loaded.profile_path
        try:
            req = lab_request(None, plan_path, profile, None, None)
        except LabError as exc:
            self.console.print(f"plan {plan_path.name}: {exc}", style="red", markup=False)
            return None
        if req.kind not in LAB_KINDS:
            self.console.print(f"plan {plan_path.name}: profile {profile.name} is for a {req.kind} testbed, which a "
                               "study does not bring up itself: bring it up, then `tcplab study run NAME "
                               "--inventory PATH`", style="red", markup=False)
            return None
        up_kind = lab_kind() if inventory_path().exists() else None
        if self.started is not None and (up_kind != req.kind or not _fits(req.graph)):
            self._down()
        elif self.started is None and up_kind is not None and (up_kind != req.kind or not _fits(req.graph)):
            self.console.print(f"plan {plan_path.name}: a {up_kind} lab of another topology is up and this study "
                               "did not start it: `tcplab lab down` first", style="red", markup=False)
            return None
        was_up = self.started is not None or up_kind is not None
        try:
            inv = (uml.up(graph=req.graph, kernel=req.uml_kernel) if req.kind == "uml"
                   else netns.up(graph=req.graph))
        except LabError as exc:
            self.console.print(f"plan {plan_path.name}: lab up failed: {exc}", style="red", markup=False)
            return None
        if not was_up:
            self.started = req.kind
        kernel = (inv.get("uml") or {}).get("kernel") or {}
        on = f" on {kernel['release']} ({kernel['source']})" if kernel else ""
        self.console.print(f"plan {plan_path.name}: {req.kind} lab with {', '.join(inv['hosts'])}{on}", markup=False)
        if kernel and not kernel.get("tracing"):
            self.console.print("this UML kernel has no tracepoints: every run that traces is refused; build the "
                               "lab's stock kernel first (`tcplab kernel uml --build`, minutes)", style="yellow",
                               markup=False)
        return inventory_path()


def _fits(graph) -> bool:
    """Whether the lab that is up was built for `graph` (its inventory records the topology it was built for)."""
    from orchestrator.lab.netns import LAB_PREFIX, inventory_path, topology_dict
    from orchestrator.lab.topology import lab_topology, netns_topology

    try:
        recorded = json.loads(inventory_path().read_text()).get("topology")
    except (OSError, json.JSONDecodeError):
        return False
    want = netns_topology(LAB_PREFIX) if graph is None else lab_topology(graph, LAB_PREFIX)
    return recorded == topology_dict(want)
