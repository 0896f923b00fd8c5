"""Replace a small file atomically: write a temporary file beside it, fsync, rename over it. A process stopped
mid-write (a killed manager, a crashed agent) leaves the previous file or the new one, never half of one -- the
property the run marker, the capability cache, the lab's agent list and the agent's reset baseline rely on.
Neither the temporary file nor the target is followed if it is a symbolic link (agents run as root)."""
from __future__ import annotations

import os
from pathlib import Path


def write_atomic(path: Path, text: str, mode: int = 0o644) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, mode)
    try:
        os.write(fd, text.encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
