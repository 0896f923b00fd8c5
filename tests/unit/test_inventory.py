"""The inventory refuses what it does not know, naming file, field path and line; what the labs write loads."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from orchestrator.inventory import InventoryError, load_inventory
from orchestrator.lab.netns import inventory_dict
from orchestrator.lab.topology import netns_topology

# a hand-written physical inventory, as a user would lay it out (one key per line)
PHYSICAL = """{
  "kind": "physical",
  "token_file": "/etc/tcplab/token",
  "hosts": {
    "client": {
      "agent": "tcp://192.0.2.13:7717",
      "interfaces": {
        "enp1s0f0": {"toward": "aqm", "addr": "10.0.1.1", "plen": 24, "peer_addr": "10.0.1.254"}
      }
    },
    "aqm": {
      "agent": "tcp://192.0.2.12:7717",
      "interfaces": {
        "enp1s0f0": {"toward": "client", "addr": "10.0.1.254", "plen": 24, "peer_addr": "10.0.1.1"},
        "enp1s0f1": {
          "toward": "server",
          "addr": "10.0.2.254",
          "plen": 24,
          "peer_addr": "10.0.2.1"
        }
      }
    },
    "server": {
      "agent": "tcp://192.0.2.11:7717",
      "interfaces": {
        "enp1s0f0": {"toward": "aqm", "addr": "10.0.2.1", "plen": 24, "peer_addr": "10.0.2.254"}
      }
    }
  }
}
"""


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "inventory.json"
    path.write_text(text)
    return path


def test_a_correct_physical_inventory_loads(tmp_path):
    inv = load_inventory(_write(tmp_path, PHYSICAL))
    assert inv.hosts["aqm"].iface_toward("server") == "enp1s0f1"
    assert inv.tags == []


def test_a_typo_in_an_interface_names_file_field_path_and_line(tmp_path):
    path = _write(tmp_path, PHYSICAL.replace('"toward": "server"', '"tovard": "server"'))
    with pytest.raises(InventoryError) as err:
        load_inventory(path)
    msg = str(err.value)
    assert f"{path}:16: hosts.aqm.interfaces.enp1s0f1.tovard: unknown field 'tovard'" in msg
    assert "expected one of: addr, mac, peer_addr, plen, switch_peers, toward" in msg
    # the misspelt key also leaves the real one missing: both are named, at the interface's line
    assert f"{path}:15: hosts.aqm.interfaces.enp1s0f1.toward: Field required" in msg


def test_typos_at_host_and_top_level_are_refused_too(tmp_path):
    text = PHYSICAL.replace('"agent": "tcp://192.0.2.11:7717",', '"agent": "tcp://192.0.2.11:7717", "namspace": "x",')
    text = text.replace('"kind": "physical",', '"kind": "physical", "token": "secret",')
    with pytest.raises(InventoryError) as err:
        load_inventory(_write(tmp_path, text))
    msg = str(err.value)
    assert ":2: token: unknown field 'token'" in msg
    assert (":24: hosts.server.namspace: unknown field 'namspace' (expected one of: agent, agent_listen, agent_netns, "
            "allow_module, allow_sysctl, interfaces, namespace, ssh)") in msg


def test_a_file_that_is_not_json_names_its_line(tmp_path):
    path = _write(tmp_path, PHYSICAL.replace('"plen": 24,\n', '"plen": 24\n', 1))
    with pytest.raises(InventoryError, match=rf"^{path}:19:\d+: not JSON"):
        load_inventory(path)


def test_what_the_labs_write_loads(tmp_path):
    topo = netns_topology("tcplabx")
    macs = {(role, ep.ifname): "02:00:00:00:00:01" for role in topo.roles for ep in topo.endpoints(role)}
    netns_doc = inventory_dict(topo, "netns", tmp_path / "token", macs,
                               {r: f"unix:/run/tcplab/agent-{r}.sock" for r in topo.roles},
                               {r: topo.namespace(r) for r in topo.roles})
    netns_doc["supervisor_pid"] = 4242
    inv = load_inventory(_write(tmp_path, json.dumps(netns_doc)))
    assert inv.hosts["client"].namespace == "tcplabx-client" and inv.tags == ["smoke"]
    # the VM lab adds its guests and the supervisor's extra children (orchestrator/lab/vm.py)
    vm_doc = {**netns_doc, "kind": "vm",
              "processes": [{"name": "qemu-aqm", "argv": ["qemu-system-x86_64"], "pass_fds": [5]}],
              "vm": {"package": "linux-image-6.1.0-30-amd64", "roles": ["aqm"], "guests": {}, "boot_s": 9.1}}
    vm_doc["hosts"]["aqm"]["namespace"] = None
    assert load_inventory(_write(tmp_path, json.dumps(vm_doc))).vm["roles"] == ["aqm"]


def test_tls_fields_are_optional_and_build_the_managers_client_context(tmp_path):
    plain = load_inventory(_write(tmp_path, PHYSICAL))
    assert plain.tls_context() is None                                  # no CA: plain WebSocket, as before
    doc = json.loads(PHYSICAL)
    doc["tls_client_cert"] = str(tmp_path / "manager.pem")
    with pytest.raises(InventoryError, match="tls_client_cert without tls_ca"):
        load_inventory(_write(tmp_path, json.dumps(doc))).tls_context()
    doc["tls_cs"] = "/etc/tcplab/ca.pem"
    with pytest.raises(InventoryError, match="unknown field 'tls_cs'.*tls_ca"):
        load_inventory(_write(tmp_path, json.dumps(doc, indent=2)))
