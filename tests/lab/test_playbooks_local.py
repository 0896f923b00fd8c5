"""playbooks/kernel-install.yml's verification, run for real by ansible-runner against this machine
(`ansible_connection=local`, verify only: nothing installed, no reboot). The host kernel has htb, tbf, reno and
cubic and no netem: the play passes for the first, and fails for netem and for a release it does not run,
saying which. Both playbooks pass Ansible's syntax check. The qdisc probe uses a scratch namespace it removes."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from rich.console import Console

from orchestrator.ansible.kernel_install import KernelTarget
from orchestrator.ansible.runner import PLAYBOOKS, run_playbook
from tests.lab.conftest import lab_unavailable

RELEASE = os.uname().release


@pytest.fixture
def local_inventory(tmp_path) -> Path:
    if reason := lab_unavailable():
        pytest.skip(reason)
    ini = tmp_path / "local.ini"
    ini.write_text(f"[aqm]\nthis-machine ansible_connection=local ansible_python_interpreter={sys.executable}\n")
    return ini


def _verify(ini: Path, release: str, ccs: list[str], qdiscs: list[str]):
    target = KernelTarget(release, "running", None, ())
    return run_playbook("kernel-install.yml", ini, {"tcplab_hosts": "this-machine", "tcplab_verify_only": True,
                                                    "tcplab_kernel": target.extravar([], ccs, qdiscs)},
                        limit="this-machine", console=Console())


def test_playbooks_pass_the_syntax_check():
    bin_dir = Path(sys.executable).parent
    for name in ("site.yml", "kernel-install.yml", "nightly.yml"):
        # a stdin of our own: Ansible refuses a non-blocking one, and the one pytest inherited is shared with every
        # child process of the session (any of them may have set O_NONBLOCK on it)
        r = subprocess.run([str(bin_dir / "ansible-playbook"), "--syntax-check", "-i", "localhost,",
                            "-e", "tcplab_hosts=localhost", str(PLAYBOOKS / name)], capture_output=True, text=True,
                           stdin=subprocess.DEVNULL)
        assert r.returncode == 0, r.stdout + r.stderr


def test_verify_passes_for_what_this_kernel_has(local_inventory):
    result = _verify(local_inventory, RELEASE, ["reno", "cubic"], ["htb", "tbf"])
    assert result.ok and result.changes == 0, result.failed


def test_verify_names_a_missing_qdisc(local_inventory):
    result = _verify(local_inventory, RELEASE, ["reno"], ["htb", "netem"])
    assert not result.ok
    (message,) = result.failed["this-machine"]
    assert "FAIL: qdisc netem cannot be created" in message and "htb" not in message.split("FAIL")[1]


def test_verify_refuses_another_release(local_inventory):
    result = _verify(local_inventory, "6.12.99-not-this-one", [], [])
    assert not result.ok
    assert "runs " + RELEASE in " ".join(result.failed["this-machine"])
    leftover = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert "tcplab-verify-" not in leftover
