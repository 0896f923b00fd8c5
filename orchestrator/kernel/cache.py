"""The kernel build cache (effects, small): one directory per build key with the packages, modules, config,
log and `metadata.json`; a lock per key; a build is written into a temporary directory and renamed into place,
so an entry is either complete or absent.

Layout: `<root>/<key>/{metadata.json, *.deb, modules/*.ko, config, build.log}`, `<root>/.locks/<key>.lock`,
`<root>/.tmp-<key>-<pid>/` while building. Root: $TCPLAB_KERNEL_CACHE or /var/cache/tcplab/kernels.
"""
from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from schemas.atomic import write_atomic

DEFAULT_ROOT = Path(os.environ.get("TCPLAB_KERNEL_CACHE", "/var/cache/tcplab/kernels"))
METADATA = "metadata.json"


@dataclass(frozen=True)
class Entry:
    key: str
    path: Path
    metadata: dict

    @property
    def release(self) -> str:
        return self.metadata["release"]


def entry(root: Path, key: str) -> Entry | None:
    """The cached build of `key`, or None (an entry without readable metadata is not a build)."""
    path = root / key
    try:
        return Entry(key, path, json.loads((path / METADATA).read_text()))
    except (OSError, ValueError):
        return None


def entries(root: Path) -> list[Entry]:
    """Every complete build, newest first."""
    found = [e for p in sorted(root.glob("[0-9a-f]" * 8 + "*")) if p.is_dir() and (e := entry(root, p.name))]
    return sorted(found, key=lambda e: e.metadata.get("finished_at", ""), reverse=True)


def find(root: Path, prefix: str) -> list[Entry]:
    """Builds whose key starts with `prefix`, or whose release or variant name equals it."""
    return [e for e in entries(root) if e.key.startswith(prefix) or prefix in (e.release, e.metadata.get("variant"))]


@contextlib.contextmanager
def locked(root: Path, key: str) -> Iterator[None]:
    """One builder per key: a second `tcplab kernel build` of the same key waits, then finds it cached."""
    (root / ".locks").mkdir(parents=True, exist_ok=True)
    with open(root / ".locks" / f"{key}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def temp_dir(root: Path, key: str) -> Path:
    path = root / f".tmp-{key}-{os.getpid()}"
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir(parents=True)
    return path


def publish(tmp_out: Path, root: Path, key: str, metadata: dict) -> Entry:
    """Write metadata last, then rename the finished output directory into place (atomic on one filesystem)."""
    write_atomic(tmp_out / METADATA, json.dumps(metadata, indent=2, sort_keys=True) + "\n")
    os.replace(tmp_out, root / key)
    return Entry(key, root / key, metadata)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def gc(root: Path, keep: int, older_than_days: float | None, now: float | None = None) -> list[str]:
    """Remove builds beyond the `keep` newest per variant (and, with `older_than_days`, any older than that),
    the logs of failed builds, and temporary directories of builders that are gone. Returns what was removed."""
    now = time.time() if now is None else now
    removed, per_variant = [], {}
    for e in entries(root):
        n = per_variant[e.metadata.get("variant")] = per_variant.get(e.metadata.get("variant"), 0) + 1
        age_days = (now - (e.path / METADATA).stat().st_mtime) / 86400
        if n > keep or (older_than_days is not None and age_days > older_than_days):
            shutil.rmtree(e.path)
            removed.append(e.key)
    for failed in root.glob("failed-*"):
        shutil.rmtree(failed, ignore_errors=True)
        removed.append(failed.name)
    for tmp in root.glob(".tmp-*"):
        pid = tmp.name.rsplit("-", 1)[-1]
        if not pid.isdigit() or not _pid_alive(int(pid)):
            shutil.rmtree(tmp, ignore_errors=True)
            removed.append(tmp.name)
    return removed
