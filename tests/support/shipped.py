"""The plans, testbed profiles and campaigns shipped in experiments/ (profiles live in experiments/profiles/,
campaigns in experiments/campaigns/)."""
from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PROFILE_DIR = ROOT / "experiments" / "profiles"
CAMPAIGN_DIR = ROOT / "experiments" / "campaigns"
STUDY_PLANS = sorted(p for p in (ROOT / "experiments").rglob("*.yaml")
                     if PROFILE_DIR not in p.parents and CAMPAIGN_DIR not in p.parents)
PROFILES = sorted(PROFILE_DIR.glob("*.yaml"))
CAMPAIGNS = sorted(CAMPAIGN_DIR.glob("*.yaml"))
