"""`tcplab campaign run|resume|status|verdict|report|nightly` (docs/campaigns.md). Thin: each command calls one module.

Exit codes of run, resume and verdict: 0 pass, 1 regression, 2 infrastructure failure (a trial that never
succeeded, a check without data, an unreachable host or database, the campaign held by another manager, a wrong
campaign file), 3 inconclusive (with --strict).
"""
from __future__ import annotations

import argparse
import asyncio
import json
from pathlib import Path

from rich.console import Console
from rich.table import Table

EXIT_INFRA = 2


def _name(target: str, console: Console) -> str | None:
    """A campaign file's name (the file loaded and checked), or the argument itself as a stored campaign's name."""
    from orchestrator.campaign.loader import load_campaign
    from orchestrator.plan import PlanError

    if not Path(target).is_file():
        return target
    try:
        return load_campaign(target).campaign.name
    except PlanError as exc:
        console.print(str(exc), markup=False)
        return None


def cmd_run(args: argparse.Namespace, console: Console, progress_factory) -> int:
    from orchestrator.agent_client import AgentError
    from orchestrator.campaign.executor import CampaignBusy, CampaignRunner
    from orchestrator.campaign.loader import load_campaign
    from orchestrator.engine.runner import DB_ERRORS
    from orchestrator.inventory import InventoryError, load_inventory
    from orchestrator.lab.netns import inventory_path
    from orchestrator.plan import PlanError
    from orchestrator.storage.db import open_db

    try:
        lc = load_campaign(args.campaign)
        inv = load_inventory(args.inventory or inventory_path())
        db = open_db(args.db)
    except (PlanError, InventoryError) as exc:
        console.print(str(exc), markup=False)
        return EXIT_INFRA
    except DB_ERRORS as exc:
        console.print(f"cannot start: the database is unreachable ({str(exc).splitlines()[0]})", markup=False)
        return EXIT_INFRA
    runner = CampaignRunner(lc, db, inv, args.results, console, progress_factory, strict=args.strict)
    try:
        result = asyncio.run(runner.run(resume=args.action == "resume", label=args.label))
    except (CampaignBusy, LookupError, AgentError) as exc:
        console.print(f"cannot run campaign {lc.campaign.name}: {exc}", style="red", markup=False)
        return EXIT_INFRA
    print_verdicts(console, lc.campaign.name, result.night["night"], [r.__dict__ for r in result.rows])
    if result.unfinished:
        console.print(f"{len(result.unfinished)} trial slots never succeeded: "
                      + ", ".join(f"{c[:12]}/{v}/r{r}" for c, v, r in result.unfinished[:8]), style="red",
                      markup=False)
    if result.overhead_s:
        s = sorted(result.overhead_s)
        console.print(f"orchestration overhead per run: median {s[len(s) // 2]:.2f} s, max {s[-1]:.2f} s "
                      f"({len(s)} runs)", markup=False)
    console.print(f"exit code {result.exit_code}", markup=False)
    return result.exit_code


def print_verdicts(console: Console, name: str, night: int, rows: list[dict]) -> None:
    from analysis.campaign_report import fmt_value, verdict_estimate

    t = Table(title=f"campaign {name}, night {night}")
    for col in ("check", "metric", "kind", "cell", "variant", "estimate", "CI", "p adj", "verdict"):
        t.add_column(col)
    for r in rows:
        d = r.get("detail") or {}
        t.add_row(str(r["check_index"]), r["metric"], r["kind"], d.get("cell_label", r.get("cell_label", ""))[:60],
                  r["variant"], fmt_value(verdict_estimate(r)), fmt_value(d["ci"]) if d.get("ci") else "",
                  fmt_value(d.get("p_adjusted")), r["verdict"])
    Console(file=console.file, width=max(console.width, 180)).print(t)   # a log file is not 80 columns wide


def cmd_status(args: argparse.Namespace, console: Console) -> int:
    from orchestrator.storage import lease, trials
    from orchestrator.storage.db import open_db

    name = _name(args.campaign, console)
    if name is None:
        return EXIT_INFRA
    db = open_db(args.db)
    nights = trials.nights(db, name)
    holder = lease.current(db, name)
    out = {"campaign": name, "lease": None if holder is None else {"holder": holder.name,
                                                                   "expires_at": holder.expires_at.isoformat()},
           "nights": []}
    for n in nights:
        ts = trials.trials(db, [n["id"]])
        counts = {s: sum(1 for t in ts if t["status"] == s) for s in sorted({t["status"] for t in ts})}
        out["nights"].append({"night": n["night"], "label": n["label"], "status": n["status"],
                              "exit_code": n["exit_code"], "trials": counts})
    if args.json:
        print(json.dumps(out, indent=2, default=str))
        return 0
    console.print(f"campaign {name}: {len(nights)} nights; lease: "
                  + (f"{holder.name} until {holder.expires_at:%H:%M:%S}" if holder else "free"), markup=False)
    for n in out["nights"]:
        console.print(f"  night {n['night']} ({n['label']}): {n['status']}, exit {n['exit_code']}, trials "
                      + ", ".join(f"{k} {v}" for k, v in n["trials"].items()), markup=False)
    return 0


def cmd_verdict(args: argparse.Namespace, console: Console) -> int:
    from analysis.campaign_report import load_verdicts
    from orchestrator.campaign.verdicts import EXIT_INCONCLUSIVE
    from orchestrator.storage.db import open_db

    name = _name(args.campaign, console)
    if name is None:
        return EXIT_INFRA
    found = load_verdicts(open_db(args.db), name, args.night)
    if found is None:
        console.print(f"campaign {name}: no finished night" + (f" {args.night}" if args.night else ""),
                      style="red", markup=False)
        return EXIT_INFRA
    night, rows = found
    print_verdicts(console, name, night["night"], rows)
    code = night["exit_code"]
    if code == 0 and args.strict and any(r["verdict"] == "INCONCLUSIVE" for r in rows):
        code = EXIT_INCONCLUSIVE
    console.print(f"exit code {code}", markup=False)
    return code


def cmd_report(args: argparse.Namespace, console: Console) -> int:
    from analysis.campaign_report import write_campaign_report
    from orchestrator.storage.db import open_db

    name = _name(args.campaign, console)
    if name is None:
        return EXIT_INFRA
    path = write_campaign_report(open_db(args.db), name, Path(args.out))
    if path is None:
        console.print(f"campaign {name}: nothing stored yet", style="red", markup=False)
        return EXIT_INFRA
    console.print(f"wrote {path}", markup=False)
    return 0


def cmd_nightly(args: argparse.Namespace, console: Console) -> int:
    from orchestrator.ansible.nightly import install_nightly, local_inventory, nightly_vars
    from orchestrator.lab.netns import inventory_path
    from orchestrator.storage.db import default_db_url, normalize_url

    name = _name(args.campaign, console)
    if name is None or not Path(args.campaign).is_file():
        console.print(f"{args.campaign}: give the campaign file", style="red", markup=False)
        return EXIT_INFRA
    db = args.db or default_db_url()
    if normalize_url(db).get_backend_name() == "sqlite" and not db.startswith("sqlite:////"):
        db = f"sqlite:///{(Path.cwd() / normalize_url(db).database).resolve()}"   # the unit runs elsewhere
    extra = nightly_vars(name, Path(args.campaign), db, args.inventory or inventory_path(), Path.cwd(), args.at,
                         Path(args.out))
    if args.units_only:
        extra["tcplab_nightly_enable"] = False
    if args.systemd_dir:
        extra["tcplab_systemd_dir"] = str(args.systemd_dir.resolve())
    ini = args.manager_inventory or local_inventory(args.results / ".nightly")
    result = install_nightly(ini, extra, console)
    console.print(f"nightly.yml: {'ok' if result.ok else 'FAILED'}, {result.changes} changes"
                  + "".join(f"\n  {h}: {'; '.join(m)}" for h, m in result.failed.items()), markup=False)
    return 0 if result.ok else EXIT_INFRA


def add_parser(sub, console: Console, progress_factory) -> None:
    p = sub.add_parser("campaign", help="nightly campaigns: plans x variants x repetitions, verdicts against the "
                       "vanilla baseline (docs/campaigns.md)", epilog="exit codes (run, resume, verdict): 0 pass, "
                       "1 regression, 2 infrastructure failure, 3 inconclusive (--strict)")
    p.add_argument("action", choices=["run", "resume", "status", "verdict", "report", "nightly"])
    p.add_argument("campaign", help="the campaign file (status/verdict/report also take a stored campaign's name)")
    p.add_argument("--db", default=None, help="database URL (default $TCPLAB_DB or results/tcplab.db)")
    p.add_argument("--inventory", type=Path, default=None, help="run/resume: default the netns lab's inventory")
    p.add_argument("--results", type=Path, default=Path("results"))
    p.add_argument("--label", default=None, help="run: the night's label (default: date and time)")
    p.add_argument("--strict", action="store_true", help="exit 3 when a check stays INCONCLUSIVE")
    p.add_argument("--night", type=int, default=None, help="verdict: this night (default: the last finished)")
    p.add_argument("--out", default="results", help="report: the folder for campaign-NAME.html")
    p.add_argument("--json", action="store_true", help="status: as JSON")
    p.add_argument("--at", default="*-*-* 02:00:00", help="nightly: when the timer fires (systemd OnCalendar)")
    p.add_argument("--manager-inventory", type=Path, default=None,
                   help="nightly: an INI inventory with a `manager` group (default: this machine, local connection)")
    p.add_argument("--systemd-dir", type=Path, default=None, help="nightly: where the units go (default "
                   "/etc/systemd/system)")
    p.add_argument("--units-only", action="store_true", help="nightly: write the units, do not enable the timer "
                   "(a machine without systemd as init)")

    def run(args: argparse.Namespace) -> int:
        if args.action in ("run", "resume"):
            return cmd_run(args, console, progress_factory)
        return {"status": cmd_status, "verdict": cmd_verdict, "report": cmd_report,
                "nightly": cmd_nightly}[args.action](args, console)

    p.set_defaults(func=run)
