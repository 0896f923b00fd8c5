"""Compile a small C source with the system compiler at first use and load it with ctypes.

Owns the build cache of the reader's optional C kernels (orchestrator/ingest/pcap_walk.py,
orchestrator/ingest/pcap_cdecode.py): `<stem>-<sha256 of source>-<platform>.so` under
$XDG_CACHE_HOME/tcplab (default ~/.cache/tcplab), published with os.replace so concurrent first uses
never load a half-written library. Returns None when there is no compiler, the build fails or the
cache is not writable: every caller has a numpy/Python fallback with identical results.
"""
from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "tcplab"


def build(source: str, stem: str, flags: tuple[str, ...] = ("-O2",)) -> ctypes.CDLL | None:
    """The loaded library of `source` (compiled once per source hash), or None if it cannot be built."""
    digest = hashlib.sha256((source + " ".join(flags)).encode()).hexdigest()[:16]
    so = cache_dir() / f"{stem}-{digest}-{sys.platform}.so"
    try:
        if not so.exists():
            cc = shutil.which("cc") or shutil.which("gcc")
            if cc is None:
                return None
            so.parent.mkdir(parents=True, exist_ok=True)
            with tempfile.TemporaryDirectory(dir=so.parent) as tmp:
                src = Path(tmp) / f"{stem}.c"
                src.write_text(source)
                out = Path(tmp) / so.name
                subprocess.run([cc, *flags, "-shared", "-fPIC", "-o", str(out), str(src)],
                               check=True, capture_output=True, timeout=60)
                os.replace(out, so)
        return ctypes.CDLL(str(so))
    except (OSError, subprocess.SubprocessError):
        return None
