"""The agent bundle playbooks/site.yml deploys (effects: pip, files).

One tar.gz per content, named by the sha256 of its sources: the agent's code (`agents/`, `schemas/`), the third-party
packages it imports (AGENT_REQUIREMENTS, at the versions this manager runs, built for the hosts' Python)
already installed into `site/` (`pip install --target` here), and their requirements.txt. Testbed hosts need
no internet, no pip and no virtualenv: Ansible copies one file and unpacks it, and the agent runs with the
host's python3 and PYTHONPATH=<release>:<release>/site. A host runs the exact code and versions the manager
was tested with; a changed file is a new bundle name, which restarts the agent. (pip and ensurepip on a TCG
guest took minutes; unpacking takes seconds.)
"""
from __future__ import annotations

import gzip
import hashlib
import importlib.metadata
import io
import os
import py_compile
import shutil
import sys
import tarfile
import tempfile
from pathlib import Path

from schemas import procs

REPO_ROOT = Path(__file__).resolve().parents[2]
# what agents/ and schemas/ import from outside the standard library (tests/unit/test_agent_bundle.py checks)
AGENT_REQUIREMENTS = ("websockets", "pydantic", "jsonschema", "pyroute2")
CODE_DIRS = ("agents", "schemas")
CACHE = Path(os.environ.get("TCPLAB_CACHE", "/var/cache/tcplab")) / "agent"


class BundleError(RuntimeError):
    pass


def pinned_requirements() -> list[str]:
    """AGENT_REQUIREMENTS at the versions installed here (what the tests ran with)."""
    return [f"{name}=={importlib.metadata.version(name)}" for name in AGENT_REQUIREMENTS]


def constraints() -> list[str]:
    """Every package installed here, pinned: the agents' transitive dependencies get the same versions."""
    return sorted(f"{d.metadata['Name']}=={d.version}" for d in importlib.metadata.distributions()
                  if d.metadata["Name"])


def code_files(root: Path = REPO_ROOT) -> list[Path]:
    """The agent's sources, sorted (caches and bytecode left out)."""
    out = []
    for top in CODE_DIRS:
        out += [p for p in (root / top).rglob("*") if p.is_file() and "__pycache__" not in p.parts
                and p.suffix in (".py", ".json")]
    return sorted(out)


def _tar_bytes(members: list[tuple[str, bytes]]) -> bytes:
    """A deterministic tar.gz: sorted names, mtime 0, root-owned, gzip without a timestamp."""
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, data in sorted(members):
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.mtime, info.uid, info.gid = len(data), 0o644, 0, 0, 0
            tar.addfile(info, io.BytesIO(data))
    return gzip.compress(raw.getvalue(), mtime=0)


def site_packages(python: str, progress=print) -> Path:
    """The pinned requirements installed for CPython `python` (e.g. "3.11") on x86-64 Linux, cached by pins."""
    pins = pinned_requirements()
    key = hashlib.sha256("\n".join([python, *pins]).encode()).hexdigest()[:12]
    dest = CACHE / f"site-{key}"
    if (dest / "requirements.txt").exists():
        return dest
    part = dest.with_name(dest.name + f".part{os.getpid()}")
    shutil.rmtree(part, ignore_errors=True)
    part.mkdir(parents=True)
    constraints_file = part.with_suffix(".constraints")
    constraints_file.write_text("\n".join(c for c in constraints() if c.split("==")[0].lower() != "tcplab") + "\n")
    progress(f"agent packages for CPython {python}: {' '.join(pins)}")
    r = procs.run([sys.executable, "-m", "pip", "install", "-q", "--only-binary=:all:", "--target", str(part / "site"),
                   "--python-version", python, "--implementation", "cp", "--platform", "manylinux2014_x86_64",
                   "--platform", "manylinux_2_17_x86_64", "--platform", "manylinux_2_28_x86_64",
                   "--no-compile", "-c", str(constraints_file), *pins], check=False, timeout=600)
    constraints_file.unlink()
    if r.returncode != 0:
        raise BundleError(f"pip install --target of the agent's packages failed: {r.stderr.strip()[-1500:]}")
    (part / "requirements.txt").write_text("\n".join(pins) + "\n")
    os.replace(part, dest)
    return dest


def bytecode(members: list[tuple[str, bytes]]) -> list[tuple[str, bytes]]:
    """__pycache__/*.pyc for every .py member, compiled here for this interpreter's version, as
    unchecked-hash pycs: a release directory never changes (its name is the bundle's hash), so the host's
    Python uses them without comparing sources, and the agent does not compile itself at its first start
    (under TCG that took a minute)."""
    tag = sys.implementation.cache_tag
    out = []
    with tempfile.TemporaryDirectory(prefix="tcplab-pyc-") as tmp:
        for name, data in members:
            if not name.endswith(".py"):
                continue
            src = Path(tmp) / name
            src.parent.mkdir(parents=True, exist_ok=True)
            src.write_bytes(data)
            pyc = src.parent / "__pycache__" / f"{src.stem}.{tag}.pyc"
            py_compile.compile(str(src), cfile=str(pyc), dfile=name, doraise=True,
                               invalidation_mode=py_compile.PycInvalidationMode.UNCHECKED_HASH)
            out.append((str(Path(name).parent / "__pycache__" / pyc.name), pyc.read_bytes()))
    return out


def build_bundle(python: str = f"{sys.version_info.major}.{sys.version_info.minor}", progress=print) -> Path:
    """The bundle for hosts running CPython `python`: CACHE/tcplab-agent-<sha12 of the sources>.tar.gz."""
    site = site_packages(python, progress)
    members = [(str(p.relative_to(REPO_ROOT)), p.read_bytes()) for p in code_files()]
    members += [(str(p.relative_to(site)), p.read_bytes()) for p in sorted((site / "site").rglob("*"))
                if p.is_file() and "__pycache__" not in p.parts]
    members.append(("requirements.txt", (site / "requirements.txt").read_bytes()))
    # named by the sources and the Python they are for: marshal's output (the pycs) depends on the compiling
    # process's state, so the same code compiled by another process must still be the same release
    name = hashlib.sha256(python.encode() + _tar_bytes(members)).hexdigest()[:12]
    path = CACHE / f"tcplab-agent-{name}.tar.gz"
    if path.exists():           # built before (its pycs may differ from a fresh compile: keep the first)
        return path
    if python == f"{sys.version_info.major}.{sys.version_info.minor}":
        members += bytecode(members)
    path.with_suffix(".part").write_bytes(_tar_bytes(members))
    os.replace(path.with_suffix(".part"), path)
    return path
