"""The plans, testbed profiles, campaigns and studies shipped in experiments/ (profiles live in
experiments/profiles/, campaigns in experiments/campaigns/, a study beside its plans as study.yaml)."""
from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PROFILE_DIR = ROOT / "experiments" / "profiles"
CAMPAIGN_DIR = ROOT / "experiments" / "campaigns"
STUDY_FILE = "study.yaml"
STUDY_PLANS = sorted(p for p in (ROOT / "experiments").rglob("*.yaml")
                     if PROFILE_DIR not in p.parents and CAMPAIGN_DIR not in p.parents and p.name != STUDY_FILE)
STUDIES = sorted((ROOT / "experiments").glob(f"*/{STUDY_FILE}"))
PROFILES = sorted(PROFILE_DIR.glob("*.yaml"))
CAMPAIGNS = sorted(CAMPAIGN_DIR.glob("*.yaml"))
