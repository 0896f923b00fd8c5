"""The layering contracts in pyproject.toml ([tool.importlinter]) hold, and they would catch a forbidden import:
the packages are copied aside, one import against the layering is added, and `lint-imports` must fail naming the
contract it breaks."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("orchestrator", "agents", "analysis", "schemas")


def _lint(cwd: Path) -> subprocess.CompletedProcess:
    lint = Path(sys.executable).with_name("lint-imports")
    if not lint.exists():
        pytest.skip("lint-imports is not installed (pip install -e '.[test]')")
    env = {**os.environ, "PYTHONPATH": str(cwd)}   # the copy, not the installed tree, is what gets imported
    return subprocess.run([str(lint), "--no-cache"], cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


def test_the_repository_keeps_its_layers():
    result = _lint(ROOT)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("module, line, contract", [
    ("orchestrator/storage/writer.py", "import orchestrator.engine.runner", "manager layers"),
    ("orchestrator/ingest/assemble.py", "import orchestrator.guards.finalise", "manager layers"),
    ("orchestrator/engine/verify.py", "import agents.host.argv", "no agent internals"),
    ("agents/session.py", "import orchestrator.plan", "agents depend on schemas only"),
    ("analysis/metrics/stats.py", "import sqlalchemy", "metric maths is pure"),
    ("orchestrator/plan/expansion/runs.py", "import orchestrator.plan.checks.passes", "plan layers"),
    ("orchestrator/plan/model/qdiscs.py", "import orchestrator.plan.expansion.derive", "plan layers"),
])
def test_a_forbidden_import_breaks_a_contract(tmp_path, module, line, contract):
    for pkg in PACKAGES:
        shutil.copytree(ROOT / pkg, tmp_path / pkg, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path)
    assert _lint(tmp_path).returncode == 0          # the copy itself is clean
    target = tmp_path / module
    target.write_text(target.read_text() + f"\n{line}  # noqa: E402,F401\n")
    result = _lint(tmp_path)
    assert result.returncode != 0
    assert contract in result.stdout and "BROKEN" in result.stdout, result.stdout
