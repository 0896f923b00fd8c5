"""`tcplab` command line: lab, plan, run, campaign, study, query, db, export (cli_db.py), report, compare, serve.
Thin: every command calls one module."""
from __future__ import annotations

import argparse
import asyncio
import json
import logging
import subprocess
import sys
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

console = Console(stderr=True)
PROFILE_HELP = ("a testbed profile (experiments/profiles/): the kernels, rates and capture points the testbed uses "
                "instead of the plan's; every run records it and each substitution (docs/profiles.md)")


def cmd_lab(args: argparse.Namespace) -> int:
    from orchestrator.lab import netns, uml, vm, vm_image
    from orchestrator.lab.request import lab_request
    from orchestrator.plan import PlanError

    if args.command and args.action != "exec":
        console.print(f"[red]unexpected arguments for lab {args.action}: {' '.join(args.command)}[/red]")
        return 2
    if args.action != "up" and (args.kernel or args.vm_roles or args.profile or args.plan or args.kernel_build
                                or args.disk or args.module):
        console.print("[red]--plan, --profile, --kernel, --kernel-build, --vm-roles, --module and --disk are for "
                      f"lab up, not lab {args.action}[/red]")
        return 2
    kind = vm.lab_kind()
    try:
        if args.action == "up":
            req = lab_request("vm" if args.disk and not args.kind else args.kind, args.plan, args.profile,
                              args.kernel, args.vm_roles, args.kernel_build)
            if args.disk and req.kind != "vm":
                console.print("[red]--disk is for the vm lab (--kind vm)[/red]")
                return 2
            if req.kind == "vm" and args.disk:
                inv = vm.up(vm_roles=req.vm_roles, graph=req.graph, disk=True, timeout_s=300)
                v = inv["vm"]
                ssh = ", ".join(f"{r} ssh 127.0.0.1:{g['ssh_port']} after {g.get('ssh_s', '?')} s"
                                for r, g in v["guests"].items())
                console.print(f"lab up (vm, disk guests): {', '.join(inv['hosts'])}; {ssh}; inventory "
                              f"{netns.inventory_path().with_suffix('.ini')}; next: `tcplab provision`")
            elif req.kind == "vm":
                kernel = req.kernel
                if kernel and not kernel.endswith(".deb"):    # a package, or a pattern (`*`: newest ABI)
                    kernel = vm_image.resolve_package(kernel)
                inv = vm.up(kernel=kernel, vm_roles=req.vm_roles, graph=req.graph, modules=tuple(args.module))
                v = inv["vm"]
                console.print(f"lab up (vm): {', '.join(inv['hosts'])}; guests {', '.join(v['roles'])} run "
                              f"{v['package']} ({v['release']}, {v['accel']}, {v['share']}), agents ready "
                              f"{v.get('boot_s', '?')} s after start; inventory {netns.inventory_path()}")
            elif req.kind == "uml":
                inv = uml.up(graph=req.graph, kernel=req.uml_kernel)
                k = inv["uml"]["kernel"]
                tracing = "" if k["tracing"] else "; no tracepoints in this kernel (tcp_probe refused per run)"
                console.print(f"lab up (uml): {', '.join(inv['hosts'])} run {k['release']} ({k['source']}), agents "
                              f"ready {inv['uml']['boot_s']} s after start{tracing}; "
                              f"inventory {netns.inventory_path()}")
            else:
                inv = netns.up(graph=req.graph)
                console.print(f"lab up: {', '.join(inv['hosts'])}; inventory {netns.inventory_path()}")
        elif args.action == "exec":
            return _lab_exec(kind, args.command)
        elif args.action == "down":
            removed = vm.down() if kind == "vm" else uml.down() if kind == "uml" else netns.down()
            console.print("lab down: " + ("; ".join(removed) if removed else "nothing to remove"))
        else:
            st = vm.status() if kind == "vm" else uml.status() if kind == "uml" else netns.status()
            if args.json:
                print(json.dumps(st, indent=2))
            else:
                names = ' '.join(st['namespaces']) or '-'
                console.print(f"healthy: {st['healthy']}  kind: {kind}  namespaces: {names}")
                for role, g in st.get("vm", {}).get("guests", {}).items():
                    kernel = st['vm'].get('package') or 'disk'
                    console.print(f"  vm {role}: {kernel} ({st['vm']['accel']}) pid {g['pid']} "
                                  f"alive {g['alive']}; console {g['console']}")
                for role, g in st.get("uml", {}).get("guests", {}).items():
                    console.print(f"  uml {role}: {g['release']} pid {g['pid']} alive {g['alive']}; "
                                  f"console {g['console']}")
                for a in st["agents"]:
                    where = f"pid {a['pid']}" if a.get("pid") else f"on its guest, {a.get('agent')}"
                    console.print(f"  agent {a['role']} {where}")
                for link in st["links"]:
                    console.print(f"  {link['namespace']} {link['ifname']} {link['state']} {' '.join(link['addr'])}")
    except (netns.LabError, vm_image.ImageError, PlanError) as exc:
        console.print(f"[red]lab {args.action} failed:[/red] {exc}")
        return 1
    return 0


def _lab_exec(kind: str, command: list[str]) -> int:
    """`tcplab lab exec ROLE CMD...`: in that role's namespace, or in its guest on a vm lab."""
    from orchestrator.inventory import load_inventory
    from orchestrator.lab import netns, vm

    if command[:1] == ["--"]:
        command = command[1:]
    if len(command) < 2:
        console.print("[red]usage: tcplab lab exec ROLE CMD [ARG...][/red]")
        return 2
    role, argv = command[0], command[1:]
    host = load_inventory(netns.inventory_path()).hosts.get(role)
    if host is None:
        console.print(f"[red]no role {role!r} in the lab[/red]")
        return 2
    if host.namespace:
        return subprocess.run(["ip", "netns", "exec", host.namespace, *argv], check=False).returncode
    if kind == "uml":
        from orchestrator.lab import uml
        done = uml.guest_exec(argv, role=role)
        sys.stdout.write(done.stdout)
        sys.stderr.write(done.stderr)
        return done.returncode
    if host.ssh:
        from orchestrator.lab.vm_disk_lab import ssh_argv
        return subprocess.run(ssh_argv(json.loads(netns.inventory_path().read_text()), role, argv),
                              check=False).returncode
    done = vm.guest_exec(argv, role=role)
    sys.stdout.write(done.stdout)
    sys.stderr.write(done.stderr)
    return done.returncode


def cmd_provision(args: argparse.Namespace) -> int:
    from orchestrator.ansible.bundle import BundleError
    from orchestrator.ansible.provision import calibrate_lab_guests, provision
    from orchestrator.inventory import InventoryError
    from orchestrator.lab import netns

    path = args.inventory or netns.inventory_path().with_suffix(".ini")
    try:
        result = provision(path, console)
        if result.ok and args.inventory is None:
            calibrate_lab_guests(netns.inventory_path(), console)
    except (InventoryError, BundleError, FileNotFoundError) as exc:
        console.print(f"[red]provision failed:[/red] {exc}")
        return 2
    for host, stats in sorted(result.stats.items()):
        console.print(f"  {host}: ok {stats.get('ok', 0)} changed {stats.get('changed', 0)} "
                      f"failed {stats.get('failures', 0)} unreachable {stats.get('unreachable', 0)}")
    console.print(f"provision: {'ok' if result.ok else 'FAILED'}; {result.changes} change(s)")
    return 0 if result.ok else 1


def cmd_plan(args: argparse.Namespace) -> int:
    from orchestrator.plan import commands

    if args.action == "validate":
        return commands.cmd_validate(args.file, profile=args.profile)
    if args.action == "expand":
        return commands.cmd_expand(args.file, args.json, profile=args.profile)
    return commands.cmd_table(args.file, profile=args.profile)


def cmd_run(args: argparse.Namespace) -> int:
    from orchestrator.engine.plan_run import run_plan
    from orchestrator.engine.selection import RunFilter, option_values
    from orchestrator.inventory import InventoryError

    filters = RunFilter(experiments=option_values(args.experiment), arms=option_values(args.arm),
                        repetitions=tuple(int(v) for v in option_values(args.rep)), kernels=option_values(args.kernel),
                        limit=args.limit)
    try:
        return asyncio.run(run_plan(args.plan, db_url=args.db, inventory=args.inventory,
                                    results=args.results, force=args.force, console=console,
                                    progress_factory=_progress, filters=filters, dry=args.dry_run,
                                    refresh=args.refresh, profile_path=args.profile))
    except InventoryError as exc:
        console.print(str(exc), markup=False, soft_wrap=True)
        return 2


def _progress() -> Progress:
    return Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                    TimeElapsedColumn(), TextColumn("{task.fields[phase]}"), console=console)


def cmd_kernel(args: argparse.Namespace) -> int:
    return args.kernel_func(args, console)


def cmd_report(args: argparse.Namespace) -> int:
    from analysis.report import write_report
    from analysis.select import SelectorError, select_all
    from orchestrator.storage.db import open_existing_db

    db = open_existing_db(args.db)
    selectors = [*(args.selectors or []), *(f"run:{r}" for r in args.run or [])]
    try:
        run_ids = select_all(db, selectors) if selectors else None
    except SelectorError as exc:
        console.print(f"[red]report: no runs for {exc}[/red]")
        return 2
    title = "tcplab report" + (f": {', '.join(args.selectors)}" if args.selectors else "")
    path = write_report(db, Path(args.out), run_ids=run_ids, title=title)
    console.print(f"report: {path}")
    return 0


def cmd_compare(args: argparse.Namespace) -> int:
    from analysis.compare import compare, format_comparison
    from analysis.select import SelectorError
    from orchestrator.storage.db import open_existing_db

    try:
        sel_a, sel_b, rows = compare(open_existing_db(args.db), args.a, args.b)
    except SelectorError as exc:
        console.print(f"[red]compare: no runs for {exc}[/red]")
        return 2
    print(format_comparison(sel_a, sel_b, rows), end="")
    return 0


def cmd_table(args: argparse.Namespace) -> int:
    from analysis.summary import format_table, run_table
    from orchestrator.storage.db import open_existing_db

    print(format_table(run_table(open_existing_db(args.db), args.run or None)))
    return 0


def cmd_ingest(args: argparse.Namespace) -> int:
    from sqlalchemy import select

    from orchestrator.engine.recovery import ingest_run_dir, pending_ingests
    from orchestrator.storage import tables
    from orchestrator.storage.db import open_db

    db = open_db(args.db)
    run_dirs = list(args.run_dirs)
    if args.pending:
        with db.connect() as conn:
            stored = set(conn.scalars(select(tables.run.c.run_id)))
        run_dirs += [d for d in pending_ingests(args.results, stored) if d not in run_dirs]
        console.print(f"{len(run_dirs)} run(s) pending ingest in {args.results}")
    elif not run_dirs:
        console.print("[red]ingest: name run folders, or --pending[/red]")
        return 2
    if missing := [str(d) for d in run_dirs if not (d / "ingest.json").is_file()]:
        console.print(f"ingest: not a run folder (no ingest.json): {', '.join(missing)}", style="red", markup=False,
                      soft_wrap=True)
        return 2
    failed = 0
    for run_dir in run_dirs:
        outcome = ingest_run_dir(db, run_dir)
        console.print(f"{run_dir.name}: {outcome.status}, " + ", ".join(f"{k} {v}" for k, v in outcome.counts.items()
                                                                         if v))
        if outcome.error:
            failed += 1
            console.print(f"[red]{run_dir.name}[/red]: {outcome.error}", markup=True)
        for flag in outcome.flags:
            console.print(f"flag {run_dir.name}: {flag}", style="yellow", markup=False)
    return 1 if failed else 0


def build_parser() -> argparse.ArgumentParser:
    from orchestrator.engine.selection import repetitions

    p = argparse.ArgumentParser(prog="tcplab", description="TCP congestion-control / AQM testbed")
    p.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = p.add_subparsers(dest="command", required=True)

    lab = sub.add_parser("lab", help="the local lab: namespaces, or an aqm VM with namespace or VM endpoints")
    lab.add_argument("action", choices=["up", "down", "status", "exec"])
    lab.add_argument("--json", action="store_true")
    lab.add_argument("--kind", choices=["netns", "vm", "uml"], default=None,
                     help="up: netns (host kernel; the default) or vm (aqm is a QEMU guest; the profile's kind with "
                     "--profile); down/status follow the lab")
    lab.add_argument("--kernel", metavar="PACKAGE", default=None,
                     help="vm: Debian kernel package of the guests (default: newest linux-image-6.1.0-*-amd64)")
    lab.add_argument("--plan", metavar="FILE", type=Path, default=None,
                     help="build the plan's topology (its hosts and links); vm: also boot the Debian kernel "
                     "package the plan's kernel variants name for the guests")
    lab.add_argument("--kernel-build", metavar="KEY", default=None,
                     help="vm: boot the guests on a `tcplab kernel build` (key prefix, release or variant name)")
    lab.add_argument("--profile", metavar="FILE", type=Path, default=None,
                     help="with --plan: a testbed profile (experiments/profiles/) names the lab kind, the guests "
                     "and the kernel they boot")
    lab.add_argument("--vm-roles", metavar="ROLES", default=None,
                     help="vm: which hosts are guests: aqm (default; the endpoints are namespaces), "
                          "e.g. aqm,server, or all (the senders then run the guest kernel: dctcp, ...)")
    lab.add_argument("--disk", action="store_true", help="vm lab: the guests are real hosts booting their own "
                     "Debian disk (sshd, python3), provisioned by `tcplab provision` (docs/vm-lab.md#disk-guests)")
    lab.add_argument("--module", action="append", default=[], metavar="NAME",
                     help="vm: build experiments/modules/NAME for the guest kernel and let the guests' agents load "
                     "it (repeatable; e.g. sch_aqm_mark for a plan's `mark` stage, tcp_dctcp_flaws)")
    lab.add_argument("command", nargs="*", help="exec: ROLE -- CMD [ARG...]")
    lab.set_defaults(func=cmd_lab)

    plan = sub.add_parser("plan", help="validate / expand / tabulate a plan")
    plan.add_argument("action", choices=["validate", "expand", "table"])
    plan.add_argument("file", type=Path)
    plan.add_argument("--json", action="store_true")
    plan.add_argument("--profile", type=Path, default=None, help=PROFILE_HELP)
    plan.set_defaults(func=cmd_plan)

    run = sub.add_parser("run", help="run every run of a plan and ingest the results", epilog="exit codes: 0 every "
                         "selected run complete, 1 a run failed, 2 plan or filter error, 3 a run refused (none "
                         "failed), 4 an agent unreachable, 5 another manager running, 6 database unreachable")
    run.add_argument("plan", type=Path)
    run.add_argument("--db", default=None, help="database URL (default $TCPLAB_DB or results/tcplab.db)")
    run.add_argument("--inventory", type=Path, default=None, help="default: the netns lab's inventory")
    run.add_argument("--results", type=Path, default=Path("results"))
    run.add_argument("--profile", type=Path, default=None, help=PROFILE_HELP)
    run.add_argument("--force", action="store_true", help="rerun runs already complete in the DB")
    run.add_argument("--dry-run", action="store_true", help="print every selected run as runnable or refused "
                     "(with the reason) from the capabilities of the last hellos; touches no host, no database")
    run.add_argument("--refresh", action="store_true", help="with --dry-run: ask the agents (hello only) even "
                     "when the capability cache is fresh")
    run.add_argument("--experiment", metavar="NAME[,NAME]", action="append",
                     help="only the runs of these experiments (repeatable)")
    run.add_argument("--arm", metavar="NAME[,NAME]", action="append", help="only the runs of these plan arms")
    run.add_argument("--rep", metavar="N[,N]", action="append", type=repetitions,
                     help="only these repetitions (0-based, as in the run id's -rN)")
    run.add_argument("--kernel", metavar="NAME[,NAME]", action="append",
                     help="only the runs that need one of these kernel variants on a host")
    run.add_argument("--limit", type=int, metavar="N", help="at most the next N runs (in run order) of those "
                     "selected and not complete")
    run.set_defaults(func=cmd_run)

    prov = sub.add_parser("provision", help="playbooks/site.yml on the testbed's hosts: tools, the agent as a "
                          "systemd unit with its token, host tuning (docs/provisioning.md)")
    prov.add_argument("--inventory", type=Path, default=None, help="an Ansible INI inventory (default: the lab's)")
    prov.set_defaults(func=cmd_provision)

    from orchestrator.kernel.commands import add_parser as add_kernel_parser

    add_kernel_parser(sub, PROFILE_HELP)
    sub.choices["kernel"].set_defaults(func=cmd_kernel)

    from orchestrator.campaign.commands import add_parser as add_campaign_parser

    add_campaign_parser(sub, console, _progress)

    from orchestrator.study.commands import add_parser as add_study_parser

    add_study_parser(sub, console, _progress)

    from orchestrator.web.commands import add_parser as add_serve_parser

    add_serve_parser(sub, console)

    from orchestrator.cli_db import add_parsers as add_db_parsers

    add_db_parsers(sub, console)

    rep = sub.add_parser("report", help="write the HTML report and CSV tables (docs/reports.md)")
    rep.add_argument("selectors", nargs="*", metavar="RUN|PLAN|CAMPAIGN",
                     help="run id, plan name, tag or experiment, optionally as kind:name "
                          "(run:, plan:, tag:, experiment:[PLAN/]); none = every complete run")
    rep.add_argument("--db", default=None)
    rep.add_argument("--out", default="results")
    rep.add_argument("--run", action="append", help="restrict to these run ids")
    rep.set_defaults(func=cmd_report)

    cmp = sub.add_parser("compare", help="two runs, plans, tags or experiments side by side")
    cmp.add_argument("a", metavar="A", help="selector (as for report)")
    cmp.add_argument("b", metavar="B", help="selector (as for report)")
    cmp.add_argument("--db", default=None)
    cmp.set_defaults(func=cmd_compare)

    ing = sub.add_parser("ingest", help="(re)ingest collected runs from results/<run-id>/ folders")
    ing.add_argument("run_dirs", nargs="*", type=Path)
    ing.add_argument("--db", default=None)
    ing.add_argument("--pending", action="store_true",
                     help="also every run in --results that is on disk but not in the DB (database was down)")
    ing.add_argument("--results", type=Path, default=Path("results"))
    ing.set_defaults(func=cmd_ingest)

    tab = sub.add_parser("table", help="print the per-run results table")
    tab.add_argument("--db", default=None)
    tab.add_argument("--run", action="append")
    tab.set_defaults(func=cmd_table)
    return p


def main(argv: list[str] | None = None) -> None:
    from orchestrator.storage.db import DatabaseMissing

    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.WARNING, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s %(message)s")
    try:
        sys.exit(args.func(args))
    except DatabaseMissing as exc:     # read commands: one line, not a traceback
        console.print(f"tcplab {args.command}: {exc}", style="red", markup=False, soft_wrap=True)
        sys.exit(2)


if __name__ == "__main__":
    main()
