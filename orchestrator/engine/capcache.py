"""The capability cache: what each inventory host's agent reported at its last hello, so `tcplab run --dry-run`
can judge a plan without connecting to the testbed.

File: `<results>/capabilities.json` (next to the run folders of the same testbed), one entry per inventory
role: the agent URL, the time of the hello (UTC) and the HelloResult's capabilities. Every hello of the run
engine (connect, reconnect) rewrites that host's entry. An entry is fresh while it is younger than
MAX_AGE_S and names the agent URL the inventory gives now; a host rebooted into another kernel within that
time is only seen by a real run (or `--dry-run --refresh`).
"""
from __future__ import annotations

import datetime as dt
import json
from dataclasses import dataclass
from pathlib import Path

from pydantic import ValidationError

from orchestrator.inventory import Inventory
from schemas import protocol
from schemas.atomic import write_atomic

CACHE_FILE = "capabilities.json"
MAX_AGE_S = 3600.0


@dataclass(frozen=True)
class CachedHello:
    agent: str
    at: dt.datetime
    capabilities: protocol.Capabilities


def cache_path(results_dir: Path) -> Path:
    return results_dir / CACHE_FILE


def parse(text: str) -> dict[str, CachedHello]:
    """The cache's entries; an entry that does not read back (older format, hand-edited) is left out."""
    try:
        raw = json.loads(text)
    except ValueError:
        return {}
    out = {}
    for role, e in (raw.items() if isinstance(raw, dict) else ()):
        try:
            out[role] = CachedHello(agent=str(e["agent"]), at=dt.datetime.fromisoformat(e["at"]),
                                    capabilities=protocol.Capabilities.model_validate(e["capabilities"]))
        except (KeyError, TypeError, ValueError, ValidationError):
            continue
    return out


def render(entries: dict[str, CachedHello]) -> str:
    return json.dumps({role: {"agent": e.agent, "at": e.at.isoformat(),
                              "capabilities": e.capabilities.model_dump(mode="json")}
                       for role, e in sorted(entries.items())}, indent=2) + "\n"


def stale_hosts(entries: dict[str, CachedHello], inv: Inventory, now: dt.datetime,
                max_age_s: float = MAX_AGE_S) -> list[str]:
    """Inventory roles whose cached hello cannot stand in for a live one, each with why (empty: all fresh)."""
    out = []
    for role, host in inv.hosts.items():
        e = entries.get(role)
        if e is None:
            out.append(f"{role}: never seen")
        elif e.agent != host.agent:
            out.append(f"{role}: last seen at {e.agent}, the inventory says {host.agent}")
        elif (age := (now - e.at).total_seconds()) > max_age_s or age < 0:
            out.append(f"{role}: last hello {age:.0f} s ago (fresh for {max_age_s:.0f} s)")
    return out


def load(results_dir: Path) -> dict[str, CachedHello]:
    path = cache_path(results_dir)
    return parse(path.read_text()) if path.is_file() else {}


def record(results_dir: Path, role: str, agent: str, hello: protocol.HelloResult, at: dt.datetime) -> None:
    """Rewrite `role`'s entry (atomically: a manager stopped mid-write leaves the previous file)."""
    entries = load(results_dir)
    entries[role] = CachedHello(agent=agent, at=at, capabilities=hello.capabilities)
    results_dir.mkdir(parents=True, exist_ok=True)
    write_atomic(cache_path(results_dir), render(entries))
