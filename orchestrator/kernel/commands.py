"""`tcplab kernel build|ls|show|gc` (docs/kernels.md). Thin: each command calls builder/cache and prints."""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from rich.console import Console

from orchestrator.kernel import builder, cache
from orchestrator.kernel.sources import SourceError


def _variant(plan_path: Path, name: str, profile_path: Path | None):
    """The plan's variant `name`, substituted by the profile if one is given (the build of the profile's
    stand-in: Debian's source with the study's patches)."""
    from orchestrator.plan import load_plan
    from orchestrator.plan.checks.profile_loader import load_profile
    from orchestrator.plan.expansion.adapt import effective_kernels

    plan = load_plan(plan_path)
    kernels = effective_kernels(plan.kernels, load_profile(profile_path) if profile_path is not None else None,
                                plan.source_dir)
    if name not in kernels:
        known = ", ".join(sorted(kernels)) or "none"
        raise SourceError(f"{plan_path}: no kernel variant {name!r} (the plan has: {known})")
    return kernels[name]


def cmd_build(args: argparse.Namespace, console: Console) -> int:
    from orchestrator.plan import PlanError

    root = args.cache or cache.DEFAULT_ROOT
    try:
        variant = _variant(args.plan, args.variant, args.profile)
        if args.dry_run:
            key, hit = builder.dry_run(args.variant, variant, args.plan.parent, root)
            console.print(f"{args.variant}: key {key}: {'cache hit' if hit else 'cache miss (would build)'}",
                          markup=False)
            return 0
        command = " ".join(["tcplab", "kernel", "build", str(args.plan), args.variant]
                           + (["--profile", str(args.profile)] if args.profile else []))
        with console.status(f"building {args.variant}") as status:
            outcome = builder.build(args.variant, variant, args.plan.parent, root, jobs=args.jobs,
                                    progress=lambda step: status.update(f"{args.variant}: {step}"), command=command)
    except (PlanError, SourceError, builder.BuildError) as exc:
        console.print(f"kernel build failed: {exc}", style="red", markup=False)
        return 1
    e = outcome.entry
    if args.db is not None or not outcome.hit:
        record(args.db, e)
    console.print(f"{args.variant}: {'cache hit' if outcome.hit else 'built'} {e.key[:16]} release {e.release} "
                  f"({e.metadata.get('duration_s', '?')} s to build) in {e.path}", markup=False)
    return 0


def record(db_url: str | None, e: cache.Entry) -> None:
    """The build in the results database (table kernel_build), so runs can be joined with what they ran."""
    from orchestrator.storage.db import open_db
    from orchestrator.storage.kernel_builds import upsert_build

    upsert_build(open_db(db_url), e.metadata)


def cmd_ls(args: argparse.Namespace, console: Console) -> int:
    for e in cache.entries(args.cache or cache.DEFAULT_ROOT):
        m = e.metadata
        print(f"{e.key[:16]}  {m.get('variant', '?'):24} {m.get('arch', 'x86_64'):6} {e.release:40} "
              f"{m.get('duration_s', '?'):>8} s  {m.get('finished_at', '')[:19]}")
    return 0


def cmd_show(args: argparse.Namespace, console: Console) -> int:
    found = cache.find(args.cache or cache.DEFAULT_ROOT, args.key)
    if len(found) != 1:
        console.print(f"kernel show: {len(found)} builds match {args.key!r}", style="red", markup=False)
        return 2
    print(json.dumps(found[0].metadata, indent=2, sort_keys=True))
    return 0


def cmd_gc(args: argparse.Namespace, console: Console) -> int:
    removed = cache.gc(args.cache or cache.DEFAULT_ROOT, keep=args.keep, older_than_days=args.older_than)
    console.print(f"kernel gc: removed {len(removed)}" + (f": {', '.join(removed)}" if removed else ""), markup=False)
    return 0


def cmd_uml(args: argparse.Namespace, console: Console) -> int:
    """The UML kernel a UML lab boots: the stock build (built first with --build), else Debian's package."""
    from dataclasses import asdict

    from orchestrator.kernel import uml

    root = args.cache or cache.DEFAULT_ROOT
    try:
        kernel = uml.ensure_stock_uml(args.build, root, jobs=args.jobs)
    except (uml.UmlKernelError, SourceError, builder.BuildError) as exc:
        console.print(f"kernel uml: {exc}", style="red", markup=False)
        return 1
    doc = {k: str(v) if isinstance(v, Path) else v for k, v in asdict(kernel).items()}
    if args.json:
        print(json.dumps(doc, indent=2, sort_keys=True))
    else:
        for k, v in doc.items():
            print(f"{k:13} {v}")
    return 0


def cmd_install(args: argparse.Namespace, console: Console) -> int:
    from orchestrator.ansible.kernel_install import install, resolve
    from orchestrator.inventory import InventoryError
    from orchestrator.lab import netns, vm_image

    inventory = args.inventory or netns.inventory_path().with_suffix(".ini")
    try:
        target = resolve(args.target)
        result = install(inventory, target, args.role, console, args.module, args.cc, args.qdisc, args.verify_only)
    except (InventoryError, vm_image.ImageError, FileNotFoundError) as exc:
        console.print(f"[red]kernel {'verify' if args.verify_only else 'install'} failed:[/red] {exc}")
        return 2
    for host, stats in sorted(result.stats.items()):
        console.print(f"  {host}: ok {stats.get('ok', 0)} changed {stats.get('changed', 0)} "
                      f"failed {stats.get('failures', 0)} unreachable {stats.get('unreachable', 0)}")
    console.print(f"kernel {'verify' if args.verify_only else 'install'}: {'ok' if result.ok else 'FAILED'} "
                  f"({result.duration_s} s, {result.changes} change(s))")
    return 0 if result.ok else 1


def add_parser(sub, profile_help: str) -> None:
    k = sub.add_parser("kernel", help="build, list, show and clean kernel variant builds (docs/kernels.md)")
    ks = k.add_subparsers(dest="kernel_cmd", required=True)
    b = ks.add_parser("build", help="build a plan's kernel variant (or find it cached by its key)")
    b.add_argument("plan", type=Path)
    b.add_argument("variant")
    b.add_argument("--profile", type=Path, default=None, help=profile_help)
    b.add_argument("--dry-run", action="store_true", help="say the build key and whether it is cached; build nothing")
    b.add_argument("--jobs", type=int, default=None, help="make -j (default: every CPU)")
    b.add_argument("--db", default=None, help="record the build in this database (default $TCPLAB_DB or "
                   "results/tcplab.db; a cache hit is recorded only when --db is given)")
    b.set_defaults(kernel_func=cmd_build)
    ls = ks.add_parser("ls", help="cached builds, newest first")
    ls.set_defaults(kernel_func=cmd_ls)
    sh = ks.add_parser("show", help="a build's metadata.json (by key prefix, release or variant name)")
    sh.add_argument("key")
    sh.set_defaults(kernel_func=cmd_show)
    um = ks.add_parser("uml", help="the User-Mode Linux kernel a UML lab boots: the stock build "
                       "(experiments/kernels/uml-lab.yaml) if cached, else Debian's user-mode-linux")
    um.add_argument("--build", action="store_true", help="build the stock variant first if it is not cached")
    um.add_argument("--jobs", type=int, default=None, help="make -j (default: every CPU)")
    um.add_argument("--json", action="store_true", help="as JSON")
    um.set_defaults(kernel_func=cmd_uml)
    gc = ks.add_parser("gc", help="remove old builds and abandoned temporary directories")
    gc.add_argument("--keep", type=int, default=3, help="builds kept per variant (newest)")
    gc.add_argument("--older-than", type=float, default=None, metavar="DAYS", help="also remove builds older than this")
    gc.set_defaults(kernel_func=cmd_gc)
    for action, text in (("install", "install a kernel on testbed hosts with playbooks/kernel-install.yml: boot it "
                                     "once, verify, then make it the default (docs/provisioning.md)"),
                         ("verify", "verify that testbed hosts run a kernel (release, modules, congestion "
                                    "controls, qdiscs) without installing or rebooting")):
        p = ks.add_parser(action, help=text)
        p.add_argument("target", help="a cached build (key prefix, release or variant) or a linux-image package")
        p.add_argument("--role", action="append", default=None, help="only the host of this role (repeatable)")
        p.add_argument("--inventory", type=Path, default=None, help="Ansible INI inventory (default: the lab's)")
        p.add_argument("--module", action="append", default=[], help="a module that must load (repeatable)")
        p.add_argument("--cc", action="append", default=[], help="a congestion control that must be available")
        p.add_argument("--qdisc", action="append", default=[], help="a qdisc kind that must be creatable")
        p.set_defaults(kernel_func=cmd_install, verify_only=action == "verify", cache=None)
    for p in (b, ls, sh, gc, um):
        p.add_argument("--cache", type=Path, default=None, help="cache root (default $TCPLAB_KERNEL_CACHE or "
                       "/var/cache/tcplab/kernels)")
