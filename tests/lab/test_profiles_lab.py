"""Testbed profiles on real labs (docs/profiles.md).

1. The netns lab under experiments/profiles/netns-lab.yaml: a plan asking for a 400 Mbit/s bottleneck and a
   vanilla 5.9 kernel runs at 80 Mbit/s (factor 0.2) on the running kernel; the packets show 80 Mbit/s, and
   the run row names the profile and every substitution.
2. Every study plan under experiments/profiles/vm-lab.yaml, dry run on the VM lab each plan's topology and
   guests ask for (three labs: the chain, the two-host pair, the Paced Chirping switch topology): no run is
   refused for a role or the topology; every refusal names a missing kernel or mechanism (11 plans).
"""
from __future__ import annotations

import asyncio
import json
import re
from collections import Counter, defaultdict
from pathlib import Path

import pytest
from sqlalchemy import text

from analysis.summary import run_table
from orchestrator.engine.dry_run import judge, live_capabilities
from orchestrator.engine.kernel_builds import attach_builds
from orchestrator.engine.preflight import Refused
from orchestrator.inventory import load_inventory
from orchestrator.lab import netns
from orchestrator.lab.request import lab_request
from orchestrator.plan import expand, load_plan
from orchestrator.plan.checks.profile_loader import load_profile
from orchestrator.plan.expansion.adapt import effective_kernels
from orchestrator.storage.db import open_db
from tests.lab.conftest import TEST_PREFIX, one_flow_plan, skip_unless_vm_lab_can_run, tcplab_run
from tests.support.shipped import PROFILE_DIR, STUDY_PLANS

# what a refusal may name: a kernel the host does not run or that is not built yet, or a mechanism (qdisc,
# congestion control, tracepoint, agent feature) the host's kernel or agent lacks
KERNEL = re.compile(r"host \w+ runs kernel \S+, the plan needs variant \S+|variant \S+ is a source build")
# what a host's kernel or driver cannot do (docs/plans.md "Refused, never ignored"): e.g. the VM lab's virtio_net
# has sg fixed off, so the DC testbed's TSO arms are refused naming it
MECHANISM = re.compile(r"lacks (qdisc|congestion control|tracepoints?|sysctl|kprobe_events) \S+|"
                       r"ack_policy mechanism \w+ is not applied|offload \S+ is fixed (on|off) by the driver|"
                       r"takes an MTU of|has no \w+ stage|not executed by this agent")
TOPOLOGY = re.compile(r"not in the (inventory|testbed)|topology|no interface toward", re.I)


def test_a_profiled_run_is_scaled_by_what_the_packets_show_and_records_the_profile(lab, tmp_path):
    _, state_dir = lab
    plan = tmp_path / "fast.yaml"
    body = one_flow_plan("fast", "a 400 Mbit/s study on a 100 Mbit/s lab", duration="4s",
                         hosts="    client: {kernel: vanilla-5.9}\n    server: {kernel: vanilla-5.9}\n")
    plan.write_text(body.replace("rate: 20mbit", "rate: 400mbit").replace("limit: 30", "limit: 100")
                    .replace("roles: [client, aqm, server]\n", "roles: [client, aqm, server]\nkernels:\n  "
                             "vanilla-5.9: {vanilla: true, source: {git: https://example.org/linux.git, ref: v5.9}}\n"))
    url = f"sqlite:///{tmp_path / 'lab.db'}"
    rc, said = tcplab_run(plan, netns.inventory_path(state_dir), tmp_path / "results", url,
                          profile_path=PROFILE_DIR / "netns-lab.yaml")
    assert rc == 0, said
    db = open_db(url)
    with db.connect() as conn:
        row = conn.execute(text("SELECT run_id, profile, spec FROM run")).one()
    spec = json.loads(row.spec) if isinstance(row.spec, str) else row.spec
    assert row.profile == "netns-lab" and spec["profile"]["scale_factor"] == 0.2
    subs = {s["field"]: s for s in spec["substitutions"]}
    assert subs["bottleneck.rate"]["was"] == "400mbit" and subs["bottleneck.rate"]["now"] == "80mbit"
    assert subs["kernels.vanilla-5.9"]["now"].startswith("the kernel the host runs")
    (summary,) = run_table(db, [row.run_id])
    print(f"goodput {summary.goodput_bps / 1e6:.2f} Mbit/s at a configured {summary.rate_bit / 1e6:g} Mbit/s")
    assert summary.rate_bit == 80_000_000
    # htb at 80 Mbit/s: TCP goodput 80 x 1448/1514 = 76.5 Mbit/s; far below the plan's 400 and above 20
    assert 70e6 < summary.goodput_bps < 80e6


def _groups() -> dict[tuple, list[Path]]:
    """Study plans by the VM lab they need under vm-lab.yaml: topology links, guests and kernel."""
    out: dict[tuple, list[Path]] = defaultdict(list)
    for path in STUDY_PLANS:
        if path.parent.name in ("vm", "kernels") or path.name == "quickstart.yaml":
            continue
        req = lab_request(None, path, PROFILE_DIR / "vm-lab.yaml", None, None)
        out[(req.graph, req.vm_roles, req.kernel)].append(path)
    return out


def _tally(plans: list[Path], profile, caps: dict, inv, counts: Counter, reasons: Counter) -> None:
    """Each plan's runs judged against a lab's hellos: runnable or refused per plan, and every refusal checked to
    name a kernel or a mechanism, never a role or the topology."""
    for path in plans:
        plan = load_plan(path)
        # as `tcplab run --dry-run` judges them: the builds the cache holds attached, a UML host judged on the
        # build it would be restarted on
        specs, _ = attach_builds(expand(plan, profile=profile),
                                 effective_kernels(plan.kernels, profile, plan.source_dir), path.parent)
        for v in judge(specs, caps, inv)[0]:
            counts[(path.relative_to(PROFILE_DIR.parent).as_posix(),
                    "refused" if isinstance(v, Refused) else "runnable")] += 1
            for why in v.reasons if isinstance(v, Refused) else ():
                assert not TOPOLOGY.search(why), f"{path}: {v.spec.run_id}: {why}"
                assert KERNEL.search(why) or MECHANISM.search(why), f"{path}: {why}"
                reasons[re.sub(r"\b(k|pc|tbtcp|aqm|vanilla|dctcp|lsaimd)[\w.+-]*", "…", why)] += 1


def _print_tally(counts: Counter, reasons: Counter) -> None:
    for key, n in sorted(counts.items()):
        print(f"{key[0]}: {n} {key[1]}")
    for why, n in reasons.most_common(15):
        print(f"{n:5d} x {why}")


def test_every_study_plan_dry_runs_on_the_vm_lab_refused_only_for_kernels_or_mechanisms(tmp_path):
    from orchestrator.lab import vm, vm_image

    skip_unless_vm_lab_can_run()
    profile = load_profile(PROFILE_DIR / "vm-lab.yaml")
    counts: Counter = Counter()
    reasons: Counter = Counter()
    groups = _groups()
    assert len(groups) == 3 and sum(len(p) for p in groups.values()) == 11
    for i, ((graph, guests, kernel), plans) in enumerate(groups.items()):
        prefix, state_dir = f"{TEST_PREFIX}p{i}", tmp_path / f"lab{i}"
        try:
            inv_doc = vm.up(state_dir, prefix, kernel=vm_image.resolve_package(kernel), timeout_s=420,
                            vm_roles=guests, graph=graph)
            print(f"\nvm lab {i}: hosts {', '.join(inv_doc['hosts'])}, guests {', '.join(inv_doc['vm']['roles'])} "
                  f"({inv_doc['vm']['release']}), agents ready after {inv_doc['vm']['boot_s']} s")
            inv = load_inventory(netns.inventory_path(state_dir))
            caps = asyncio.run(live_capabilities(inv, tmp_path / f"results{i}"))
            _tally(plans, profile, caps, inv, counts, reasons)
            # the command itself, from the cache the hellos above wrote: no agent contacted
            rc, said = tcplab_run(plans[0], netns.inventory_path(state_dir), tmp_path / f"results{i}", None,
                                  dry=True, profile_path=PROFILE_DIR / "vm-lab.yaml")
            assert rc in (0, 3) and "no agent contacted" in said
        finally:
            vm.down(state_dir, prefix)
            assert netns.lab_namespaces(prefix) == []
    _print_tally(counts, reasons)
    assert sum(counts.values()) == sum(len(expand(load_plan(p))) for ps in groups.values() for p in ps)


def test_every_study_plan_dry_runs_on_the_uml_lab_refused_only_for_kernels_or_mechanisms(tmp_path):
    """Every study plan under experiments/profiles/uml-lab.yaml, dry run on the UML lab its topology asks for
    (one lab per topology, every host a UML kernel): no run is refused for a role or the topology, every
    refusal names a missing kernel or mechanism; the tally per plan is what experiments/README.md lists."""
    from orchestrator.lab import uml
    from orchestrator.plan.model.topology import plan_graph
    from tests.lab.conftest import uml_unavailable

    if reason := uml_unavailable():
        pytest.skip(reason)
    profile = load_profile(PROFILE_DIR / "uml-lab.yaml")
    groups: dict = defaultdict(list)
    for path in STUDY_PLANS:
        if path.parent.name in ("vm", "kernels") or path.name == "quickstart.yaml":
            continue
        plan = load_plan(path)
        groups[plan_graph(plan.roles, plan.topology)].append(path)
    counts: Counter = Counter()
    reasons: Counter = Counter()
    for i, (graph, plans) in enumerate(groups.items()):
        prefix, state_dir = f"{TEST_PREFIX}q{i}", tmp_path / f"uml{i}"
        try:
            inv_doc = uml.up(state_dir, prefix, graph=graph, timeout_s=180)
            print(f"\numl lab {i}: hosts {', '.join(inv_doc['hosts'])} ({inv_doc['uml']['kernel']['release']}), "
                  f"agents ready after {inv_doc['uml']['boot_s']} s")
            inv = load_inventory(netns.inventory_path(state_dir))
            caps = asyncio.run(live_capabilities(inv, tmp_path / f"results{i}"))
            _tally(plans, profile, caps, inv, counts, reasons)
        finally:
            uml.down(state_dir, prefix)
            assert netns.lab_namespaces(prefix) == []
    _print_tally(counts, reasons)
    assert sum(counts.values()) == sum(len(expand(load_plan(p))) for ps in groups.values() for p in ps)
