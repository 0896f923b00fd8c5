"""Ansible INI inventories: read by Ansible's own loader, mapped to the same Inventory the labs write."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.inventory import Inventory, InventoryError, load_inventory
from orchestrator.inventory_ini import IniHost, IniVarError, inventory_from_hosts, to_ini, without_lab_bookkeeping
from orchestrator.lab.netns import inventory_dict
from orchestrator.lab.topology import netns_topology

REPO_INI = Path(__file__).resolve().parents[2] / "inventory.ini"
ANSIBLE_INVENTORY = Path(sys.executable).parent / "ansible-inventory"

# a small physical testbed as a user writes it: role groups, a parent group, vars in three places
SMALL = """\
[manager]
mgr ansible_host=192.0.2.10

[client]
c1 agent_url=tcp://192.0.2.13:7717 data_ifaces='{"aqm": {"dev": "eth1", "addr": "198.51.100.1/24", "peer": "198.51.100.254"}}'

[aqm]
a1 agent_url=tcp://192.0.2.12:7717 allow_module=sch_dualpi2,tcp_prague data_ifaces='{"client": {"dev": "eth1", "addr": "198.51.100.254/24", "peer": "198.51.100.1", "mac": "00:00:5e:00:53:02"}}'

[testbed:children]
client
aqm

[testbed:vars]
allow_sysctl=net.ipv4.tcp_,net.core.

[all:vars]
tcplab_token_file=/etc/tcplab/token
tcplab_tls_ca=/etc/tcplab/ca.pem
"""  # noqa: E501 - an INI host line carries all its variables


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "inventory.ini"
    path.write_text(text)
    return path


def _lab_inventory(prefix: str = "tcplabx") -> Inventory:
    topo = netns_topology(prefix)
    macs = {(role, ep.ifname): f"02:00:00:00:0{i}:0{j}" for i, role in enumerate(topo.roles)
            for j, ep in enumerate(topo.endpoints(role))}
    doc = inventory_dict(topo, "netns", Path("/run/tcplab/token"), macs,
                         {r: f"unix:/run/tcplab/agent-{r}.sock" for r in topo.roles},
                         {r: topo.namespace(r) for r in topo.roles})
    return Inventory.model_validate({**doc, "supervisor_pid": 4242})


def _toward_graph(inv: Inventory) -> set[tuple[str, str]]:
    return {(role, i.toward) for role, host in inv.hosts.items() for i in host.interfaces.values()}


def test_the_repos_inventory_ini_maps_to_the_same_roles_and_links_as_the_netns_lab():
    repo = load_inventory(REPO_INI)
    lab = _lab_inventory()
    assert list(repo.hosts) == list(lab.hosts) == ["client", "aqm", "server"]
    assert _toward_graph(repo) == _toward_graph(lab) == {("client", "aqm"), ("aqm", "client"),
                                                         ("aqm", "server"), ("server", "aqm")}
    assert repo.kind == "physical" and repo.tags == [] and repo.token_file == "/etc/tcplab/token"
    assert repo.hosts["aqm"].agent == "tcp://192.0.2.12:7717"
    aqm_to_server = repo.hosts["aqm"].interfaces[repo.hosts["aqm"].iface_toward("server")]
    fields = {"toward", "addr", "plen", "peer_addr", "mac"}
    assert aqm_to_server.model_dump(include=fields) == {"toward": "server", "addr": "203.0.113.254", "plen": 24,
                                                        "peer_addr": "203.0.113.1", "mac": "00:00:5e:00:53:03"}
    # every link's two ends agree: each side's peer is the other's address, on one subnet
    for role, host in repo.hosts.items():
        for iface in host.interfaces.values():
            back = repo.hosts[iface.toward].interfaces[repo.hosts[iface.toward].iface_toward(role)]
            assert (back.addr, back.peer_addr) == (iface.peer_addr, iface.addr)


def test_ansible_itself_reads_the_repos_inventory_ini():
    """The playbooks' view: ansible-inventory lists the agent hosts in their role groups."""
    # Ansible's command-line tools refuse a non-UTF-8 locale (its loader, as the manager uses it, does not)
    env = {**os.environ, "LC_ALL": "C.UTF-8"}
    out = subprocess.run([str(ANSIBLE_INVENTORY), "-i", str(REPO_INI), "--list"], capture_output=True,
                         text=True, check=True, env=env, stdin=subprocess.DEVNULL).stdout   # a blocking stdin
    doc = json.loads(out)
    assert {g: doc[g]["hosts"] for g in ("manager", "client", "aqm", "server")} == {
        "manager": ["mgr1"], "client": ["cli1"], "aqm": ["aqm1"], "server": ["srv1"]}
    assert doc["_meta"]["hostvars"]["aqm1"]["data_ifaces"]["server"]["dev"] == "enp1s0f1"


def test_merged_vars_group_vars_and_the_role_rule(tmp_path):
    inv = load_inventory(_write(tmp_path, SMALL))
    assert list(inv.hosts) == ["client", "aqm"]              # mgr skipped; testbed (only children) no role
    assert inv.hosts["aqm"].allow_module == ["sch_dualpi2", "tcp_prague"]
    assert inv.hosts["client"].allow_sysctl == ["net.ipv4.tcp_", "net.core."]   # from [testbed:vars]
    assert inv.tls_ca == "/etc/tcplab/ca.pem" and inv.hosts["client"].interfaces["eth1"].mac == ""


def test_the_labs_inventory_round_trips_through_ini_and_ansible(tmp_path):
    lab = _lab_inventory()
    text = to_ini(lab)
    assert "[client]\ntcplabx-client agent_url=unix:/run/tcplab/agent-client.sock data_ifaces=" in text
    assert load_inventory(_write(tmp_path, text)) == without_lab_bookkeeping(lab)
    # the VM lab's: the aqm is a guest (no namespace, a tcp:// agent) and the VM details stay in the JSON
    hosts = {**lab.hosts, "aqm": lab.hosts["aqm"].model_copy(update={"namespace": None,
                                                                     "agent": "tcp://127.0.0.1:40123"})}
    vm = lab.model_copy(update={"kind": "vm", "hosts": hosts, "vm": {"roles": ["aqm"], "boot_s": 9.1}})
    back = load_inventory(_write(tmp_path, to_ini(vm)))
    assert back == without_lab_bookkeeping(vm) and back.tags == ["smoke"] and back.hosts["aqm"].namespace is None


def test_a_reserved_group_name_cannot_be_written_as_a_role():
    lab = _lab_inventory()
    with pytest.raises(ValueError, match="role 'manager' cannot be an INI role group"):
        to_ini(lab.model_copy(update={"hosts": {"manager": lab.hosts["aqm"]}}))


def test_a_literal_inventory_with_every_field_round_trips(tmp_path):
    inv = Inventory.model_validate({
        "kind": "physical", "token_file": "/etc/tcplab/my token", "tls_ca": "/etc/tcplab/ca.pem",
        "tls_client_cert": "/etc/tcplab/mgr.pem", "tls_client_key": "/etc/tcplab/mgr.key",
        "hosts": {"sender": {"agent": "tcp://[2001:db8::1]:7717", "allow_sysctl": ["net.ipv4.tcp_"],
                             "allow_module": ["tcp_bbr"],
                             "interfaces": {"p1": {"toward": "router", "addr": "2001:db8:1::1", "plen": 64,
                                                   "peer_addr": "2001:db8:1::2", "mac": "00:00:5e:00:53:aa"}}},
                  "router": {"agent": "unix:/run/a.sock", "namespace": "True",   # literal_eval would turn it
                             "interfaces": {"p1": {"toward": "sender", "addr": "2001:db8:1::2", "plen": 64,
                                                   "peer_addr": "2001:db8:1::1"}}}}})
    assert load_inventory(_write(tmp_path, to_ini(inv))) == inv


def _host(name, groups, **vars_):
    base = {"agent_url": "tcp://192.0.2.1:7717", "tcplab_token_file": "/t",
            "data_ifaces": {"aqm": {"dev": "e0", "addr": "198.51.100.1/24", "peer": "198.51.100.2"}}}
    return IniHost(name, tuple(groups), {**base, **vars_})


@pytest.mark.parametrize(("hosts", "host", "var", "msg"), [
    ([_host("h", ["ungrouped"])], "h", None, "in no role group"),
    ([_host("h", ["client", "server"])], "h", None, "several role groups ['client', 'server']"),
    ([_host("h1", ["client"]), _host("h2", ["client"])], "h2", None, "already played by h1"),
    ([_host("h", ["client"], agent_url="192.0.2.1:7717")], "h", "agent_url", "neither tcp://HOST:PORT"),
    ([_host("h", ["client"], tcplab_tokenfile="/t")], "h", "tcplab_tokenfile", "unknown variable"),
    ([_host("h", ["client"], data_ifaces="to-aqm=enp1s0f0")], "h", "data_ifaces", "not a mapping"),
    ([_host("h", ["client"], data_ifaces={"aqm": {"dev": "e0", "adr": "x", "peer": "y"}})], "h",
     "data_ifaces.aqm.adr", "unknown key"),
    ([_host("h", ["client"], data_ifaces={"aqm": {"dev": "e0", "addr": "198.51.100.1", "peer": "y"}})], "h",
     "data_ifaces.aqm.addr", "no prefix length"),
    ([_host("h", ["client"], allow_module=5)], "h", "allow_module", "comma-separated"),
    ([_host("h1", ["client"]), _host("h2", ["aqm"], tcplab_token_file="/u")], "h2", "tcplab_token_file",
     "differs from '/t' on h1"),
])
def test_the_pure_mapping_names_host_and_variable(hosts, host, var, msg):
    with pytest.raises(IniVarError) as err:
        inventory_from_hosts(hosts)
    assert (err.value.host, err.value.var) == (host, var) and msg in err.value.msg


def test_errors_name_file_line_host_and_variable(tmp_path):
    path = _write(tmp_path, SMALL.replace('"peer": "198.51.100.1",', '"peer": "198.51.100.1", "mtu": 9000,'))
    with pytest.raises(InventoryError, match=rf"^{path}:8: host a1: data_ifaces.client.mtu: unknown key"):
        load_inventory(path)
    path = _write(tmp_path, SMALL.replace("tcplab_token_file=", "tcplab_token=").replace("tcplab_tls_ca", "x"))
    with pytest.raises(InventoryError, match=rf"^{path}:18: host c1: tcplab_token: unknown variable"):
        load_inventory(path)
    path = _write(tmp_path, SMALL.replace("c1 agent_url=", "c1 agent=x agent_uri="))
    with pytest.raises(InventoryError, match=rf"^{path}:5: host c1: agent_url: missing"):
        load_inventory(path)


def test_a_file_ansible_cannot_parse_gives_ansibles_reason(tmp_path):
    path = _write(tmp_path, SMALL.replace("mgr ansible_host=192.0.2.10", "mgr ansible_host"))
    with pytest.raises(InventoryError, match=rf"^{path}: Ansible cannot read it.*Expected key=value"):
        load_inventory(path)


def test_host_vars_files_next_to_the_inventory_count(tmp_path):
    """Ansible's host_vars/ (YAML) merges like the host line: a long data_ifaces can live there."""
    path = _write(tmp_path, SMALL.replace(" allow_module=sch_dualpi2,tcp_prague data_ifaces=", " x="))
    (tmp_path / "host_vars").mkdir()
    (tmp_path / "host_vars" / "a1.yml").write_text(
        "data_ifaces:\n  client: {dev: eth2, addr: 198.51.100.254/24, peer: 198.51.100.1}\n"
        "allow_module: [sch_fq_codel]\n")
    aqm = load_inventory(path).hosts["aqm"]
    assert aqm.iface_toward("client") == "eth2" and aqm.allow_module == ["sch_fq_codel"]
