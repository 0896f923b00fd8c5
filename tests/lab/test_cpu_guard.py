"""G-CPULOAD on the netns lab: a real run on a machine whose cores are saturated is completed, flagged and
carries the per-CPU summary as evidence. The three namespace hosts share one kernel, so one sampler speaks
for all of them and the flag names them together."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from sqlalchemy import text

from tests.lab.conftest import one_flow_plan, run_lab_plan, stored_flags

PLAN = one_flow_plan("cpuguard", "a short bulk flow while every core spins (G-CPULOAD)", duration="3s",
                     run_extra="  captures: []\n  analysis: {warmup: 1s}\n")


def test_saturated_machine_flags_the_run(lab, tmp_path: Path) -> None:
    _, state_dir = lab
    plan = tmp_path / "cpuguard.yaml"
    plan.write_text(PLAN)
    # one busy loop per core, bounded in time by itself (60 s) and stopped by pid
    spin = "import time\nend = time.monotonic() + 60\nwhile time.monotonic() < end: pass"
    spinners = [subprocess.Popen([sys.executable, "-c", spin]) for _ in range(os.cpu_count() or 1)]
    try:
        db = run_lab_plan(plan, state_dir, tmp_path)
    finally:
        for p in spinners:
            p.kill()
            p.wait()
    with db.connect() as conn:
        [run] = conn.execute(text("SELECT run_id, status FROM run")).all()
        cpu = conn.execute(text("SELECT host, data FROM host_evidence WHERE phase = 'cpu'")).all()
    assert run.status == "complete"                 # flagged, not failed: the artifacts are still the run's
    [flags] = stored_flags(db).values()
    loaded = [f for f in flags if f.guard == "G-CPULOAD"]
    print("\n".join(map(str, loaded)))
    assert loaded, flags
    assert all(f.host == "client+aqm+server" and f.message.startswith("cpu") for f in loaded), loaded
    assert len(cpu) == 1                            # one kernel, one sampler
    data = json.loads(cpu[0].data) if isinstance(cpu[0].data, str) else cpu[0].data
    assert sorted(data["shared_by"]) == ["aqm", "client", "server"]
    assert len(data["cpus"]) == os.cpu_count()
    assert max(c["saturated_share"] for c in data["cpus"].values()) > 0.5
