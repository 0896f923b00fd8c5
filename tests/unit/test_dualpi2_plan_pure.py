"""A plan's `dualpi2` stage without a kernel: where experiments/vm/dualpi2.yaml is refused and where it fits, the
read-back of the stage against the Debian 7.2 guest kernel's literal dump, the poller's decoding of dualpi2's
xstats as pyroute2 shows them, and which module the agent's probe loads for it."""
from __future__ import annotations

from pathlib import Path

from agents.host.capabilities import own_module_loads
from agents.host.readback import RAW_KINDS, raw_readback
from orchestrator.engine.verify import capability_problems, stage_differences
from orchestrator.plan import expand, load_plan
from schemas import protocol
from schemas.qdiscs import KINDS, decoded_xstats
from schemas.qdiscs import dualpi2_netlink as dn
from tests.unit.test_dualpi2_pure import GUEST_DUMP, GUEST_XSTATS
from tests.unit.test_study_modules_pure import NETNS, caps

ROOT = Path(__file__).resolve().parents[2]
PLAN = ROOT / "experiments" / "vm" / "dualpi2.yaml"
GUEST_72 = ["bfifo", "codel", "dualpi2", "fq", "fq_codel", "htb", "netem", "pfifo", "red", "tbf"]


def test_the_dualpi2_plan_is_refused_on_the_netns_lab_naming_host_kernel_and_module() -> None:
    (spec,) = expand(load_plan(PLAN))
    netns = {r: caps("6.18.1", NETNS, ["reno", "cubic", "bbr"], []) for r in ("client", "aqm", "server")}
    problems = capability_problems(spec, netns)
    assert ("host aqm (kernel 6.18.1) lacks qdisc dualpi2 (module sch_dualpi2: not loaded, and not in the module "
            "directories of this host's agent, --module-dir)") in problems
    assert "host aqm (kernel 6.18.1) lacks qdisc netem" in problems


def test_the_dualpi2_plan_fits_a_72_guest_whose_agent_can_load_the_module() -> None:
    (spec,) = expand(load_plan(PLAN))
    hosts = {"client": caps("6.18.1", NETNS, ["reno", "cubic", "bbr"], []),
             "aqm": caps("7.2.13+deb14-amd64", GUEST_72, ["reno", "cubic"], ["sch_dualpi2"]),
             "server": caps("6.18.1", NETNS, ["reno", "cubic", "bbr"], [])}
    assert capability_problems(spec, hosts) == []


def _readback(options_hex: str | None) -> protocol.InterfaceReadback:
    # tc 6.1 in the guest prints the qdisc with its options removed (readback.parse_tc_qdisc_json)
    q = {"kind": "dualpi2", "handle": "3:", "parent": "2:1", "options": {}}
    raw = [{"handle": "3:", "parent": "2:1", "kind": "dualpi2", "options_hex": options_hex, "xstats_hex": ""}]
    return protocol.InterfaceReadback(tc_qdisc=[q], tc_class_text="", htb_classes=[], features={},
                                      raw_qdiscs=raw if options_hex is not None else [])


def test_the_plans_stage_is_compared_with_the_kernels_dump() -> None:
    (spec,) = expand(load_plan(PLAN))
    stage = spec.hosts["aqm"].qdiscs["client"][-1]
    assert (stage.alpha, stage.beta) == (41, 819)           # 0.16 Hz and 3.2 Hz in 1/256 Hz
    # the guest's dump of the kernel's defaults, limit 1000: alpha and beta read 40 and 818 -- as asked
    assert stage_differences("to-client", 2, stage, _readback(GUEST_DUMP.hex())) == []
    held = {k: dn.kernel_holds(k, v) for k, v in dn.values_for(stage).items()}   # what the kernel dumps
    assert dn.encode(held) != dn.encode(dn.values_for(stage))
    other = dn.encode({**held, dn.COUPLING: 3, dn.ALPHA: 81}).hex()
    assert stage_differences("to-client", 2, stage, _readback(other)) == [
        "to-client qdisc 3:: alpha 81 != 40 (as the kernel rounds it)", "to-client qdisc 3:: coupling_factor 3 != 2"]
    assert "to-client qdisc 3:: no netlink read-back of its options" in stage_differences(
        "to-client", 2, stage, _readback(None))


def test_the_agent_reads_dualpi2_back_over_netlink_and_decodes_its_xstats() -> None:
    assert {"aqm_mark", "dualpi2"} <= RAW_KINDS
    shown = ":".join(f"{b:02x}" for b in GUEST_XSTATS)     # pyroute2 shows a kind it does not know as hex
    xs = decoded_xstats("dualpi2", shown)
    assert (xs["packets_in_c"], xs["packets_in_l"], xs["ecn_mark"], xs["step_marks"]) == (12755, 6250, 3868, 2406)


def test_the_probe_loads_sch_dualpi2_from_the_module_directories(tmp_path: Path) -> None:
    assert KINDS["dualpi2"].module == "sch_dualpi2" and KINDS["dualpi2"].probe == ("dualpi2",)
    (tmp_path / "sch_dualpi2.ko").write_bytes(b"\x7fELF")
    assert own_module_loads([tmp_path], ["sch_dualpi2", "sch_aqm_mark"]) == ["sch_dualpi2"]
    assert own_module_loads([tmp_path], ["sch_aqm_mark"]) == []     # not allow-listed: not loaded, not probed
    assert own_module_loads([], ["sch_dualpi2"]) == []


def test_the_read_back_keeps_the_kernels_bytes_of_a_dump_entry() -> None:
    # an entry as rawqdisc.dump returns it (the guest's, after apply): its counters are not the read-back's
    dumped = {"handle": "3:", "parent": "2:1", "kind": "dualpi2", "options_hex": GUEST_DUMP.hex(),
              "xstats_hex": GUEST_XSTATS.hex(),
              "stats": {"packets": 0, "drop": 0, "overlimits": 0, "qlen": 0, "backlog": 0}}
    (kept,) = raw_readback([dumped])
    assert kept == {k: v for k, v in dumped.items() if k != "stats"}
    irb = protocol.InterfaceReadback(tc_qdisc=[], tc_class_text="", htb_classes=[], features={}, raw_qdiscs=[kept])
    assert irb.raw_qdiscs[0]["options_hex"] == GUEST_DUMP.hex()
