"""playbooks/ through ansible-runner (effects), with progress on the console and a structured log line per
task result ("host=… task=… status=changed").

`run_playbook` returns what a caller needs to judge the run: the return code, Ansible's per-host stats and
every changed or failed task by host (a second run of an idempotent playbook changes nothing).
"""
from __future__ import annotations

import logging
import os
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import ansible_runner
from rich.console import Console
from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

log = logging.getLogger("tcplab.ansible")
PLAYBOOKS = Path(__file__).resolve().parents[2] / "playbooks"
# Ansible settings for testbed hosts: no interpreter discovery round trip, pipelining (one SSH exchange per
# task instead of three: under a TCG guest every exchange costs), facts only where a play asks for them
SETTINGS = {"ANSIBLE_PYTHON_INTERPRETER": "/usr/bin/python3", "ANSIBLE_PIPELINING": "True",
            "ANSIBLE_GATHERING": "explicit", "ANSIBLE_TIMEOUT": "60", "ANSIBLE_HOST_KEY_CHECKING": "True",
            "ANSIBLE_RETRY_FILES_ENABLED": "False", "ANSIBLE_FORKS": "10", "ANSIBLE_NOCOLOR": "True",
            "ANSIBLE_DEPRECATION_WARNINGS": "False", "ANSIBLE_LOCALHOST_WARNING": "False"}


@dataclass
class PlaybookResult:
    playbook: str
    rc: int
    status: str
    stats: dict[str, dict[str, int]] = field(default_factory=dict)   # host -> ok/changed/failures/unreachable
    changed: dict[str, list[str]] = field(default_factory=dict)      # host -> task names that changed
    failed: dict[str, list[str]] = field(default_factory=dict)       # host -> "task: message"
    task_s: dict[str, list[tuple[str, float]]] = field(default_factory=dict)  # host -> (task, seconds)
    duration_s: float = 0.0

    @property
    def ok(self) -> bool:
        return self.rc == 0 and not self.failed

    @property
    def changes(self) -> int:
        return sum(len(v) for v in self.changed.values())


def _message(res: dict) -> str:
    msg = res.get("msg") or ""
    # a failed command says "non-zero return code" and tells why on its stderr
    text = (res.get("stderr") if msg == "non-zero return code" else None) or msg or res.get("stderr") \
        or res.get("stdout") or ""
    return " ".join(str(text).split())[:400]


def run_playbook(name: str, inventory: Path, extravars: dict, limit: str | None = None,
                 console: Console | None = None, timeout_s: int = 1800) -> PlaybookResult:
    """Run playbooks/<name> against `inventory` (INI, Ansible's own loader)."""
    console = console or Console(stderr=True)
    result = PlaybookResult(name, -1, "unstarted")
    # ansible-runner starts `ansible-playbook` from PATH: this interpreter's (the venv's) first
    os.environ["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
    with tempfile.TemporaryDirectory(prefix="tcplab-ansible-") as private, \
            Progress(SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(),
                     console=console, transient=False) as progress:
        bar = progress.add_task(f"{name}: starting", total=None)

        started: dict[str, float] = {}

        def on_event(event: dict) -> bool:
            data = event.get("event_data", {})
            kind, host, task = event.get("event", ""), data.get("host", ""), data.get("task", "")
            if kind == "playbook_on_task_start":
                progress.update(bar, description=f"{name}: {task}")
                started[task] = time.monotonic()
            elif kind in ("runner_on_ok", "runner_on_failed", "runner_on_unreachable"):
                res = data.get("res", {})
                if kind == "runner_on_ok":
                    status = "changed" if res.get("changed") else "ok"
                elif kind == "runner_on_failed" and data.get("ignore_errors"):
                    status = "ignored"
                else:
                    status = "failed" if kind == "runner_on_failed" else "unreachable"
                took = time.monotonic() - started.get(task, time.monotonic())
                result.task_s.setdefault(host, []).append((task, round(took, 1)))
                log.info("host=%s playbook=%s task=%r status=%s duration_s=%.1f", host, name, task, status, took)
                if status == "changed":
                    result.changed.setdefault(host, []).append(task)
                    progress.console.print(f"  {host}: changed: {task}")
                elif status in ("failed", "unreachable"):
                    result.failed.setdefault(host, []).append(f"{task}: {_message(res)}")
                    progress.console.print(f"  [red]{host}: {status}: {task}: {_message(res)}[/red]")
            elif kind in ("runner_item_on_failed", "runner_item_on_unreachable"):
                res = data.get("res", {})
                item = res.get("_ansible_item_label", res.get("item", "?"))
                result.failed.setdefault(host, []).append(f"{task} [{item}]: {_message(res)}")
                progress.console.print(f"  [red]{host}: failed: {task} [{item}]: {_message(res)}[/red]")
            elif kind == "playbook_on_stats":
                for key, out in (("ok", "ok"), ("changed", "changed"), ("failures", "failures"),
                                 ("dark", "unreachable")):
                    for host, n in (data.get(key) or {}).items():
                        result.stats.setdefault(host, {})[out] = n
            return True

        t0 = time.monotonic()
        r = ansible_runner.run(private_data_dir=private, playbook=str(PLAYBOOKS / name),
                               inventory=str(inventory.resolve()), extravars=extravars, limit=limit,
                               envvars=SETTINGS, event_handler=on_event, quiet=True, timeout=timeout_s)
        result.rc, result.status, result.duration_s = r.rc, r.status, round(time.monotonic() - t0, 1)
        progress.update(bar, description=f"{name}: {r.status} (rc {r.rc}), {result.changes} changed")
    return result
