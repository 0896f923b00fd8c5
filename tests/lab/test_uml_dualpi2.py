"""DualPI2 on the UML lab: experiments/kernels/uml-7.2.yaml declares `uml-7.2` (Linux 7.2 from Debian's
linux-source-7.2, built for User-Mode Linux with sch_dualpi2 built in) as the aqm's kernel. The lab comes up on
its stock 6.1 kernel, which has no dualpi2; `tcplab run` restarts the aqm alone on the 7.2 build before the run
(a kernel switch on the UML lab is a restart) and verifies it from the new hello, the client and the server
staying on 6.1. What the run must show is tests/lab/dualpi2_plan_checks.py's, as on the VM lab's 7.2 guest.

The build is made here when the cache does not hold it (~7 min on 2 cores: docs/kernels.md). Needs root, the
UML lab's tools and Debian's archive (unstable for linux-source-7.2); skips naming what is missing.
"""
from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy import text

from orchestrator.kernel import cache, uml
from orchestrator.kernel.sources import SourceError
from orchestrator.storage.db import open_db
from tests.lab.conftest import TEST_PREFIX, run_plan_quietly, uml_lab_up, uml_unavailable
from tests.lab.dualpi2_plan_checks import check_dualpi2_run
from tests.lab.study_module_checks import evidence

PLAN = Path(__file__).resolve().parents[2] / "experiments" / "kernels" / "uml-7.2.yaml"
PREFIX = f"{TEST_PREFIX}d7"[:12]
VARIANT = "uml-7.2"


@pytest.fixture(scope="module")
def uml_72() -> uml.UmlKernel:
    if reason := uml_unavailable():     # before building: the build writes to the root-owned cache
        pytest.skip(reason)
    try:
        return uml.ensure_uml_build(PLAN, VARIANT, cache.DEFAULT_ROOT, jobs=2,
                                    progress=lambda step: print(f"{VARIANT}: {step}"))
    except SourceError as exc:
        pytest.skip(f"{VARIANT} cannot be built here: {exc}")


@pytest.fixture(scope="module")
def dualpi2_uml_lab(tmp_path_factory, uml_72):
    yield from uml_lab_up(tmp_path_factory, PREFIX)      # the plan's topology is the default chain


def test_the_72_build_has_dualpi2_built_in(uml_72):
    e = cache.entry(cache.DEFAULT_ROOT, uml_72.build_key)
    config = (e.path / "config").read_text()
    assert "CONFIG_NET_SCH_DUALPI2=y" in config and "CONFIG_HZ=1000" in config
    assert uml_72.release.startswith("7.2.") and uml_72.release.endswith(f"-uml-{uml_72.build_key[:10]}")
    print(f"\n{VARIANT}: {uml_72.release}, built in {e.metadata['duration_s']} s with -j{e.metadata['jobs']}")


def test_the_aqm_restarts_on_72_and_dualpi2_marks_the_classic_flow(dualpi2_uml_lab, uml_72, tmp_path):
    inv, state_dir = dualpi2_uml_lab
    stock = inv["uml"]["kernel"]["release"]
    assert not stock.startswith("7.2.")       # the lab came up on its stock kernel: the run must switch the aqm
    url = f"sqlite:///{tmp_path / 'lab.db'}"
    rc, out = run_plan_quietly(PLAN, url, state_dir, tmp_path / "results")
    print(out)
    assert rc == 0, out
    assert f"kernel switch: aqm -> {uml_72.release} in " in out
    db = open_db(url)
    check_dualpi2_run(db, uml_72.release)
    with db.connect() as conn:
        (run_id,) = conn.execute(text("SELECT run_id FROM run")).scalars().all()
        hellos = evidence(conn, run_id)
    releases = {h: hellos[(h, "hello")]["capabilities"]["kernel_release"] for h in ("client", "aqm", "server")}
    assert releases == {"client": stock, "aqm": uml_72.release, "server": stock}   # only the aqm switched
