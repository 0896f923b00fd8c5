"""The host's operating system for the capabilities (G-HETERO): platform.uname() and /etc/os-release.

The parsing is pure; a root agent reads at most 4 KiB of os-release and keeps four fields of it.
"""
from __future__ import annotations

import platform
import shlex
from pathlib import Path

from schemas.protocol import HostOS

OS_RELEASE = (Path("/etc/os-release"), Path("/usr/lib/os-release"))
MAX_OS_RELEASE_BYTES = 4096
MAX_FIELD = 128


def parse_os_release(text: str) -> dict[str, str]:
    """os-release KEY=value lines (values may be shell-quoted) -> {KEY: value}; lines that are not one are
    skipped, as the format says."""
    out = {}
    for line in text.splitlines()[:200]:
        key, sep, value = line.strip().partition("=")
        if not sep or not key.isidentifier():
            continue
        try:
            words = shlex.split(value)
        except ValueError:
            continue
        out[key] = (words[0] if words else "")[:MAX_FIELD]
    return out


def host_os_from(system: str, os_release: str) -> HostOS:
    fields = parse_os_release(os_release)
    return HostOS(system=system[:MAX_FIELD], id=fields.get("ID", ""), version_id=fields.get("VERSION_ID", ""),
                  pretty=fields.get("PRETTY_NAME", ""))


def host_os() -> HostOS:
    text = ""
    for path in OS_RELEASE:
        try:
            with open(path, "rb") as f:
                text = f.read(MAX_OS_RELEASE_BYTES).decode(errors="replace")
            break
        except OSError:
            continue
    return host_os_from(platform.uname().system, text)
