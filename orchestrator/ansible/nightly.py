"""`tcplab campaign nightly FILE` (effects): playbooks/nightly.yml on the manager — a systemd service running the
campaign and a timer starting it every night. Default target: this machine over Ansible's local connection;
`--manager-inventory` names another manager (an INI inventory with a `manager` group)."""
from __future__ import annotations

import shutil
import sys
from pathlib import Path

from rich.console import Console

from orchestrator.ansible.runner import PlaybookResult, run_playbook


def local_inventory(directory: Path) -> Path:
    """An inventory of this machine alone, as the `manager` group, reached without SSH."""
    directory.mkdir(parents=True, exist_ok=True)
    ini = directory / "manager.ini"
    ini.write_text(f"[manager]\nthis-manager ansible_connection=local ansible_python_interpreter={sys.executable}\n")
    return ini


def nightly_vars(campaign: str, campaign_file: Path, db_url: str, testbed_inventory: Path, workdir: Path,
                 at: str, report_dir: Path, tcplab_bin: str | None = None) -> dict:
    """The playbook's extra vars (pure): absolute paths, since the unit runs from anywhere."""
    return {"tcplab_campaign": campaign, "tcplab_campaign_file": str(campaign_file.resolve()),
            "tcplab_bin": tcplab_bin or shutil.which("tcplab") or str(Path(sys.executable).parent / "tcplab"),
            "tcplab_workdir": str(workdir.resolve()), "tcplab_db_url": db_url,
            "tcplab_testbed_inventory": str(testbed_inventory.resolve()), "tcplab_nightly_at": at,
            "tcplab_report_dir": str(report_dir.resolve())}


def install_nightly(inventory: Path, extravars: dict, console: Console) -> PlaybookResult:
    return run_playbook("nightly.yml", inventory, extravars, console=console)
