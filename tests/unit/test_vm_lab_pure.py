"""The VM lab's pure parts: package names and versions, module selection, the stage-1 script, the initramfs
archive and its name, guest config, the kernel command line (paths kept visible under the guest's tmpfs),
QEMU argv. Module lists are literal busybox depmod output of Debian kernel packages (tests/fixtures/vm)."""
from __future__ import annotations

import lzma
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.lab import vm_config, vm_guest, vm_host, vm_recipe
from orchestrator.lab.netns import LabError
from orchestrator.lab.topology import bridge_argv, lab_topology, namespace_argv, neigh_argv, netns_topology, wiring_argv
from orchestrator.plan.model.topology import plan_graph


def test_newest_package_picks_the_highest_abi_of_the_flavour():
    names = ["linux-image-6.1.0-9-amd64", "linux-image-6.1.0-56-amd64", "linux-image-6.1.0-56-cloud-amd64",
             "linux-image-6.1.0-100-rt-amd64", "linux-image-6.12.12-amd64", "linux-image-amd64"]
    assert vm_recipe.newest_package(names) == "linux-image-6.1.0-56-amd64"
    assert vm_recipe.newest_package(names, flavour="cloud-amd64") == "linux-image-6.1.0-56-cloud-amd64"
    assert vm_recipe.newest_package([]) is None


@pytest.mark.parametrize("name", ["linux-image-amd64", "linux-image-6.1.0-56-amd64; rm -rf /", "nginx", ""])
def test_check_package_refuses_anything_but_one_kernel_image(name):
    with pytest.raises(vm_recipe.ImageError):
        vm_recipe.check_package(name)


def test_closure_lists_dependencies_first_and_names_missing_modules():
    deps = vm_recipe.parse_modules_dep(
        "kernel/fs/9p/9p.ko: kernel/fs/netfs/netfs.ko kernel/net/9p/9pnet.ko\n"
        "kernel/net/9p/9pnet.ko:\nkernel/fs/netfs/netfs.ko: kernel/fs/fscache/fscache.ko\n"
        "kernel/fs/fscache/fscache.ko:\nkernel/net/9p/9pnet_virtio.ko: kernel/net/9p/9pnet.ko\n")
    order = vm_recipe.closure(deps, ["9pnet_virtio", "9p"])
    assert order == ["kernel/net/9p/9pnet.ko", "kernel/net/9p/9pnet_virtio.ko", "kernel/fs/fscache/fscache.ko",
                     "kernel/fs/netfs/netfs.ko", "kernel/fs/9p/9p.ko"]
    with pytest.raises(vm_recipe.ImageError, match="sch_dualpi2"):
        vm_recipe.closure(deps, ["sch_dualpi2"])


def test_share_follows_the_kernel_config():
    assert vm_recipe.share_for_config("CONFIG_9P_FS=m\nCONFIG_NET_9P_VIRTIO=m\nCONFIG_VIRTIO_FS=m\n") == "9p"
    assert vm_recipe.share_for_config("# CONFIG_9P_FS is not set\nCONFIG_VIRTIO_FS=m\n") == "virtiofs"
    with pytest.raises(vm_recipe.ImageError):
        vm_recipe.share_for_config("CONFIG_EXT4_FS=y\n")


FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "vm"
DEP_61 = vm_recipe.parse_modules_dep((FIXTURES / "modules.dep-6.1.0-56-amd64-subset").read_text())
DEP_612 = vm_recipe.parse_modules_dep((FIXTURES / "modules.dep-6.12.117+deb12-amd64-excerpt").read_text())
BUILTIN_612 = (FIXTURES / "modules.builtin-6.12.117+deb12-amd64").read_text().split()


def test_the_candidate_version_comes_from_apt_cache_show():
    show = (FIXTURES / "apt-cache-show-linux-image-6.1.0-56-amd64.txt").read_text()
    assert vm_recipe.apt_version(show) == "6.1.192-2"
    assert vm_recipe.apt_version("Package: linux-image-6.1.0-56-amd64\n") is None
    assert vm_recipe.one_release("k.deb", ["6.1.0-56-amd64"]) == "6.1.0-56-amd64"
    with pytest.raises(vm_recipe.ImageError, match="expected one"):
        vm_recipe.one_release("k.deb", ["6.1.0-56-amd64", "6.1.0-55-amd64"])


def _before_dependents(order: list[str], deps: dict[str, list[str]]) -> bool:
    return all(order.index(d) < order.index(m) for m in order for d in deps[m])


def test_stage_1_loads_the_boot_modules_and_every_congestion_control_dependencies_first():
    order = vm_recipe.load_order(DEP_61, [], "9p")
    names = [vm_recipe.module_name(m) for m in order]
    assert _before_dependents(order, DEP_61)
    assert names.index("virtio") < names.index("virtio_pci") < names.index("virtio_net")
    assert {"9p", "9pnet_virtio", "veth", "tcp_diag", "inet_diag"} <= set(names)
    ccs = {n for n in names if n.startswith("tcp_") and n != "tcp_diag"}
    assert {"tcp_dctcp", "tcp_bbr", "tcp_vegas", "tcp_westwood"} <= ccs and len(ccs) == 15
    assert not any(n.startswith("sch_") for n in names), "qdiscs load on demand, not at boot"


def test_the_kept_subset_is_closed_so_the_initramfs_recomputes_it_from_its_own_modules_dep():
    # _build_initramfs reads the kept tree's modules.dep: everything in it is either loaded or on demand
    assert vm_recipe.subset(DEP_61, [], "9p") == set(DEP_61)


def test_6_12_ships_xz_modules_and_builds_some_boot_modules_in():
    kept = vm_recipe.subset(DEP_612, BUILTIN_612, "9p")
    assert all(m.endswith(".ko.xz") for m in kept)
    names = {vm_recipe.module_name(m) for m in kept}
    assert {"sch_netem", "sch_cake", "sch_red", "sch_pie", "ifb", "tcp_dctcp", "9p", "virtio_net"} <= names
    builtin = {vm_recipe.module_name(b) for b in BUILTIN_612}
    assert {"virtio_pci", "virtio_console", "sch_fq_codel"} <= builtin and not names & builtin
    assert not names & {"ipip", "dummy", "tun", "ip_gre", "macvlan"}, "only what the lab needs is kept"
    with pytest.raises(vm_recipe.ImageError, match="virtio_pci is not in this kernel package"):
        vm_recipe.load_order(DEP_612, [], "9p")
    assert _before_dependents(vm_recipe.load_order(DEP_612, BUILTIN_612, "9p"), DEP_612)
    assert vm_recipe.uncompressed("kernel/net/sched/sch_red.ko.xz", lzma.compress(b"ELF")) == (
        "kernel/net/sched/sch_red.ko", b"ELF")
    assert vm_recipe.uncompressed("kernel/a.ko", b"x") == ("kernel/a.ko", b"x")


def test_module_globs_stay_within_one_directory():
    assert vm_recipe.path_matches("kernel/net/sched/sch_red.ko.xz", "kernel/net/sched/*.ko*")
    assert not vm_recipe.path_matches("kernel/net/sched/sub/x.ko", "kernel/net/sched/*.ko*")
    assert not vm_recipe.path_matches("kernel/net/ipv4/netfilter/tcp_x.ko", "kernel/net/ipv4/tcp_*.ko*")
    assert vm_recipe.globbed(["kernel/net/ipv4/tcp_diag.ko", "kernel/net/ipv4/tcp_bbr.ko"],
                             vm_recipe.PRELOAD_GLOBS) == ["kernel/net/ipv4/tcp_bbr.ko"]


def test_the_initramfs_name_follows_its_recipe():
    name = vm_recipe.initramfs_name(DEP_61, [], "9p", b"BB")
    assert name.startswith("initramfs-") and name.endswith(".cpio")
    assert vm_recipe.initramfs_name(dict(DEP_61), [], "9p", b"BB") == name
    assert vm_recipe.initramfs_name(DEP_61, [], "9p", b"BB2") != name
    with pytest.raises(vm_recipe.ImageError, match="virtiofs is not in this kernel package"):
        vm_recipe.initramfs_name(DEP_61, [], "virtiofs", b"BB")  # a 9p kernel's subset
    both = {**DEP_61, "kernel/fs/fuse/virtiofs.ko": []}
    assert vm_recipe.initramfs_name(both, [], "virtiofs", b"BB") != vm_recipe.initramfs_name(both, [], "9p", b"BB")
    assert vm_recipe.static_busybox(b"\x7fELF" + b"\0" * 60)
    assert not vm_recipe.static_busybox(b"\x7fELF" + b"\0" * 500 + b"/lib64/ld-linux-x86-64.so.2")


def _read_newc(data: bytes) -> dict[str, tuple[int, bytes]]:
    out, pos = {}, 0
    while True:
        assert data[pos:pos + 6] == b"070701"
        fields = [int(data[pos + 6 + 8 * i:pos + 14 + 8 * i], 16) for i in range(13)]
        mode, size, namesize = fields[1], fields[6], fields[11]
        name = data[pos + 110:pos + 110 + namesize - 1].decode()
        pos += 110 + namesize
        pos += -pos % 4
        if name == "TRAILER!!!":
            return out
        out[name] = (mode, data[pos:pos + size])
        pos += size + (-size % 4)


def test_initramfs_holds_init_busybox_devices_and_the_load_order():
    entries = vm_recipe.initramfs_entries(b"BB", "6.1.0-1-amd64", {"kernel/a.ko": b"A"}, ["kernel/a.ko"],
                                         {"modules.dep": b"kernel/a.ko:\n"})
    files = _read_newc(vm_recipe.cpio_newc(entries))
    assert files["init"] == (0o100755, vm_recipe.INIT_SCRIPT.encode())
    assert files["bin/busybox"][1] == b"BB" and files["etc/tcplab/load"][1] == b"kernel/a.ko\n"
    assert files["lib/modules/6.1.0-1-amd64/kernel/a.ko"][1] == b"A"
    assert files["dev/console"][0] == 0o020600 and files["lib/modules/6.1.0-1-amd64"][0] == 0o040755


def test_guest_config_names_interfaces_by_mac_with_static_neighbours():
    topo = netns_topology("t")
    macs = vm_config.lab_macs(topo, ("aqm",), {("client", "to-aqm"): "aa:00:00:00:00:01",
                                               ("server", "to-aqm"): "aa:00:00:00:00:02"})
    cfg = vm_config.guest_config(topo, "aqm", 4242, macs)
    by_name = {i["ifname"]: i for i in cfg["interfaces"]}
    assert by_name["to-client"]["addr"] == "10.199.1.254" and by_name["to-client"]["mac"] == "52:54:00:7c:01:fe"
    assert by_name["to-client"]["neighbours"] == [["10.199.1.1", "aa:00:00:00:00:01"]]
    assert by_name["to-server"]["neighbours"] == [["10.199.2.1", "aa:00:00:00:00:02"]]
    assert cfg["sysctls"] == {"net.ipv4.ip_forward": "1"} and cfg["routes"] == []
    agent = cfg["agent"]
    assert agent[agent.index("--listen") + 1] == "tcp://10.0.2.15:4242"
    assert agent[agent.index("--name") + 1] == "aqm"
    assert [agent[i + 1] for i, a in enumerate(agent) if a == "--interface"] == ["to-client", "to-server"]
    cmds = vm_guest.setup_argv(cfg, {by_name["to-client"]["mac"]: "eth0", by_name["to-server"]["mac"]: "eth1",
                                     by_name["ctl"]["mac"]: "eth2"})
    assert ["ip", "link", "set", "dev", "eth1", "name", "to-server"] in cmds
    assert ["ip", "neigh", "replace", "10.199.1.1", "lladdr", "aa:00:00:00:00:01", "dev", "to-client", "nud",
            "permanent"] in cmds
    with pytest.raises(SystemExit, match="no interface with MAC"):
        vm_guest.setup_argv(cfg, {})


def test_an_endpoint_guest_routes_through_the_aqm_and_does_not_forward():
    topo = netns_topology("t")
    macs = vm_config.lab_macs(topo, topo.roles, {})
    cfg = vm_config.guest_config(topo, "server", 4243, macs)
    (ifc,) = [i for i in cfg["interfaces"] if i["ifname"] != "ctl"]
    assert ifc == {"ifname": "to-aqm", "mac": "52:54:00:7c:02:01", "addr": "10.199.2.1", "plen": 24,
                   "neighbours": [["10.199.2.254", "52:54:00:7c:02:fe"]]}
    assert cfg["routes"] == [["10.199.1.0/24", "10.199.2.254", "to-aqm"]] and cfg["sysctls"] == {}
    cmds = vm_guest.setup_argv(cfg, {"52:54:00:7c:02:01": "eth0", vm_config.CONTROL_MAC: "eth1"})
    assert cmds[-1] == ["ip", "route", "add", "10.199.1.0/24", "via", "10.199.2.254", "dev", "to-aqm"]
    assert not any(c[0] == "sysctl" for c in cmds)


def test_guest_links_are_taps_toward_namespaces_and_socket_pairs_between_guests(tmp_path):
    topo = netns_topology("t")
    hybrid = vm_config.guest_nics(topo, "aqm", ("aqm",), tmp_path)
    assert [(n.ifname, n.backend, n.namespace, n.tap_ifname) for n in hybrid] == [
        ("to-client", "tap", "t-client", "to-aqm"), ("to-server", "tap", "t-server", "to-aqm")]
    assert hybrid[0].netdev(0, fd=7) == "tap,id=data0,fd=7"
    with pytest.raises(ValueError):
        hybrid[0].netdev(0)
    roles = vm_config.check_vm_roles(topo, ("server", "aqm", "client"))
    assert roles == ("client", "aqm", "server")
    aqm = {n.ifname: n for n in vm_config.guest_nics(topo, "aqm", roles, tmp_path)}
    (client,) = vm_config.guest_nics(topo, "client", roles, tmp_path)
    assert client.backend == aqm["to-client"].backend == "dgram"
    assert (client.local, client.remote) == (aqm["to-client"].remote, aqm["to-client"].local)
    assert client.local.parent == vm_config.vm_dir(tmp_path, "client")
    assert aqm["to-client"].netdev(0) == (f"dgram,id=data0,local.type=unix,local.path={aqm['to-client'].local},"
                                          f"remote.type=unix,remote.path={client.local}")
    mixed = {n.ifname: n.backend for n in vm_config.guest_nics(topo, "aqm", ("aqm", "server"), tmp_path)}
    assert mixed == {"to-client": "tap", "to-server": "dgram"}


PC_ROLES = ["sender_a", "sender_b", "aqm", "receiver_a", "receiver_b"]  # aqm -> switch -> both receivers


def test_a_guest_on_a_switch_gets_a_tap_in_the_switch_namespace_named_as_its_port(tmp_path):
    topo = lab_topology(plan_graph(PC_ROLES, None), "t")
    assert vm_config.check_vm_roles(topo, ("aqm",)) == ("aqm",)
    aqm = vm_config.guest_nics(topo, "aqm", ("aqm",), tmp_path)
    assert [(n.ifname, n.mac, n.backend, n.namespace, n.tap_ifname) for n in aqm] == [
        ("to-sender_a", "52:54:00:7c:01:fe", "tap", "t-sender_a", "to-aqm"),
        ("to-sender_b", "52:54:00:7c:02:fe", "tap", "t-sender_b", "to-aqm"),
        ("to-switch", "52:54:00:7c:03:01", "tap", "t-switch", "to-aqm")]
    # two guests on one switch do not get a socket pair: each has its own port on the bridge
    roles = vm_config.check_vm_roles(topo, ("receiver_a", "aqm"))
    (rx,) = vm_config.guest_nics(topo, "receiver_a", roles, tmp_path)
    assert (rx.ifname, rx.mac, rx.backend, rx.namespace, rx.tap_ifname) == (
        "to-switch", "52:54:00:7c:04:01", "tap", "t-switch", "to-receiver_a")
    assert vm_config.guest_nics(topo, "aqm", roles, tmp_path)[2].tap_ifname == "to-aqm"


def test_the_switch_namespace_is_built_and_its_guest_ports_are_enslaved_to_the_bridge():
    topo = lab_topology(plan_graph(PC_ROLES, None), "t")
    nodes = vm_config.namespace_nodes(topo, ("aqm", "receiver_a"))
    assert nodes == ("sender_a", "sender_b", "receiver_b", "switch")
    made = namespace_argv(topo, nodes) + bridge_argv(topo)
    assert ["ip", "netns", "add", "t-switch"] in made and ["ip", "netns", "add", "t-aqm"] not in made
    assert ["ip", "-n", "t-switch", "link", "add", "br0", "type", "bridge"] in made
    wired = wiring_argv(topo, nodes)
    veths = [a for a in wired if a[:3] == ["ip", "link", "add"]]
    assert veths == [["ip", "link", "add", "to-switch", "netns", "t-receiver_b", "type", "veth", "peer", "name",
                      "to-receiver_b", "netns", "t-switch"]]          # the only link between two namespaces
    for port in ("to-aqm", "to-receiver_a", "to-receiver_b"):     # guests' taps and the veth end alike
        assert ["ip", "-n", "t-switch", "link", "set", port, "master", "br0"] in wired
    assert ["ip", "-n", "t-sender_a", "addr", "add", "10.199.1.1/24", "dev", "to-aqm"] in wired  # the tap
    assert not any(a[:3] == ["ip", "-n", "t-aqm"] or "t-receiver_a" in a for a in wired)
    assert ["ip", "-n", "t-receiver_b", "route", "add", "10.199.1.0/24", "via", "10.199.3.254",
            "dev", "to-switch"] in wired


def test_guests_on_a_switch_have_every_host_on_it_as_neighbour_and_the_namespaces_their_macs():
    topo = lab_topology(plan_graph(PC_ROLES, None), "t")
    roles = ("aqm", "receiver_a")
    ns_macs = {("sender_a", "to-aqm"): "aa:00:00:00:00:01", ("sender_b", "to-aqm"): "aa:00:00:00:00:02",
               ("receiver_b", "to-switch"): "aa:00:00:00:00:05"}
    macs = vm_config.lab_macs(topo, roles, ns_macs)
    aqm = {i["ifname"]: i for i in vm_config.guest_config(topo, "aqm", 4242, macs)["interfaces"]}
    assert aqm["to-switch"]["addr"] == "10.199.3.254" and aqm["to-switch"]["mac"] == "52:54:00:7c:03:01"
    assert aqm["to-switch"]["neighbours"] == [["10.199.3.1", "52:54:00:7c:04:01"], ["10.199.3.2", "aa:00:00:00:00:05"]]
    assert aqm["to-sender_a"]["neighbours"] == [["10.199.1.1", "aa:00:00:00:00:01"]]
    rx = vm_config.guest_config(topo, "receiver_a", 4243, macs)
    (ifc,) = [i for i in rx["interfaces"] if i["ifname"] != "ctl"]
    assert ifc["neighbours"] == [["10.199.3.254", "52:54:00:7c:03:01"], ["10.199.3.2", "aa:00:00:00:00:05"]]
    assert rx["routes"] == [["10.199.1.0/24", "10.199.3.254", "to-switch"],
                            ["10.199.2.0/24", "10.199.3.254", "to-switch"]] and rx["sysctls"] == {}
    # the namespace on the switch reaches both guests by their fixed MACs
    rb = [(a[5], a[7]) for a in neigh_argv(topo, macs, roles=("sender_a", "sender_b", "receiver_b"))
          if a[2] == "t-receiver_b"]
    assert rb == [("10.199.3.254", "52:54:00:7c:03:01"), ("10.199.3.1", "52:54:00:7c:04:01")]


@pytest.mark.parametrize("text,expected", [("aqm", ("aqm",)), ("all", ("client", "aqm", "server")),
                                           ("server, aqm", ("aqm", "server"))])
def test_vm_roles_parse_in_topology_order(text, expected):
    assert vm_config.parse_vm_roles(text, netns_topology("t")) == expected


@pytest.mark.parametrize("text,message", [("client,server", "must include aqm"), ("aqm,router", "no role router")])
def test_vm_roles_refuse_what_the_lab_cannot_build(text, message):
    with pytest.raises(LabError, match=message):
        vm_config.parse_vm_roles(text, netns_topology("t"))


def test_clock_estimate_takes_the_shortest_round_trip():
    # (guest mono at send, host realtime, guest mono at receive)
    assert vm_guest.clock_estimate([(0, 1_000_500, 1_000), (5_000, 1_000_000, 100_000)]) == 1_000_000


def test_qemu_argv_keeps_the_control_channel_on_loopback_and_the_share_read_only(tmp_path):
    image = vm_recipe.KernelImage("linux-image-6.1.0-1-amd64", "1", "6.1.0-1-amd64", "9p", Path("/k"), Path("/i"))
    argv = vm_config.qemu_argv(image, "tcg", "console=ttyS0", tmp_path, "t-aqm",
                               [("tap,id=data0,fd=5", "52:54:00:00:00:01")], 4242)
    joined = " ".join(argv)
    assert "-nodefaults" in argv and "-no-reboot" in argv and argv[argv.index("-accel") + 1] == "tcg"
    assert "readonly=on" in joined and "path=/," in joined
    assert "user,id=ctl,restrict=on,ipv6=off,hostfwd=tcp:127.0.0.1:4242-10.0.2.15:4242" in joined
    assert "tap,id=data0,fd=5" in joined and "mac=52:54:00:00:00:01,romfile=" in joined
    assert f"file:{tmp_path / 'console.log'}" in argv


def test_kernel_cmdline_refuses_paths_it_cannot_carry():
    with pytest.raises(LabError, match="without spaces"):
        vm_config.kernel_cmdline("9p", Path("/tmp/with space"), "/usr/bin/python3", Path("/repo"))
    with pytest.raises(LabError, match="without spaces"):
        vm_config.kernel_cmdline("9p", Path("/run/x/guest"), "/usr/bin/python3", Path("/repo"), ["/tmp/a,b"])
    with pytest.raises(LabError, match="at most 2047"):
        vm_config.kernel_cmdline("9p", Path("/run/x/guest"), "/usr/bin/python3", Path("/repo"), ["/tmp/" + "a" * 2000])
    line = vm_config.kernel_cmdline("9p", Path("/run/x/guest"), "/v/bin/python", Path("/repo"))
    assert line.endswith("tcplab.guest=/run/x/guest tcplab.python=/v/bin/python tcplab.repo=/repo")
    line = vm_config.kernel_cmdline("9p", Path("/run/x/guest"), "/tmp/c/.venv/bin/python", Path("/tmp/c"),
                                    ["/tmp/c", "/var/tmp/py"])
    assert line.endswith("tcplab.repo=/tmp/c tcplab.keep=/tmp/c,/var/tmp/py")


def test_a_repository_and_venv_under_the_guests_tmpfs_are_kept_visible():
    needed = [Path("/tmp/clone"), Path("/tmp/clone/.venv"), Path("/tmp/clone/.venv/bin"),
              Path("/root/.pyenv/versions/3.11.7"), Path("/root/.pyenv/versions/3.11.7/bin"),
              Path("/var/tmp/py/bin"), Path("/dev/shm/x"), Path("/tmpfoo/repo"), Path("/running/repo")]
    assert vm_config.paths_to_keep(needed) == ["/dev/shm/x", "/tmp/clone", "/var/tmp/py/bin"]
    assert vm_config.paths_to_keep([Path("/work/repo"), Path("/usr")]) == []
    with pytest.raises(LabError, match="the guests mount tmpfs there"):
        vm_config.paths_to_keep([Path("/run")])


def test_stage_1_mounts_tmpfs_where_the_lab_says_and_keeps_paths_across_them():
    script = vm_recipe.INIT_SCRIPT
    mounts = [script.index(f"mount -t tmpfs -o mode={mode} tmpfs /newroot{d}") for d, mode in
              vm_recipe.GUEST_TMPFS.items()]
    assert script.count("mount -t tmpfs") == len(vm_recipe.GUEST_TMPFS)
    set_aside = script.index('mount --bind "/newroot$p" "/keep/$n"')
    put_back = script.index('mount --move "/keep/$n" "/newroot$p"')
    # aside after the host root is mounted and before any tmpfs hides the paths; back after the last tmpfs
    assert script.index("hostroot /newroot") < set_aside < min(mounts) and max(mounts) < put_back
    assert put_back < script.index("exec switch_root")
    assert "tcplab.keep=*) keep=$(echo \"${arg#*=}\" | tr , ' ')" in script
    image = vm_recipe.KernelImage("linux-image-6.1.0-1-amd64", "1", "6.1.0-1-amd64", "9p", Path("/k"), Path("/i"))
    probe = vm_config.kvm_probe_argv(image)  # the KVM test boot looks for what stage 1 prints when asked
    assert "tcplab.probe=1" in probe[probe.index("-append") + 1].split() and "kvm" in probe
    assert f'tcplab.probe=1) echo "{vm_recipe.PROBE_OK}"; poweroff -f' in script


def test_the_guest_interpreter_is_this_one_and_finds_its_venv():
    python, needed = vm_host.guest_interpreter()
    assert Path(python).parent == Path(python).parent.resolve() and vm_host.REPO_ROOT in needed
    assert all(p == p.resolve() for p in needed)
    out = subprocess.run([python, "-c", "import sys; print(sys.prefix)"], capture_output=True, text=True,
                         check=True).stdout.strip()
    assert Path(out).resolve() == Path(sys.prefix).resolve()
    assert Path(sys.prefix).resolve() in needed


def test_exec_requests_are_checked():
    assert vm_guest.run_request({"argv": "ls"})["rc"] == 2
    assert vm_guest.run_request({"argv": ["/nonexistent/tool"]})["rc"] == 127
    assert vm_guest.run_request({"argv": ["true"]}) == {"rc": 0, "stdout": "", "stderr": ""}


KERNEL_PLAN = """version: 1
name: k
roles: [client, aqm, server]
kernels:
  deb61: {vanilla: true, package: linux-image-6.1.0-56-amd64}
  deb612: {vanilla: true, package: linux-image-6.12.117+deb12-amd64}
  built: {vanilla: false, source: {git: x, ref: v6.1}}
run:
  duration: 5s
  bottleneck: {at: {host: aqm, toward: client}, rate: 10mbit, queue: {kind: pfifo, limit: 100}}
  traffic: {src: server, dst: client, cc: reno, flows: 1}
  hosts:
    server: {kernel: SERVER}
    aqm: {kernel: deb61}
"""


def _kernel_plan(server: str):
    from orchestrator.plan import expand, load_plan_text
    plan = load_plan_text(KERNEL_PLAN.replace("SERVER", server), "k.yaml")
    return plan.kernels, expand(plan)


def test_the_plan_names_the_kernel_package_the_guests_boot():
    kernels, runs = _kernel_plan("deb61")
    assert vm_config.plan_kernel_package(kernels, runs, ("aqm",)) == "linux-image-6.1.0-56-amd64"
    assert vm_config.plan_kernel_package(kernels, runs, ("aqm", "server")) == "linux-image-6.1.0-56-amd64"
    assert vm_config.plan_kernel_package(kernels, runs, ("client",)) is None
    kernels, runs = _kernel_plan("deb612")
    with pytest.raises(LabError, match="one VM lab boots one kernel"):
        vm_config.plan_kernel_package(kernels, runs, ("aqm", "server"))
    kernels, runs = _kernel_plan("built")
    with pytest.raises(LabError, match="kernel variant built is a source build"):
        vm_config.plan_kernel_package(kernels, runs, ("aqm", "server"))
