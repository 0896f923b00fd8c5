"""The plans and testbed profiles shipped in experiments/ (profiles live in experiments/profiles/)."""
from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PROFILE_DIR = ROOT / "experiments" / "profiles"
STUDY_PLANS = sorted(p for p in (ROOT / "experiments").rglob("*.yaml") if PROFILE_DIR not in p.parents)
PROFILES = sorted(PROFILE_DIR.glob("*.yaml"))
