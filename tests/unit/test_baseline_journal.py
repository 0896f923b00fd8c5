"""The reset baseline on disk (agents/host/baseline.py) and children that die with the agent
(agents/children.py): what survives an agent crash, and what does not survive a reboot."""
from __future__ import annotations

import json
import os
import stat

import pytest

from agents.children import DIE_WITH_PARENT, with_parent_death
from agents.host import baseline
from agents.host.baseline import BadJournal, Baseline, InterfaceSnapshot, Snapshot

BOOT = "6f0b1c9e-3d2a-4c61-9a57-0c1d2e3f4a5b"


def _baseline() -> Baseline:
    snap = Snapshot(sysctls={"net.ipv4.tcp_ecn": "2", "net.ipv4.tcp_rmem": "4096\t131072\t6291456"},
                    module_params={("tcp_dctcp", "dctcp_shift_g"): "4"},
                    interfaces={"to-aqm": InterfaceSnapshot(features={"tso": True, "gro": False}, root_kind="noqueue",
                                                            coalesce=None, pause={"rx": False},
                                                            neighbours={"10.0.1.2": "02:00:00:00:01:02"})})
    return Baseline(BOOT, snap, {"net.ipv4.tcp_ecn"}, {("tcp_dctcp", "dctcp_shift_g")})


def test_a_baseline_round_trips_through_its_journal_text():
    b = _baseline()
    assert baseline.from_json(baseline.to_json(b)) == b


@pytest.mark.parametrize("text", ["", "{", "[]", '{"format": 2}', '{"format": 1, "boot_id": "x"}',
                                  json.dumps({"format": 1, "boot_id": "x", "sysctls": {}, "module_params": [["m"]],
                                              "interfaces": {}, "touched_sysctls": [], "touched_params": []}),
                                  json.dumps({"format": 1, "boot_id": "x", "sysctls": {}, "module_params": [],
                                              "interfaces": {"eth0": {"colour": "red"}}, "touched_sysctls": [],
                                              "touched_params": []})])
def test_a_journal_that_is_not_ours_is_refused_not_half_adopted(text):
    with pytest.raises(BadJournal):
        baseline.from_json(text)


def test_save_load_clear_on_the_same_boot_and_a_stale_journal_dropped(tmp_path):
    path = tmp_path / baseline.JOURNAL_NAME
    assert baseline.load(path, BOOT) is None
    baseline.save(path, _baseline())
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert not list(tmp_path.glob(".*.tmp"))           # the temporary file was renamed, not left behind
    assert baseline.load(path, BOOT) == _baseline()
    # another boot: the kernel's state was reset by the reboot, the journal describes nothing any more
    assert baseline.load(path, "another-boot") is None and not path.exists()
    baseline.save(path, _baseline())
    baseline.clear(path)
    assert not path.exists()


def test_a_journal_that_is_a_symbolic_link_is_not_followed(tmp_path):
    target = tmp_path / "elsewhere"
    target.write_text(baseline.to_json(_baseline()))
    link = tmp_path / baseline.JOURNAL_NAME
    link.symlink_to(target)
    with pytest.raises(OSError):
        baseline.load(link, BOOT)


def test_the_current_boot_id_is_the_kernels():
    assert baseline.current_boot_id() == open("/proc/sys/kernel/random/boot_id").read().strip()


def test_a_tasks_process_is_started_through_setpriv_pdeathsig():
    argv = ["tcpdump", "-i", "to-aqm", "-w", "x.pcap"]
    assert with_parent_death(argv, have_setpriv=True) == ["setpriv", "--pdeathsig", "KILL", "--", *argv]
    assert with_parent_death(argv, have_setpriv=False) == argv
    assert DIE_WITH_PARENT[-1] == "--"    # an argv starting with "-" is never read as a setpriv option


@pytest.mark.skipif(not os.path.exists("/usr/bin/setpriv"), reason="needs util-linux setpriv")
def test_a_child_started_with_the_death_signal_dies_with_its_parent():
    import subprocess
    import sys
    import time

    # a parent that starts `sleep 60` the way the agent starts tasks, prints its pid, then is SIGKILLed
    parent = subprocess.Popen([sys.executable, "-c", (
        "import asyncio, sys\n"
        "from agents.children import spawn\n"
        "async def main():\n"
        "    p = await spawn(['sleep', '60'])\n"
        "    print(p.pid, flush=True)\n"
        "    await asyncio.sleep(60)\n"
        "asyncio.run(main())\n")], stdout=subprocess.PIPE, text=True, cwd=os.getcwd())
    try:
        child = int(parent.stdout.readline())
        deadline = time.monotonic() + 5
        while open(f"/proc/{child}/comm").read().strip() != "sleep" and time.monotonic() < deadline:
            time.sleep(0.01)
        assert open(f"/proc/{child}/comm").read().strip() == "sleep"   # setpriv exec'd it: same pid
        parent.kill()
        parent.wait(5)
        deadline = time.monotonic() + 5
        while os.path.exists(f"/proc/{child}") and time.monotonic() < deadline:
            try:
                os.waitpid(child, os.WNOHANG)   # not ours; it is reparented, this only spins
            except ChildProcessError:
                pass
            if open(f"/proc/{child}/stat").read().split()[2] == "Z":
                break
            time.sleep(0.05)
        alive = os.path.exists(f"/proc/{child}") and open(f"/proc/{child}/stat").read().split()[2] != "Z"
        assert not alive, f"sleep {child} outlived its parent"
    finally:
        parent.kill()
