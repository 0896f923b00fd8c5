"""playbooks/nightly.yml run for real by `tcplab campaign nightly` on this machine (local connection, units only:
the test machine has no systemd as init): the service and timer are written with absolute paths, systemd's own
verifier accepts them, and a second run changes nothing."""
from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

CAMPAIGN = Path(__file__).resolve().parents[1] / "plans" / "campaign" / "tiny.yaml"
TCPLAB = str(Path(sys.executable).parent / "tcplab")


def _nightly(tmp_path: Path) -> subprocess.CompletedProcess:
    return subprocess.run([TCPLAB, "campaign", "nightly", str(CAMPAIGN), "--units-only", "--systemd-dir",
                           str(tmp_path / "units"), "--results", str(tmp_path / "results"), "--at", "*-*-* 03:15:00"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL)


def test_nightly_units_written_once_and_valid(tmp_path):
    first = _nightly(tmp_path)
    assert first.returncode == 0 and "nightly.yml: ok, 3 changes" in first.stderr, first.stderr
    service = (tmp_path / "units" / "tcplab-nightly-tiny-queue.service").read_text()
    timer = (tmp_path / "units" / "tcplab-nightly-tiny-queue.timer").read_text()
    assert f"ExecStart={TCPLAB} campaign run {CAMPAIGN} --inventory /" in service
    assert f"ExecStopPost={TCPLAB} campaign report {CAMPAIGN} --out {tmp_path}/results" in service
    assert f"Environment=TCPLAB_DB=sqlite:///{tmp_path}/results/tcplab.db" in service
    assert "OnCalendar=*-*-* 03:15:00" in timer and "Persistent=true" in timer
    second = _nightly(tmp_path)
    assert second.returncode == 0 and "nightly.yml: ok, 0 changes" in second.stderr, second.stderr
    if shutil.which("systemd-analyze") is None:
        pytest.skip("systemd-analyze is not installed: the units' syntax was not verified by systemd")
    v = subprocess.run(["systemd-analyze", "verify", str(tmp_path / "units" / "tcplab-nightly-tiny-queue.timer"),
                        str(tmp_path / "units" / "tcplab-nightly-tiny-queue.service")], capture_output=True, text=True)
    assert v.returncode == 0, v.stderr
