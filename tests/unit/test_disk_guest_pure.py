"""Disk guests as data (orchestrator/lab/vm_disk_recipe.py), the agent bundle's contents and pins
(orchestrator/ansible/bundle.py), run_host rows (orchestrator/ingest/hosts.py), the agent's record of an
installed kernel (agents/host/capabilities.installed_build)."""
import ast
import gzip
import io
import sys
import tarfile
from pathlib import Path

from agents.host.capabilities import installed_build
from orchestrator.ansible import bundle
from orchestrator.lab import vm_disk_recipe as recipe
from orchestrator.lab.netns import netns_topology
from orchestrator.lab.vm_config import guest_config, lab_macs

REPO = Path(__file__).parents[2]


def _aqm_config():
    topo = netns_topology("tcplab")
    macs = lab_macs(topo, ("aqm",), {("client", "to-aqm"): "02:00:00:00:00:01",
                                     ("server", "to-aqm"): "02:00:00:00:00:02"})
    return guest_config(topo, "aqm", 7717, macs)


def test_guest_files_name_interfaces_by_mac_and_carry_addresses_neighbours_forwarding():
    files = recipe.guest_files(_aqm_config(), "ssh-ed25519 AAAA lab", {"ssh_host_ed25519_key": b"K",
                                                                      "ssh_host_ed25519_key.pub": b"P"})
    link = files["etc/systemd/network/10-to-client.link"][1].decode()
    assert "MACAddress=52:54:00:7c:01:fe" in link and "Name=to-client" in link
    net = files["etc/systemd/network/10-to-client.network"][1].decode()
    assert "Address=10.199.1.254/24" in net and "IPForward=ipv4" in net
    assert "[Neighbor]\nAddress=10.199.1.1\nLinkLayerAddress=02:00:00:00:00:01" in net
    ctl = files["etc/systemd/network/12-ctl.network"][1].decode()
    assert "Address=10.0.2.15/24" in ctl and "IPForward" not in ctl      # the control NIC never forwards
    assert files["root/.ssh/authorized_keys"] == (0o600, b"ssh-ed25519 AAAA lab\n")
    assert files["etc/ssh/ssh_host_ed25519_key"][0] == 0o600 and files["etc/ssh/ssh_host_ed25519_key.pub"][0] == 0o644
    assert files["etc/hostname"][1] == b"tcplab-aqm\n"


def test_endpoint_guest_gets_its_route_through_the_aqm():
    topo = netns_topology("tcplab")
    macs = lab_macs(topo, ("aqm", "server"), {("client", "to-aqm"): "02:00:00:00:00:01"})
    files = recipe.guest_files(guest_config(topo, "server", 7717, macs), "k", {})
    net = files["etc/systemd/network/10-to-aqm.network"][1].decode()
    assert "[Route]\nDestination=10.199.1.0/24\nGateway=10.199.2.254" in net and "IPForward" not in net


def test_debugfs_script_replaces_each_file_owned_by_root_with_its_mode():
    script = recipe.debugfs_write_script({"/etc/hostname": "/tmp/f0"}, {"/etc/hostname": 0o644})
    assert script.splitlines() == ['rm "/etc/hostname"', 'write "/tmp/f0" "/etc/hostname"',
                                   'sif "/etc/hostname" mode 0100644', 'sif "/etc/hostname" uid 0',
                                   'sif "/etc/hostname" gid 0']


def test_recipe_key_follows_the_recipe():
    before = recipe.recipe_key()
    saved = recipe.PACKAGES
    try:
        recipe.PACKAGES = (*saved, "strace")
        assert recipe.recipe_key() != before
    finally:
        recipe.PACKAGES = saved
    assert recipe.recipe_key() == before
    assert "--include=" + ",".join(recipe.PACKAGES) in recipe.debootstrap_argv("/t")


def _third_party_imports(top: str) -> set[str]:
    stdlib = set(sys.stdlib_module_names)
    found = set()
    for path in (REPO / top).rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module] if isinstance(node, ast.ImportFrom) and node.module and node.level == 0 else []
            found |= {n.split(".")[0] for n in names}
    return found - stdlib - {"agents", "schemas", "__future__"}


def test_the_bundle_carries_every_package_the_agent_imports():
    assert _third_party_imports("agents") | _third_party_imports("schemas") <= set(bundle.AGENT_REQUIREMENTS)
    assert all(p.split("==")[0] in bundle.AGENT_REQUIREMENTS for p in bundle.pinned_requirements())


def test_bundle_tarballs_are_deterministic():
    members = [("b.py", b"2"), ("a.py", b"1")]
    one, two = bundle._tar_bytes(members), bundle._tar_bytes(list(reversed(members)))
    assert one == two
    with tarfile.open(fileobj=io.BytesIO(gzip.decompress(one))) as tar:
        assert [(m.name, m.mtime, m.uid) for m in tar.getmembers()] == [("a.py", 0, 0), ("b.py", 0, 0)]
    files = [str(p.relative_to(REPO)) for p in bundle.code_files()]
    assert "agents/server.py" in files and "schemas/protocol.py" in files
    assert not any("orchestrator" in f for f in files)


def test_installed_build_record_is_read_only_when_valid_and_for_the_running_release(tmp_path):
    (tmp_path / "6.1.0-cwnd16-abc.json").write_text('{"release": "6.1.0-cwnd16-abc", "variant": "cwnd16", '
                                                    '"build_key": "abc123"}')
    got = installed_build("6.1.0-cwnd16-abc", tmp_path)
    assert (got.variant, got.build_key) == ("cwnd16", "abc123")
    assert installed_build("6.1.0-other", tmp_path) is None
    (tmp_path / "x.json").write_text('{"release": "y"}')                  # a record of another release
    assert installed_build("x", tmp_path) is None
    (tmp_path / "big.json").write_text('{"release": "big", "variant": "' + "v" * 5000 + '"}')
    assert installed_build("big", tmp_path) is None
    (tmp_path / "bad.json").write_text('{"release": "bad", "rm": "-rf"}')  # unknown keys: not a record
    assert installed_build("bad", tmp_path) is None


def test_run_host_rows_join_the_plan_variant_with_what_each_host_reported():
    from orchestrator.ingest.hosts import host_rows
    from orchestrator.plan import expand, load_plan

    spec = expand(load_plan(REPO / "experiments" / "vm" / "dctcp.yaml"))[0]
    hello = {"kernel_release": "6.1.0-50-amd64", "boot_id": "7c1e", "kernel_build": {"release": "6.1.0-50-amd64",
                                                                                    "variant": "v", "build_key": "k1"},
             "os": {"system": "Linux", "id": "debian", "version_id": "12", "pretty": "Debian GNU/Linux 12"}}
    rows = host_rows(spec, [{"host": "aqm", "phase": "hello", "data": {"capabilities": hello}},
                            {"host": "aqm", "phase": "apply", "data": {}}])
    by_host = {r["host"]: r for r in rows}
    assert set(by_host) == set(spec.hosts)
    aqm = by_host["aqm"]
    kernel = spec.hosts["aqm"].kernel
    assert (aqm["variant"], aqm["release"], aqm["boot_id"], aqm["installed_build_key"]) == \
        (kernel.name if kernel else None, "6.1.0-50-amd64", "7c1e", "k1")
    assert (aqm["os_system"], aqm["os_id"], aqm["os_version_id"]) == ("Linux", "debian", "12")
    assert by_host["client"]["os_system"] is None     # nor its OS
    assert by_host["client"]["release"] is None       # no hello recorded for it
