"""(temporary stand-in until the kernel build's UML support lands)"""
from __future__ import annotations

import subprocess
from dataclasses import asdict, dataclass
from pathlib import Path

DEBIAN_UML = Path("/usr/bin/linux.uml")
DEBIAN_UML_MODULES = Path("/usr/lib/uml/modules")


@dataclass(frozen=True)
class UmlKernel:
    binary: Path
    modules_root: Path | None
    release: str
    build_key: str | None
    tracing: bool
    source: str

    def to_json(self) -> dict:
        return {k: str(v) if isinstance(v, Path) else v for k, v in asdict(self).items()}


def debian_uml() -> UmlKernel | None:
    if not DEBIAN_UML.exists():
        return None
    release = subprocess.run([str(DEBIAN_UML), "--version"], capture_output=True, text=True, check=False).stdout.strip()
    mods = DEBIAN_UML_MODULES / release
    return UmlKernel(DEBIAN_UML, mods if (mods / "modules.dep").exists() else None, release, None, False,
                     "debian:user-mode-linux")


def stock_uml() -> UmlKernel | None:
    return debian_uml()


def find_uml_build(key: str) -> UmlKernel | None:
    return None
