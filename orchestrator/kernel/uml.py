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
    module_dir: Path | None = None

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


def _cached_stock() -> UmlKernel | None:
    import json
    for meta in sorted(Path("/var/cache/tcplab/kernels").glob("*/metadata.json")):
        m = json.loads(meta.read_text())
        if m.get("arch") == "um" and m.get("variant") == "uml-6.1":
            d, rel = meta.parent, m["release"]
            return UmlKernel(d / "linux", d / "modules/lib/modules" / rel, rel, m["key"], True, "build:uml-6.1",
                             d / "modules/lib/modules" / rel / "extra")
    return None


def stock_uml() -> UmlKernel | None:  # noqa: F811 - stand-in until the kernel build's version lands
    return _cached_stock() or debian_uml()
