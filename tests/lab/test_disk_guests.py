"""Disk guests are real hosts: `lab up --kind vm --disk` boots the aqm from its own Debian disk through the lab's
firmware; playbooks/site.yml (ansible-runner, over SSH) deploys the agent as a systemd unit, and a second run
changes nothing; playbooks/kernel-install.yml installs Debian's 6.12 image, boots it once through the guest's
own GRUB environment block, verifies it and pins it; a run then records the release and boot_id the host
reported. A second install of the same kernel neither reboots nor changes anything.

Needs what the VM lab needs plus debootstrap and Debian's archive (the base image is built once, ~100 s,
and cached); skips naming what is missing. Slow under TCG (minutes): marked `slow`.
"""
from __future__ import annotations

import asyncio
import json
import shutil
import time
from pathlib import Path

import pytest
from rich.console import Console
from sqlalchemy import text

from orchestrator.agent_client import AgentClient
from orchestrator.ansible import kernel_install
from orchestrator.ansible.provision import calibrate_lab_guests, provision
from orchestrator.inventory import load_inventory
from orchestrator.lab import grubenv, netns, vm, vm_disk, vm_image
from orchestrator.lab.vm_disk_lab import ssh_argv
from schemas import procs
from tests.lab.conftest import TEST_PREFIX, run_lab_plan, skip_unless_vm_lab_can_run

PREFIX = f"{TEST_PREFIX}dk"[:12]
REPO = Path(__file__).resolve().parents[2]
NEW_KERNEL = "linux-image-6.12.*+deb12-amd64"
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def disk_lab(tmp_path_factory):
    skip_unless_vm_lab_can_run()
    if shutil.which("debootstrap") is None:
        pytest.skip("disk guests need debootstrap (make vm-deps)")
    try:
        vm_disk.ensure_base_image()
    except netns.LabError as exc:
        pytest.skip(f"no base image for disk guests (Debian's archive unreachable?): {exc}")
    state_dir = tmp_path_factory.mktemp(PREFIX)
    try:
        inv = vm.up(state_dir, PREFIX, timeout_s=300, disk=True)
        yield inv, state_dir
    finally:
        try:    # the post-mortem: what the guest's agent said
            doc = json.loads((state_dir / "inventory.json").read_text())
            for argv in (["systemctl", "status", "--no-pager", "tcplab-agent", "tcplab-tuning"],
                         ["journalctl", "-b", "-u", "tcplab-agent", "-n", "25", "--no-pager"]):
                print(procs.run(ssh_argv(doc, "aqm", argv), check=False, timeout=60).stdout)
        except (OSError, ValueError, KeyError, procs.CommandFailed) as exc:
            print(f"(no agent journal: {exc})")
        vm.down(state_dir, PREFIX)


def _hello(inventory: Path, role: str = "aqm"):
    inv = load_inventory(inventory)

    async def go():
        client = AgentClient(role, inv.hosts[role].agent, inv.token)
        hello = await client.connect("test")
        await client.close()
        return hello
    return asyncio.run(go())


def test_the_disk_guest_boots_its_own_disk_and_answers_ssh(disk_lab):
    inv, state_dir = disk_lab
    guest = inv["vm"]["guests"]["aqm"]
    print(f"\naqm: sshd after {guest['ssh_s']} s")
    boots = [json.loads(line) for line in (state_dir / "vm-aqm" / "boots.jsonl").read_text().splitlines()]
    assert boots[0]["why"] == "newest" and boots[0]["release"].startswith("6.1.0-")
    assert inv["hosts"]["aqm"]["ssh"]["ansible_host"] == "127.0.0.1"
    assert (state_dir / "inventory.ini").read_text().count("ansible_ssh_private_key_file=") == 1


def test_site_yml_deploys_the_agent_and_a_second_run_changes_nothing(disk_lab):
    _, state_dir = disk_lab
    ini = state_dir / "inventory.ini"
    first = provision(ini, Console())
    assert first.ok, first.failed
    assert first.changes > 0
    calibrate_lab_guests(state_dir / "inventory.json", Console())
    hello = _hello(state_dir / "inventory.json")
    assert hello.capabilities.kernel_release.startswith("6.1.0-") and "netem" in hello.capabilities.qdiscs
    second = provision(ini, Console())
    print(f"site.yml: first {first.duration_s} s ({first.changes} changes), second {second.duration_s} s")
    assert second.ok and second.changes == 0, second.changed


def test_kernel_install_boots_once_verifies_pins_and_a_run_records_it(disk_lab, tmp_path):
    inv, state_dir = disk_lab
    ini = state_dir / "inventory.ini"
    before = _hello(state_dir / "inventory.json").capabilities
    try:
        target = kernel_install.resolve(NEW_KERNEL)
    except vm_image.ImageError as exc:
        pytest.skip(f"{NEW_KERNEL} not downloadable: {exc}")
    started = time.monotonic()
    result = kernel_install.install(ini, target, ["aqm"], Console(), modules=["sch_netem"], ccs=["dctcp"],
                                    qdiscs=["netem", "fq_codel", "red"])
    took = time.monotonic() - started
    print(f"kernel install {target.release}: {took:.1f} s; tasks: {result.task_s}")
    assert result.ok, result.failed
    boots = [json.loads(line) for line in (state_dir / "vm-aqm" / "boots.jsonl").read_text().splitlines()]
    assert (boots[-1]["release"], boots[-1]["why"]) == (target.release, "next_entry (one-shot)")
    listed = procs.run(ssh_argv(json.loads((state_dir / "inventory.json").read_text()), "aqm",
                                ["grub-editenv", "/boot/grub/grubenv", "list"]), timeout=120).stdout.splitlines()
    assert f"saved_entry={grubenv.debian_title(target.release)}" in listed and "next_entry=" in listed, listed
    calibrate_lab_guests(state_dir / "inventory.json", Console())
    after = _hello(state_dir / "inventory.json").capabilities
    assert after.kernel_release == target.release and after.boot_id != before.boot_id
    assert after.kernel_build is not None and after.kernel_build.variant == target.variant
    assert "dualpi2" not in after.qdiscs or after.kernel_release.startswith("6.1")   # 6.12: as Debian builds it
    # the same install again: already on the release, nothing to do, no reboot
    again = kernel_install.install(ini, target, ["aqm"], Console(), qdiscs=["netem"])
    assert again.ok and again.changes == 0, again.changed
    assert _hello(state_dir / "inventory.json").capabilities.boot_id == after.boot_id
    # a run on the lab records the host's release and boot_id
    db = run_lab_plan(REPO / "tests" / "plans" / "kernel_release_recorded.yaml", state_dir, tmp_path)
    with db.connect() as conn:
        rows = conn.execute(text("SELECT host, release, boot_id FROM run_host WHERE host = 'aqm'")).all()
    assert rows and all(r.release == target.release and r.boot_id == after.boot_id for r in rows), rows


def test_a_kernel_that_cannot_boot_falls_back_to_the_saved_default(disk_lab):
    """A one-shot entry naming a kernel that cannot mount the root disk (the running kernel's image under a
    release that has no modules: no virtio_blk, no ext4) resets the guest, and the firmware boots the saved
    default, as GRUB's next_entry does on a machine."""
    inv, state_dir = disk_lab
    doc = json.loads((state_dir / "inventory.json").read_text())
    before = _hello(state_dir / "inventory.json").capabilities
    broken = "9.9.9-tcplab-broken"
    script = (f"cp /boot/vmlinuz-$(uname -r) /boot/vmlinuz-{broken} && "
              f"grub-editenv /boot/grub/grubenv set 'next_entry={grubenv.debian_title(broken)}' && "
              "(sleep 1; systemctl reboot) >/dev/null 2>&1 &")
    procs.run(ssh_argv(doc, "aqm", ["sh", "-c", script]), timeout=60)
    deadline = time.monotonic() + 300
    boots = []
    while time.monotonic() < deadline:
        boots = [json.loads(line) for line in (state_dir / "vm-aqm" / "boots.jsonl").read_text().splitlines()]
        if len(boots) >= 2 and boots[-2]["release"] == broken and boots[-1]["why"] == "saved_entry":
            break
        time.sleep(2)
    assert boots[-2]["release"] == broken and boots[-2]["why"] == "next_entry (one-shot)", boots
    assert (boots[-1]["release"], boots[-1]["why"]) == (before.kernel_release, "saved_entry"), boots
    failed_console = (state_dir / "vm-aqm" / f"console.{len(boots) - 2}.log").read_text(errors="replace")
    assert "cannot mount /dev/vda: reset" in failed_console
    calibrate_lab_guests(state_dir / "inventory.json", Console())    # waits for the agent to be back
    after = _hello(state_dir / "inventory.json").capabilities
    assert after.kernel_release == before.kernel_release and after.boot_id != before.boot_id
