"""What a run of a `dualpi2` plan must show, on whichever lab ran it (the VM lab's Debian 7.2 aqm guest with
sch_dualpi2.ko built for it, tests/lab/test_dualpi2_plan.py; the UML lab's aqm restarted on the project's UML
7.2 build, tests/lab/test_uml_dualpi2.py). The plans are experiments/vm/dualpi2.yaml and
experiments/kernels/uml-7.2.yaml: netem 10 ms -> htb 10 Mbit/s -> dualpi2 with every option written out, one
classic flow (cubic, ECN: ECT(0), the C queue) from the server.

Checked from the stored data: the run is complete and every host reset exactly; the aqm's hello reports the
release and `dualpi2`; the apply evidence holds the kernel's dump of the options as the plan asked them
(alpha/beta as the kernel rounds them); the classic flow's packets were CE-marked or dropped in the queue
(paired captures on both sides of the aqm) and its queue delay sits near the 15 ms target; the qdisc stats
artifact carries dualpi2's xstats (the classic queue saw the packets, the L queue none)."""
from __future__ import annotations

import json

from sqlalchemy import text

from schemas import protocol
from schemas.qdiscs import dualpi2_netlink as dn
from tests.lab.study_module_checks import evidence

# the plans' options as the kernel's dump shows them: alpha 0.16 Hz and beta 3.2 Hz are sent as 41 and 819
# (1/256 Hz) and kept as 40 and 818 (sch_dualpi2.c scales them and back, rounding down both ways)
AS_ASKED = {"limit_packets": 1000, "target_us": 15000, "tupdate_us": 16000, "alpha": 40, "beta": 818,
            "step_thresh_us": 1000, "coupling_factor": 2, "ecn_mask": "l4s_ect", "split_gso": True}
ECT0 = 2
TARGET_MS = 15


def check_dualpi2_run(engine, aqm_release: str) -> protocol.Capabilities:
    """The one run of a dualpi2 plan in `engine`'s DB (module docstring); returns the aqm's hello."""
    with engine.connect() as conn:
        (run,) = conn.execute(text("SELECT run_id, run_key, status FROM run")).all()
        assert run.status == "complete", run
        ev = evidence(conn, run.run_id)
        caps = protocol.Capabilities.model_validate(ev[("aqm", "hello")]["capabilities"])
        assert caps.kernel_release == aqm_release and "dualpi2" in caps.qdiscs
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
        assert 5 < ms[len(ms) // 2] < 3 * TARGET_MS     # the PI holds the classic queue near its target
        # the qdisc stats artifact: the poller decoded dualpi2's xstats (the last sample)
        (meta,) = conn.execute(text("SELECT meta FROM artifact WHERE run_id = :r AND host = 'aqm' AND kind = "
                                    "'qdisc_stats'"), {"r": run.run_id}).scalars().all()
        meta = json.loads(meta) if isinstance(meta, str) else meta
        xstats = meta["xstats"]["3:"]
        print(f"xstats: {xstats}")
        assert set(dn.XSTATS_FIELDS) <= set(xstats)
        assert xstats["packets_in_c"] > 1000 and xstats["packets_in_l"] == 0
        assert xstats["ecn_mark"] > 0 or dropped > 0
    return caps
