"""The reset baseline: what a host looked like before the agent changed it, kept on disk while a run's
settings are applied.

Reset returns a host to its baseline. The baseline lives in the agent's memory, so an agent that dies mid-run
(killed, crashed, OOM) used to lose it: the restarted agent snapshotted the host as the dead one left it --
with the run's sysctls, qdiscs and offloads -- and took that as "clean", so every later run inherited them
silently. Now the baseline is written to a journal in the agent's private artifacts root before the first
write of an apply, and removed after reset; an agent that starts and finds a journal from the same boot adopts
it, and its next reset restores the host the dead agent should have restored. A journal from an earlier boot
is stale (a reboot reset the kernel's state) and is dropped.

The (de)serialisation is pure; `save`/`load`/`clear` are the effects.
"""
from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path

from schemas.atomic import write_atomic

JOURNAL_NAME = "host-baseline.json"
_FORMAT = 1
_MAX_JOURNAL_BYTES = 1 << 20


@dataclass
class InterfaceSnapshot:
    features: dict[str, bool] = field(default_factory=dict)       # ethtool -K short name -> on
    root_kind: str = "noqueue"
    coalesce: dict[str, int | bool] | None = None                 # None: the driver has none
    pause: dict[str, bool] | None = None
    neighbours: dict[str, str] = field(default_factory=dict)      # PERMANENT entries: addr -> lladdr
    mtu: int | None = None                                        # None: a journal from before MTUs were set
    quickack: dict[str, bool] = field(default_factory=dict)        # route key (schemas/routes.py) -> quickack


@dataclass
class Snapshot:
    """What the host looked like at hello; reset() returns it there."""
    sysctls: dict[str, str] = field(default_factory=dict)
    module_params: dict[tuple[str, str], str] = field(default_factory=dict)
    interfaces: dict[str, InterfaceSnapshot] = field(default_factory=dict)


@dataclass
class Baseline:
    """A snapshot plus what apply has written since (reset restores exactly those), on one boot."""
    boot_id: str
    snapshot: Snapshot
    touched_sysctls: set[str] = field(default_factory=set)
    touched_params: set[tuple[str, str]] = field(default_factory=set)
    loaded_modules: list[str] = field(default_factory=list)    # loaded by apply: reset unloads them


class BadJournal(ValueError):
    """A journal that is not one this agent wrote (truncated, edited, another format)."""


def to_json(b: Baseline) -> str:
    snap = b.snapshot
    return json.dumps({
        "format": _FORMAT, "boot_id": b.boot_id,
        "sysctls": snap.sysctls,
        "module_params": [[m, p, v] for (m, p), v in sorted(snap.module_params.items())],
        "interfaces": {dev: asdict(i) for dev, i in snap.interfaces.items()},
        "touched_sysctls": sorted(b.touched_sysctls),
        "touched_params": sorted([m, p] for m, p in b.touched_params),
        "loaded_modules": list(b.loaded_modules),
    }, indent=1)


def from_json(text: str) -> Baseline:
    try:
        doc = json.loads(text)
        if doc.get("format") != _FORMAT:
            raise BadJournal(f"journal format {doc.get('format')!r}, expected {_FORMAT}")
        snap = Snapshot(
            sysctls={str(k): str(v) for k, v in doc["sysctls"].items()},
            module_params={(str(m), str(p)): str(v) for m, p, v in doc["module_params"]},
            interfaces={str(dev): InterfaceSnapshot(**i) for dev, i in doc["interfaces"].items()})
        return Baseline(boot_id=str(doc["boot_id"]), snapshot=snap,
                        touched_sysctls={str(n) for n in doc["touched_sysctls"]},
                        touched_params={(str(m), str(p)) for m, p in doc["touched_params"]},
                        loaded_modules=[str(m) for m in doc.get("loaded_modules", [])])
    except BadJournal:
        raise
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise BadJournal(f"unreadable journal: {type(exc).__name__}: {exc}") from None


def current_boot_id() -> str:
    return Path("/proc/sys/kernel/random/boot_id").read_text().strip()


def save(path: Path, b: Baseline) -> None:
    """Atomically replace the journal (write a private temporary file, fsync, rename): a crash mid-write leaves
    the previous journal or the new one, never half of one."""
    write_atomic(path, to_json(b), mode=0o600)


def load(path: Path, boot_id: str) -> Baseline | None:
    """The journal a previous agent left on this boot, or None (none, or from an earlier boot: dropped).
    BadJournal when it exists but cannot be trusted -- the caller decides (the agent logs it and drops it)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except FileNotFoundError:
        return None
    try:
        text = os.read(fd, _MAX_JOURNAL_BYTES + 1).decode(errors="replace")
    finally:
        os.close(fd)
    if len(text) > _MAX_JOURNAL_BYTES:
        raise BadJournal(f"journal over {_MAX_JOURNAL_BYTES} bytes")
    b = from_json(text)
    if b.boot_id != boot_id:
        clear(path)
        return None
    return b


def clear(path: Path) -> None:
    path.unlink(missing_ok=True)
