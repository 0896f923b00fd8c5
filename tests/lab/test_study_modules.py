"""The DCTCP-flaws study's own kernel modules built for a Debian kernel and loaded in VM-lab guests
(`tcplab run experiments/vm/mark.yaml`).

The VM lab boots with the aqm and the server as guests and both modules built for the guest kernel
(`vm.up(modules=...)`: each guest's agent gets their build directories as --module-dir); what the runs must
show is checked by tests/lab/study_module_checks.py, which the UML lab's test shares (there the modules are
built with the project's UML kernel, and prr.yaml runs too).

Needs root, QEMU, busybox-static, gcc-12 and make, and Debian's apt archive; skips naming what is missing.
"""
from __future__ import annotations

import shutil

import pytest

from tests.lab.conftest import TEST_PREFIX, run_lab_plan, vm_lab_up, vm_unavailable
from tests.lab.study_module_checks import MARK_PLAN, MODULES, check_mark_runs

PREFIX = f"{TEST_PREFIX}sm"[:12]


@pytest.fixture(scope="module")
def study_lab(tmp_path_factory):
    if reason := vm_unavailable():
        pytest.skip(reason)
    for tool in ("make", "gcc-12", "modinfo", "dpkg-deb", "apt-get"):
        if shutil.which(tool) is None:
            pytest.skip(f"building the study's modules for the guest kernel needs {tool}")
    yield from vm_lab_up(tmp_path_factory, PREFIX, ("aqm", "server"), timeout_s=300, modules=MODULES)


def test_the_lab_offers_the_modules(study_lab):
    inv, _ = study_lab
    assert sorted(inv["vm"]["modules"]) == sorted(MODULES)
    for m in inv["vm"]["modules"].values():
        assert m["vermagic"].startswith(inv["vm"]["release"] + " ")


def test_mark_and_dctcp_flaws_in_runs(study_lab, tmp_path):
    _, state_dir = study_lab
    check_mark_runs(run_lab_plan(MARK_PLAN, state_dir, tmp_path))
