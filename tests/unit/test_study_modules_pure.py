"""The study modules in plans, without a kernel: the agent's load argv (pure), where a plan that needs them is
refused and why, the journal of the modules apply loaded, and the read-back of a mark stage."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from agents.host import baseline
from agents.host.errors import StateError
from agents.host.modules import builtin_modules, load_argv, loadable, module_file, param_words, unload_argv
from orchestrator.engine.verify import capability_problems, readback_differences, stage_differences
from orchestrator.plan import expand, load_plan
from schemas import protocol
from schemas.hoststate import HostState, InterfaceState
from schemas.qdiscs import Mark, mark_netlink
from tests.unit.test_aqm_mark_pure import DUMP_EST_X86

ROOT = Path(__file__).resolve().parents[2]
PLAN = ROOT / "experiments" / "vm" / "mark.yaml"


def test_load_argv_insmods_the_agents_file_else_modprobes(tmp_path: Path) -> None:
    ko = tmp_path / "tcp_dctcp_flaws.ko"
    ko.write_bytes(b"\x7fELF")
    (tmp_path / "tcp_evil.ko").write_bytes(b"")
    assert module_file("tcp_dctcp_flaws", [tmp_path / "none", tmp_path]) == ko
    assert loadable([tmp_path], ["tcp_dctcp_flaws", "sch_aqm_mark"]) == ["tcp_dctcp_flaws"]   # allow-listed only
    assert load_argv("tcp_dctcp_flaws", {"dctcp_shift_g": "10", "alpha_bits": "20"}, ko) == [
        "insmod", str(ko), "alpha_bits=20", "dctcp_shift_g=10"]
    assert load_argv("tcp_dctcp_flaws", {}, None) == ["modprobe", "tcp_dctcp_flaws"]
    assert unload_argv("sch_aqm_mark") == ["rmmod", "sch_aqm_mark"]


def test_a_built_in_module_is_read_from_modules_builtin() -> None:
    # lines of a tcplab kernel build's modules.builtin (CONFIG_NET_SCH_DUALPI2=y): such a module is never loaded
    text = "kernel/net/sched/sch_dualpi2.ko\nkernel/net/ipv4/tcp_cubic.ko\nkernel/drivers/net/dummy-x.ko\n\n"
    assert builtin_modules(text) == {"sch_dualpi2", "tcp_cubic", "dummy_x"}
    assert builtin_modules("") == set()


@pytest.mark.parametrize("value", ["1 2", "a\tb", '"x"', "x'", "a\\b", "", "é", "x" * 257])
def test_a_parameter_value_is_one_plain_token(value: str) -> None:
    with pytest.raises(StateError) as err:
        param_words("tcp_dctcp_flaws", {"dctcp_shift_g": value})
    assert err.value.field == "state.module_params.tcp_dctcp_flaws.dctcp_shift_g"


def test_names_are_checked_before_they_reach_a_command() -> None:
    with pytest.raises(StateError):
        load_argv("../tcp_x", {}, None)
    with pytest.raises(StateError):
        param_words("tcp_x", {"a=b": "1"})
    assert param_words("tcp_x", {"beta": "850", "flag": "Y", "list": "1,2,3"}) == ["beta=850", "flag=Y", "list=1,2,3"]


def test_the_journal_keeps_the_modules_apply_loaded() -> None:
    b = baseline.Baseline("boot", baseline.Snapshot(), loaded_modules=["sch_aqm_mark", "tcp_dctcp_flaws"])
    assert baseline.from_json(baseline.to_json(b)).loaded_modules == ["sch_aqm_mark", "tcp_dctcp_flaws"]


def caps(release: str, qdiscs: list[str], ccs: list[str], loadable_modules: list[str]) -> protocol.Capabilities:
    return protocol.Capabilities(kernel_release=release, qdiscs=qdiscs, congestion_controls=ccs,
                                 allowed_congestion_controls=ccs, offload_features={}, tools={"iperf3": "3.12"},
                                 tracepoints=["tcp:tcp_probe"], loadable_modules=loadable_modules)


NETNS = ["bfifo", "htb", "pfifo", "tbf"]
GUEST = ["bfifo", "codel", "fq", "fq_codel", "htb", "mark", "netem", "pfifo", "red", "tbf"]


def test_the_mark_plan_is_refused_on_the_netns_lab_naming_host_kernel_and_module() -> None:
    specs = expand(load_plan(PLAN))
    netns = {r: caps("6.18.1", NETNS, ["reno", "cubic", "bbr"], []) for r in ("client", "aqm", "server")}
    for spec in specs:
        problems = capability_problems(spec, netns)
        assert ("host aqm (kernel 6.18.1) lacks qdisc mark (module sch_aqm_mark: not loaded, and not in the module "
                "directories of this host's agent, --module-dir)") in problems
        assert any("netem" in p for p in problems)
        if spec.flows[0].cc == "dctcp_flaws":
            lacks = "host server (kernel 6.18.1) lacks congestion control dctcp_flaws"
            assert any(p.startswith(lacks) for p in problems)


def test_the_mark_plan_fits_the_vm_lab_whose_server_can_load_the_cc() -> None:
    specs = expand(load_plan(PLAN))
    guest = ["reno", "cubic", "dctcp"]
    vm = {"client": caps("6.18.1", NETNS, ["reno", "cubic", "bbr"], []),
          "aqm": caps("6.1.0-56-amd64", GUEST, guest, ["sch_aqm_mark", "tcp_dctcp_flaws"]),
          "server": caps("6.1.0-56-amd64", GUEST, guest, ["sch_aqm_mark", "tcp_dctcp_flaws"])}
    assert [capability_problems(s, vm) for s in specs] == [[]] * 4
    # the cc is there only because the plan loads its module on the sender: without module_params it is refused
    spec = specs[1].model_copy(update={"hosts": {**specs[1].hosts, "server": specs[1].hosts["server"].model_copy(
        update={"module_params": {}})}})
    (problem,) = capability_problems(spec, vm)
    assert problem.endswith("its module tcp_dctcp_flaws is loadable there: load it with "
                            "hosts.server.module_params.tcp_dctcp_flaws")


def _mark_readback(options_hex: str | None) -> protocol.InterfaceReadback:
    q = {"kind": "aqm_mark", "handle": "1:", "root": True, "options": {}}
    raw = [{"handle": "1:", "parent": "root", "kind": "aqm_mark", "options_hex": options_hex, "xstats_hex": ""}]
    return protocol.InterfaceReadback(tc_qdisc=[q], tc_class_text="", htb_classes=[], features={},
                                      raw_qdiscs=raw if options_hex is not None else [])


def test_a_mark_stage_is_compared_with_the_kernels_dump() -> None:
    stage = Mark(mode="step", metric="est", min_ns=2_000_000, limit_packets=1000)
    assert stage_differences("to-client", 0, stage, _mark_readback(DUMP_EST_X86.hex())) == []
    other = mark_netlink.encode_options("step", "est", 3_000_000, None, 1000).hex()
    assert stage_differences("to-client", 0, stage, _mark_readback(other)) == [
        "to-client qdisc 1:: min_ns 3000000 != 2000000 ns"]
    missing = stage_differences("to-client", 0, stage, _mark_readback(None))
    assert "to-client qdisc 1:: no netlink read-back of its options" in missing


def test_module_parameters_read_back_must_equal_the_plan() -> None:
    want = HostState(module_params={"tcp_dctcp_flaws": {"dctcp_shift_g": "10", "prr": "0"}},
                     interfaces={"to-aqm": InterfaceState()})
    rb = protocol.Readback(kernel_release="6.1.0-56-amd64", sysctls={}, interfaces={},
                           module_params={"tcp_dctcp_flaws": {"dctcp_shift_g": "4", "prr": "0"}})
    assert "module parameter tcp_dctcp_flaws.dctcp_shift_g: '4' != '10'" in readback_differences(want, rb)


def test_tc_json_of_a_qdisc_tc_does_not_know_parses() -> None:
    from agents.host.readback import parse_tc_qdisc_json
    text = (ROOT / "tests" / "fixtures" / "tc" / "netem_aqm_mark.json").read_text()   # tc 6.1 in the aqm guest
    with pytest.raises(ValueError):
        json.loads(text)
    netem, mark = parse_tc_qdisc_json(text)
    assert (netem["kind"], netem["options"]["limit"]) == ("netem", 1000)
    assert (mark["kind"], mark["handle"], mark["parent"], mark["options"]) == ("aqm_mark", "2:", "1:1", {})


def test_the_poller_decodes_aqm_mark_xstats_as_pyroute2_shows_them() -> None:
    from schemas.qdiscs import decoded_xstats
    shown = ":".join(f"{b:02x}" for b in bytes.fromhex("0a00000000000000" "0300000000000000" "0100000000000000"
                                                       "0200000000000000" "40420f0000000000"))
    assert decoded_xstats("aqm_mark", shown) == {"packets": 10, "marked": 3, "dropped": 1, "not_ect": 2,
                                                 "drain_rate": 1_000_000}
    assert decoded_xstats("htb", shown) is None and decoded_xstats("aqm_mark", None) is None
