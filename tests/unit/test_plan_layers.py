"""The plan package's layers: model <- expansion <- checks. The expansion takes a checked plan and must not
check it again or reach into the checks; the model knows neither. Read from the source's import statements
(function-level imports included), so a forbidden import fails here before anyone runs it."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

PLAN = Path(__file__).resolve().parents[2] / "orchestrator" / "plan"
FORBIDDEN = {
    "model": ("orchestrator.plan.expansion", "orchestrator.plan.checks", "orchestrator.plan.commands"),
    "expansion": ("orchestrator.plan.checks", "orchestrator.plan.commands"),
    "checks": ("orchestrator.plan.commands",),
}


def _imports(path: Path) -> set[str]:
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.module:
            out.add(node.module)
            out.update(f"{node.module}.{a.name}" for a in node.names)
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
    return out


@pytest.mark.parametrize("layer", sorted(FORBIDDEN))
def test_a_layer_imports_nothing_above_it(layer):
    wrong = [f"{path.relative_to(PLAN)} imports {name}" for path in sorted((PLAN / layer).glob("*.py"))
             for name in sorted(_imports(path)) if name == "orchestrator.plan" or name.startswith(FORBIDDEN[layer])]
    assert wrong == []


def test_every_plan_module_belongs_to_one_layer():
    loose = sorted(p.name for p in PLAN.glob("*.py"))
    assert loose == ["__init__.py", "__main__.py", "commands.py"]   # the public API and the CLI
