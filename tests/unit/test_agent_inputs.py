"""Issue 13, items 2 and 7: what a plan may make a root agent do. Sysctls and modules only from the testbed's
allow-lists (every reported value replayed), and every string that reaches argv or a kernel file typed at the
protocol boundary, so each refusal is a coded error naming the field and never `failed` with a traceback."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from pydantic import ValidationError

from agents.__main__ import parse_args
from agents.host.errors import NotAllowed, StateError
from agents.host.executor import HostStateExecutor
from agents.host.modules import load as load_module
from agents.host.tunables import sysctl_path
from agents.session import AgentSession, Dispatch
from orchestrator.engine.verify import capability_problems
from orchestrator.lab.supervisor import agent_argv
from orchestrator.plan import PlanError, expand, load_plan_text
from schemas import allowlist, handshake, limits, procs, protocol
from schemas.allowlist import DEFAULT_MODULES, DEFAULT_SYSCTL_PREFIXES, module_allowed, sysctl_allowed
from schemas.hoststate import HostState

IFACES = ["to-aqm", "eth0.100"]
REPORTED_SYSCTLS = ["kernel.core_pattern", "kernel.modprobe", "vm.swappiness", "net.ipv6.conf.eth1.forwarding"]
TOKEN = b"secret-token"
MAC = "02:00:00:00:00:01"


# ------------------------------------------------------------------ the allow-lists (pure)

@pytest.mark.parametrize("name", [*REPORTED_SYSCTLS, "fs.suid_dumpable", "dev.tty.ldisc_autoload",
                                  "net.ipv4.conf.all.forwarding", "net.ipv6.conf.default.forwarding",
                                  "net.ipv4.ip_forward_update_priority", "net.ipv4.conf.eth0.100.forwarding",
                                  "net.ipv4.conf.//.//.kernel.core_pattern", "net.core", "net.core.",
                                  "net.ipv4.tcp_ecn\x00", "net.ipv4.tcp_ecn\n", "net.ipv4.tcp_\ud800", ""])
def test_the_default_allow_list_refuses(name):
    assert not sysctl_allowed(name, DEFAULT_SYSCTL_PREFIXES, IFACES)


@pytest.mark.parametrize("name", ["net.ipv4.tcp_ecn", "net.ipv4.tcp_rmem", "net.ipv4.tcp_congestion_control",
                                  "net.core.rmem_max", "net.core.default_qdisc", "net.ipv4.ip_forward",
                                  "net.ipv4.conf.to-aqm.forwarding", "net.ipv6.conf.to-aqm.forwarding",
                                  "net.ipv4.conf.eth0/100.rp_filter"])
def test_the_default_allow_list_holds_what_the_studies_write(name):
    assert sysctl_allowed(name, DEFAULT_SYSCTL_PREFIXES, IFACES)


def test_per_interface_sysctls_only_for_the_agents_interfaces():
    prefixes = allowlist.expand_prefixes(DEFAULT_SYSCTL_PREFIXES, IFACES)
    assert "net.ipv4.conf.eth0/100." in prefixes and "net.ipv6.conf.to-aqm." in prefixes
    assert not any("{interface}" in p for p in prefixes)
    assert not sysctl_allowed("net.ipv4.conf.to-aqm.forwarding", DEFAULT_SYSCTL_PREFIXES, [])
    # the sysctl(8) form names the kernel's directory of an interface with a dot
    assert sysctl_path("net.ipv4.conf.eth0/100.rp_filter") == Path("/proc/sys/net/ipv4/conf/eth0.100/rp_filter")


def test_a_testbed_replaces_or_widens_the_lists_but_never_by_accident():
    assert allowlist.sysctl_prefixes([]) == DEFAULT_SYSCTL_PREFIXES
    assert allowlist.sysctl_prefixes(["net.ipv4.tcp_ecn"]) == ("net.ipv4.tcp_ecn",)
    wider = allowlist.sysctl_prefixes(["default", "kernel.sched_"])
    assert sysctl_allowed("kernel.sched_latency_ns", wider) and sysctl_allowed("net.ipv4.tcp_ecn", wider)
    assert not sysctl_allowed("kernel.core_pattern", wider)
    for bad in ("", "kernel", "*", "net..x", "kernel.core_pattern\n"):
        with pytest.raises(allowlist.AllowListError):
            allowlist.sysctl_prefixes([bad])
    assert allowlist.modules([]) == DEFAULT_MODULES
    assert allowlist.modules(["default", "tcp_mine"])[-1] == "tcp_mine"
    with pytest.raises(allowlist.AllowListError):
        allowlist.modules(["../evil"])


def test_modules():
    assert module_allowed("tcp_dctcp", DEFAULT_MODULES) and module_allowed("sch_dualpi2", DEFAULT_MODULES)
    for name in ("evil", "tcp_dctcp ", "", "Tcp_dctcp", "nf_conntrack"):
        assert not module_allowed(name, DEFAULT_MODULES)


def test_agent_flags_and_the_lab_supervisor_pass_the_lists():
    base = ["--name", "a", "--listen", "unix:/x", "--token-file", "/t", "--artifacts", "/a"]
    args = parse_args([*base, "--allow-sysctl", "default", "--allow-sysctl", "kernel.sched_", "--allow-module", "x"])
    assert args.allow_sysctl == ["default", "kernel.sched_"] and args.allow_module == ["x"]
    with pytest.raises(SystemExit):
        parse_args([*base, "--allow-sysctl", "kernel"])
    host = {"namespace": "ns", "agent": "unix:/s", "interfaces": {"to-aqm": {}},
            "allow_sysctl": ["net.ipv4.tcp_"], "allow_module": ["tcp_bbr"]}
    argv = agent_argv("client", host, "/t", "p")
    assert argv[-6:] == ["--interface", "to-aqm", "--allow-sysctl", "net.ipv4.tcp_", "--allow-module", "tcp_bbr"]
    assert "--allow-sysctl" not in agent_argv("client", {**host, "allow_sysctl": [], "allow_module": []}, "/t", "p")


# ------------------------------------------------------------------ the executor refuses before writing

@pytest.mark.parametrize("state, field", [
    *[({"sysctls": {n: "1"}}, f"state.sysctls.{n}") for n in REPORTED_SYSCTLS],
    ({"sysctls": {"net.ipv4.tcp_ecn": "1", "kernel.core_pattern": "|/tmp/x %p"}}, "state.sysctls.kernel.core_pattern"),
    ({"module_params": {"evil": {"x": "1"}}}, "state.module_params.evil"),
    ({"interfaces": {"lo": {}}}, "state.interfaces.lo"),
])
def test_the_executor_refuses_off_the_lists_naming_the_field(state, field):
    host = HostStateExecutor(IFACES)   # constructing it touches nothing; check_allowed only reads
    with pytest.raises(NotAllowed) as err:
        host.check_allowed(HostState.model_validate(state))
    assert err.value.field == field
    assert not host.touched_sysctls and not host.touched_params


def test_a_chain_tc_cannot_build_is_refused_before_anything_is_written():
    host = HostStateExecutor(IFACES)
    two_leaves = [{"kind": "pfifo", "limit_packets": 10}, {"kind": "pfifo", "limit_packets": 10}]
    with pytest.raises(StateError, match="cannot have a child qdisc") as err:
        host.check_allowed(HostState.model_validate({"interfaces": {"to-aqm": {"qdiscs": two_leaves}}}))
    assert err.value.field == "state.interfaces.to-aqm.qdiscs" and not isinstance(err.value, NotAllowed)


def test_a_narrower_testbed_list_is_what_the_executor_enforces():
    host = HostStateExecutor(IFACES, sysctl_prefixes=["net.ipv4.tcp_ecn"], modules=["tcp_cubic"])
    host.check_allowed(HostState(sysctls={"net.ipv4.tcp_ecn": "1"}, module_params={"tcp_cubic": {"beta": "700"}}))
    with pytest.raises(NotAllowed, match="--allow-sysctl"):
        host.check_allowed(HostState(sysctls={"net.ipv4.tcp_sack": "1"}))
    with pytest.raises(NotAllowed, match="--allow-module"):
        host.check_allowed(HostState(module_params={"tcp_dctcp": {"dctcp_shift_g": "4"}}))


def test_a_missing_tool_is_one_line_naming_tool_and_host():
    with pytest.raises(procs.ToolMissing) as err:
        procs.run(["tcplab-no-such-tool", "-V"])
    assert str(err.value).startswith("tcplab-no-such-tool not found on host ")
    assert isinstance(err.value, procs.CommandFailed)   # the executors turn it into a coded `failed`


def test_a_missing_modprobe_is_a_state_error_naming_the_module(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))   # a host without modprobe (an empty PATH)
    with pytest.raises(StateError) as err:
        load_module("tcp_tcplab_absent", {}, [])
    assert "module tcp_tcplab_absent is not loaded and cannot be: modprobe not found on host" in str(err.value)
    assert err.value.field == "state.module_params.tcp_tcplab_absent"


# ------------------------------------------------------------------ the protocol boundary

def _session() -> AgentSession:
    s = AgentSession(TOKEN)
    assert isinstance(s.receive(json.dumps({"id": 1, "op": "hello", "args": {
        "client": "t", "nonce": "ab" * 32, "hmac": handshake.manager_proof(TOKEN, s.nonce_hex, "ab" * 32)}})),
        Dispatch)
    return s


def _reply(frame: str) -> dict:
    out = _session().receive(frame)
    assert isinstance(out, str), f"dispatched: {out}"
    return json.loads(out)["error"]


def _apply(state: dict) -> str:
    return json.dumps({"id": 2, "op": "apply", "args": {"run_id": "r1", "state": state}})


def _neighbour(addr: str, mac: str = MAC) -> str:
    return _apply({"interfaces": {"to-aqm": {"neighbours": {addr: mac}}}})


@pytest.mark.parametrize("addr", ["help", "dev", "proxy", "to", "-R", "10.0.0.256", "1.2.3", "fe80::1%eth0",
                                  "dead::beef::1", "", "10.0.0.1 lladdr"])
def test_neighbour_addresses_that_ip_would_parse_as_keywords_are_invalid_args(addr):
    err = _reply(_neighbour(addr))
    assert err["code"] == "invalid_args"
    assert err["field"].startswith("state.interfaces.to-aqm.neighbours.")


@pytest.mark.parametrize("mac", ["02:00:00:00:00:0\x00", "02:00:00:00:00", "02-00-00-00-00-01", "help",
                                 "02:00:00:00:00:01 nud"])
def test_macs_are_six_hex_octets(mac):
    err = _reply(_neighbour("10.0.0.1", mac))
    assert err["code"] == "invalid_args" and err["field"] == "state.interfaces.to-aqm.neighbours.10.0.0.1"


def test_valid_neighbours_are_canonical_for_the_read_back():
    state = HostState.model_validate({"interfaces": {"to-aqm": {"neighbours": {"FE80:0::1": "02:AB:00:00:00:01"}}}})
    assert state.interfaces["to-aqm"].neighbours == {"fe80::1": "02:ab:00:00:00:01"}


# JSON frames carry lone surrogates as escapes; json.loads turns them into str that cannot be encoded
@pytest.mark.parametrize("frame, field", [
    ('{"id": 2, "op": "apply", "args": {"run_id": "r1", "state": {"sysctls": {"net.ipv4.tcp_ecn": "\\ud800"}}}}',
     "state.sysctls.net.ipv4.tcp_ecn"),
    ('{"id": 2, "op": "apply", "args": {"run_id": "r1", "state": {"module_params": {"tcp_cubic": '
     '{"beta": "7\\udfff"}}}}}', "state.module_params.tcp_cubic.beta"),
    (_apply({"sysctls": {"net.ipv4.tcp_ecn": "1\x00"}}), "state.sysctls.net.ipv4.tcp_ecn"),
    (_apply({"sysctls": {"net.ipv4.tcp_ecn": "1\n2"}}), "state.sysctls.net.ipv4.tcp_ecn"),
    (_apply({"sysctls": {"net.ipv4.tcp_rmem": "4096 " * 300}}), "state.sysctls.net.ipv4.tcp_rmem"),
    (_apply({"sysctls": {"net.ipv4.tcp_ecn": ""}}), "state.sysctls.net.ipv4.tcp_ecn"),
    (_apply({"sysctls": {"net.ipv4.tcp_ecn\n": "1"}}), "state.sysctls.net.ipv4.tcp_ecn\n.[key]"),
    (_apply({"module_params": {"tcp_cubic": {"beta": "\x1b[2J"}}}), "state.module_params.tcp_cubic.beta"),
    (_apply({"module_params": {"tcp_cubic": {"../../x": "1"}}}), "state.module_params.tcp_cubic.../../x.[key]"),
    (_apply({"module_params": {"../evil": {"x": "1"}}}), "state.module_params.../evil.[key]"),
    (_apply({"interfaces": {"-x": {}}}), "state.interfaces.-x.[key]"),
    (_apply({"interfaces": {"to-aqm": {"offloads": {"help": True}}}}), "state.interfaces.to-aqm.offloads.help.[key]"),
    (_apply({"interfaces": {"to-aqm": {"coalesce": {"rx-usecs": -1}}}}), "state.interfaces.to-aqm.coalesce.rx-usecs"),
])
def test_strings_that_cannot_reach_a_kernel_file_or_argv_are_invalid_args(frame, field):
    err = _reply(frame)
    assert err["code"] == "invalid_args" and err["field"].startswith(field), err


def _client_task(**over) -> dict:
    return {"kind": "iperf3_client", "task_id": "c0", "start_ns": 1, "port": 5201, "dst_addr": "10.0.0.1",
            "cc": "cubic", "duration_s": 1, **over}


@pytest.mark.parametrize("over, field", [
    ({"dst_addr": "-R"}, "tasks.0.dst_addr"), ({"dst_addr": "help"}, "tasks.0.dst_addr"),
    ({"dst_addr": "example.org"}, "tasks.0.dst_addr"), ({"dst_addr": "10.0.0.1\x00"}, "tasks.0.dst_addr"),
    ({"udp_rate_bit": limits.MAX_UDP_RATE_BIT + 1}, "tasks.0.udp_rate_bit"),
    ({"udp_rate_bit": 0}, "tasks.0.udp_rate_bit"),
])
def test_iperf3_destinations_are_addresses_and_udp_rates_bounded(over, field):
    err = _reply(json.dumps({"id": 2, "op": "schedule", "args": {"run_id": "r1", "tasks": [_client_task(**over)]}}))
    assert err["code"] == "invalid_args" and err["field"] == field, err
    assert protocol.Iperf3ClientTask.model_validate(_client_task(udp_rate_bit=limits.MAX_UDP_RATE_BIT)).udp_rate_bit


def test_capture_interfaces_cannot_be_options():
    with pytest.raises(ValidationError):
        protocol.CaptureTask(task_id="c", start_ns=1, stop_ns=2, interface="-w/etc/passwd")


# ------------------------------------------------------------------ the manager and the plan refuse first

PLAN = """
name: inputs
roles: [sender, aqm, receiver]
run:
  duration: 5s
  bottleneck: {at: {host: aqm, toward: receiver}, rate: 100mbit, queue: {kind: pfifo, limit: 100}}
  traffic: {src: sender, dst: receiver, cc: reno, flows: 1}
  hosts:
    sender:
HOSTS"""


def _caps(**over) -> protocol.Capabilities:
    return protocol.Capabilities(kernel_release="6.18.1", qdiscs=["htb", "pfifo"], congestion_controls=["reno"],
                                 allowed_congestion_controls=["reno"], offload_features={}, tools={},
                                 tracepoints=[], **over)


def test_preflight_refuses_sysctls_and_modules_off_an_agents_lists_before_any_host_is_touched():
    hosts = "      sysctls: {net.ipv6.conf.eth1.forwarding: 1, net.ipv4.tcp_ecn: 1}\n" \
            "      module_params: {evil: {x: 1}, tcp_cubic: {beta: 700}}\n"
    (run,) = expand(load_plan_text(PLAN.replace("HOSTS", hosts), "inputs.yaml"))
    agent = allowlist.expand_prefixes(DEFAULT_SYSCTL_PREFIXES, ["to-aqm"])
    caps = {r: _caps(allowed_sysctl_prefixes=agent) for r in ("sender", "aqm", "receiver")}
    problems = capability_problems(run, caps)
    assert [p for p in problems if "allow-list" in p] == [
        f"host sender: {allowlist.module_refusal('evil', DEFAULT_MODULES)}",
        f"host sender: {allowlist.sysctl_refusal('net.ipv6.conf.eth1.forwarding', agent)}"]
    # a RunSpec stored before the plan check (or written by hand) with kernel.core_pattern: refused the same way
    sender = run.hosts["sender"].model_copy(update={"sysctls": {"kernel.core_pattern": "|/tmp/x %p"},
                                                    "module_params": {}})
    bad = run.model_copy(update={"hosts": {**run.hosts, "sender": sender}})
    assert [p for p in capability_problems(bad, caps) if "allow-list" in p] == [
        f"host sender: {allowlist.sysctl_refusal('kernel.core_pattern', agent)}"]
    # an agent older than the lists reports none: the manager assumes the defaults
    assert _caps().allowed_modules == list(DEFAULT_MODULES)


@pytest.mark.parametrize("name", ["kernel.core_pattern", "kernel.modprobe", "vm.swappiness"])
def test_the_plan_validator_refuses_sysctls_outside_net_with_file_and_line(name):
    with pytest.raises(PlanError) as err:
        load_plan_text(PLAN.replace("HOSTS", f"      sysctls: {{{name}: 1}}\n"), "inputs.yaml")
    assert f"inputs.yaml:10:17: run.hosts.sender.sysctls['{name}']: sysctl {name} is outside `net.`" in str(err.value)
