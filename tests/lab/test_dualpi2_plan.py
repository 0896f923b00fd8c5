"""A plan's `dualpi2` stage through the agent (`tcplab run experiments/vm/dualpi2.yaml`).

The VM lab boots the aqm guest on Debian's 7.2 kernel with sch_dualpi2.ko built for it (`vm.up(kernel=...,
modules=("sch_dualpi2",))`: the aqm's agent gets the build directory as --module-dir). The agent's probe loads
the module, adds the qdisc to a scratch veth and unloads it, so the hello reports `dualpi2`; apply loads the
module, builds netem -> htb by tc and dualpi2 by netlink (iproute2 6.1 knows no dualpi2) and reads the kernel's
dump back, option by option. One classic flow (cubic, ECN: ECT(0), the C queue) runs from the server namespace.

Checked from the stored data: the run is complete and every host reset exactly; the apply evidence holds the
kernel's dump of the options as the plan asked them (alpha/beta as the kernel rounds them); the classic flow's
packets were CE-marked or dropped in the queue (paired captures on both sides of the aqm); the qdisc stats
artifact carries dualpi2's xstats (the classic queue saw the packets, the L queue none).

Needs root, QEMU, busybox-static, gcc, make and Debian's archive (unstable for the 7.2 packages); skips naming
what is missing. The lab uses its own state dir and prefix and always goes down.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from sqlalchemy import text

from orchestrator.plan import expand, load_plan
from schemas import protocol
from schemas.qdiscs import dualpi2_netlink as dn
from tests.lab.conftest import TEST_PREFIX, build_guest_module, run_lab_plan, vm_lab_up, vm_unavailable

KERNEL = "linux-image-7.2.13+deb14-amd64"
PREFIX = f"{TEST_PREFIX}dq"[:12]
PLAN = Path(__file__).resolve().parents[2] / "experiments" / "vm" / "dualpi2.yaml"
MODULE = "sch_dualpi2"
# the plan's options as the kernel's dump shows them: alpha 0.16 Hz and beta 3.2 Hz are sent as 41 and 819
# (1/256 Hz) and kept as 40 and 818 (sch_dualpi2.c scales them and back, rounding down both ways)
AS_ASKED = {"limit_packets": 1000, "target_us": 15000, "tupdate_us": 16000, "alpha": 40, "beta": 818,
            "step_thresh_us": 1000, "coupling_factor": 2, "ecn_mask": "l4s_ect", "split_gso": True}
ECT0, CE = 2, 3


@pytest.fixture(scope="module")
def dualpi2_plan_lab(tmp_path_factory):
    if reason := vm_unavailable():  # before building: the build writes to the root-owned cache
        pytest.skip(reason)
    build_guest_module(MODULE, KERNEL, ("make", "gcc", "modinfo", "dpkg-deb", "apt-get", "tar", "xz"), 900)
    yield from vm_lab_up(tmp_path_factory, PREFIX, ("aqm",), timeout_s=300, kernel=KERNEL, modules=(MODULE,))


def evidence(conn, run_id: str) -> dict:
    return {(e.host, e.phase): json.loads(e.data) if isinstance(e.data, str) else e.data
            for e in conn.execute(text("SELECT host, phase, data FROM host_evidence WHERE run_id = :r"),
                                  {"r": run_id})}


def test_the_plan_asks_for_what_the_test_expects():
    (spec,) = expand(load_plan(PLAN))
    stage = spec.hosts["aqm"].qdiscs["client"][-1]
    assert dn.held_options(stage) == AS_ASKED


def test_a_dualpi2_plan_runs_through_the_agent(dualpi2_plan_lab, tmp_path):
    inv, state_dir = dualpi2_plan_lab
    release = inv["vm"]["release"]
    assert inv["vm"]["modules"][MODULE]["vermagic"].startswith(release + " ")
    engine = run_lab_plan(PLAN, state_dir, tmp_path)
    with engine.connect() as conn:
        (run,) = conn.execute(text("SELECT run_id, run_key, status FROM run")).all()
        assert run.status == "complete", run
        ev = evidence(conn, run.run_id)
        # the hello: the aqm's agent can create dualpi2 (it loaded the module for the probe)
        caps = protocol.Capabilities.model_validate(ev[("aqm", "hello")]["capabilities"])
        assert caps.kernel_release == release and "dualpi2" in caps.qdiscs and MODULE in caps.loadable_modules
        # the apply: the kernel's own dump of the options, decoded, as the plan asked them
        aqm = protocol.Readback.model_validate(ev[("aqm", "apply")])
        raws = aqm.interfaces["to-client"].raw_qdiscs
        (raw,) = [r for r in raws if r["kind"] == "dualpi2"]
        assert (raw["handle"], raw["parent"]) == ("3:", "2:1")
        shown = dn.decode_options(bytes.fromhex(raw["options_hex"]))
        print(f"read back: {shown}")
        assert {k: shown[k] for k in AS_ASKED} == AS_ASKED
        assert all(ev[(h, "reset")]["restored"] is True for h in ("client", "aqm", "server")), ev
        # the packets: the classic flow arrives as ECT(0) and is marked (or dropped) in the queue
        rows = conn.execute(text(
            "SELECT q.ce, q.dropped, q.sojourn_ns FROM qdelay q JOIN conn c ON c.run_key = q.run_key AND "
            "c.conn_id = q.conn_id WHERE q.run_key = :k AND c.proto = 6 AND q.payload_len > 0"),
            {"k": run.run_key}).all()
        ecn_in = conn.execute(text(
            "SELECT p.ecn, count(*) AS n FROM packet p JOIN conn c ON c.run_key = p.run_key AND "
            "c.conn_id = p.conn_id WHERE p.run_key = :k AND p.payload_len > 0 AND c.point = "
            "(SELECT ingress FROM qdelay_pair WHERE run_id = :r) GROUP BY p.ecn"),
            {"k": run.run_key, "r": run.run_id}).all()
        ce, dropped = sum(r.ce for r in rows), sum(r.dropped for r in rows)
        ms = sorted(r.sojourn_ns / 1e6 for r in rows if r.sojourn_ns is not None)
        print(f"classic data packets {len(rows)}: CE {ce}, dropped {dropped}, ECN at ingress {dict(ecn_in)}, "
              f"queue delay p50 {ms[len(ms) // 2]:.2f} ms, p99 {ms[len(ms) * 99 // 100]:.2f} ms")
        assert len(rows) > 1000
        assert dict(ecn_in).get(ECT0, 0) >= 0.99 * sum(n for _, n in ecn_in)
        assert ce + dropped > 0
        assert 5 < ms[len(ms) // 2] < 3 * 15     # the PI holds the classic queue near its 15 ms target
        # the qdisc stats artifact: the poller decoded dualpi2's xstats (the last sample)
        (meta,) = conn.execute(text("SELECT meta FROM artifact WHERE run_id = :r AND host = 'aqm' AND kind = "
                                    "'qdisc_stats'"), {"r": run.run_id}).scalars().all()
        meta = json.loads(meta) if isinstance(meta, str) else meta
        xstats = meta["xstats"]["3:"]
        print(f"xstats: {xstats}")
        assert set(dn.XSTATS_FIELDS) <= set(xstats)
        assert xstats["packets_in_c"] > 1000 and xstats["packets_in_l"] == 0
        assert xstats["ecn_mark"] > 0 or dropped > 0
