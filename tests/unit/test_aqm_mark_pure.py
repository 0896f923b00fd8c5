"""The aqm_mark qdisc's netlink bytes (schemas/qdiscs/mark_netlink.py) and the module build's pure part
(orchestrator/kernel/modbuild.py), on literal bytes and names."""
from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.kernel import argv, modbuild
from schemas import rawqdisc
from schemas.qdiscs import mark_netlink as mn
from schemas.qdiscs.mark import Mark

# step, sojourn, min 2 ms, no max, 1000 packets, at dequeue, measured rate (host byte order: little endian)
STEP_2MS = bytes.fromhex(
    "0800" "0100" "00000000"              # MODE u32 0 (step)
    "0800" "0200" "00000000"              # METRIC u32 0 (sojourn)
    "0c00" "0300" "80841e0000000000"      # MIN_NS u64 2_000_000
    "0c00" "0400" "0000000000000000"      # MAX_NS u64 0
    "0800" "0500" "e8030000"              # LIMIT u32 1000
    "0500" "0600" "01000000"              # ON_DEQUEUE u8 1 (+3 bytes padding)
    "0c00" "0700" "0000000000000000"      # RATE u64 0
)
# what the guest kernel (6.1.0-56-amd64) dumped for step / est / 2 ms / 1000 packets / measured rate, read with
# orchestrator/kernel/mark_nl.py show: on x86-64 (efficient unaligned access) nla_put_u64_64bit adds no PAD
DUMP_EST_X86 = bytes.fromhex(
    "080001000000000008000200010000000c00030080841e00000000000c000400000000000000000008000500e803000005000600"
    "010000000c0007000000000000000000")
# the same settings as an architecture that aligns u64 attributes dumps them: PAD (type 8, empty) before a u64
DUMP_2MS = bytes.fromhex(
    "0800010000000000" "0800020000000000"
    "04000800" "0c00030080841e0000000000"
    "04000800" "0c0004000000000000000000"
    "08000500e8030000" "0500060001000000"
    "04000800" "0c0007000000000000000000"
)


def test_encode_step_is_the_literal_bytes():
    assert mn.encode_options("step", "sojourn", 2_000_000, None, 1000) == STEP_2MS


def test_encode_ramp_est_with_a_configured_rate():
    data = mn.encode_options("ramp", "est", 1_000_000, 5_000_000, 200, on_dequeue=False, rate_bytes_ps=2_500_000)
    assert data[:8] == bytes.fromhex("0800010001000000")       # ramp
    assert data[8:16] == bytes.fromhex("0800020001000000")     # est
    assert data[28:40] == bytes.fromhex("0c000400404b4c0000000000")  # max 5_000_000
    assert data[48:56] == bytes.fromhex("0500060000000000")    # at enqueue
    assert data[56:] == bytes.fromhex("0c000700a025260000000000")   # 2_500_000 B/s
    assert mn.decode_options(data) == {"mode": "ramp", "metric": "est", "min_ns": 1_000_000, "max_ns": 5_000_000,
                                       "limit_packets": 200, "on_dequeue": False, "rate_bytes_ps": 2_500_000}


def test_decode_the_guest_kernels_dump():
    assert mn.decode_options(DUMP_EST_X86) == {"mode": "step", "metric": "est", "min_ns": 2_000_000, "max_ns": 0,
                                               "limit_packets": 1000, "on_dequeue": True, "rate_bytes_ps": 0}
    assert DUMP_EST_X86 == mn.encode_options("step", "est", 2_000_000, None, 1000)


def test_decode_a_dump_skips_pad():
    assert mn.decode_options(DUMP_2MS) == {"mode": "step", "metric": "sojourn", "min_ns": 2_000_000, "max_ns": 0,
                                           "limit_packets": 1000, "on_dequeue": True, "rate_bytes_ps": 0}


def test_decode_rejects_truncated_and_wrong_sizes():
    with pytest.raises(mn.MarkNetlinkError):
        mn.decode_options(STEP_2MS[:-4])
    with pytest.raises(mn.MarkNetlinkError):
        mn.decode_options(bytes.fromhex("0600010000000000"))     # a u32 attribute with 2 bytes


def test_ramp_needs_max_above_min():
    with pytest.raises(mn.MarkNetlinkError):
        mn.encode_options("ramp", "sojourn", 2_000_000, 2_000_000, 100)


def test_options_for_a_plan_stage():
    stage = Mark(mode="step", min_ns=2_000_000, limit_packets=1000)
    assert mn.options_for(stage) == STEP_2MS


def test_xstats_and_pyroute2_hex():
    raw = bytes.fromhex("0a00000000000000" "0300000000000000" "0100000000000000" "0200000000000000"
                        "40420f0000000000")
    assert mn.decode_xstats(raw) == {"packets": 10, "marked": 3, "dropped": 1, "not_ect": 2, "drain_rate": 1_000_000}
    assert mn.from_hex("08:00:01:00") == b"\x08\x00\x01\x00"
    assert rawqdisc.parse_handle("2:1") == 0x20001 and rawqdisc.parse_handle("3:") == 0x30000
    assert rawqdisc.parse_handle("root") == 0xFFFFFFFF
    assert [rawqdisc.handle_text(h) for h in (0x20001, 0x30000, 0xFFFFFFFF)] == ["2:1", "3:", "root"]
    assert rawqdisc.hex_bytes("08:00:01:00") == "08000100" and rawqdisc.hex_bytes(None) == ""


def test_header_packages_of_the_vm_labs_kernels():
    hp = modbuild.header_packages("linux-image-6.1.0-56-amd64")
    assert hp.names == ["linux-headers-6.1.0-56-amd64", "linux-headers-6.1.0-56-common", "linux-kbuild-6.1"]
    assert hp.release == "6.1.0-56-amd64"
    assert hp.flavour_dir(Path("/c")) == Path("/c/usr/src/linux-headers-6.1.0-56-amd64")
    cloud = modbuild.header_packages("linux-image-6.1.0-56-cloud-amd64")
    assert cloud.flavour == "linux-headers-6.1.0-56-cloud-amd64" and cloud.common == "linux-headers-6.1.0-56-common"
    new = modbuild.header_packages("linux-image-6.12.43+deb12-amd64")
    assert new.kbuild == "linux-kbuild-6.12.43+deb12"
    with pytest.raises(modbuild.ModuleBuildError):
        modbuild.header_packages("linux-image-amd64")


def test_flavour_makefile_is_pointed_into_the_unpacked_tree():
    text = "include /usr/src/linux-headers-6.1.0-56-common/Makefile\n"
    assert (modbuild.relocated_makefile(text, Path("/cache/root"))
            == "include /cache/root/usr/src/linux-headers-6.1.0-56-common/Makefile\n")
    with pytest.raises(modbuild.ModuleBuildError):
        modbuild.relocated_makefile("all:\n", Path("/x"))


def test_compiler_from_kernelvariables():
    text = "CCACHE = ccache\nCC = $(if $(DEBIAN_KERNEL_USE_CCACHE),$(CCACHE)) $(CROSS_COMPILE)gcc-12\n"
    assert modbuild.compiler_from_variables(text) == "gcc-12"
    assert modbuild.compiler_from_variables("") == "gcc"


def test_cache_key_changes_with_sources_headers_and_compiler():
    src = {"a.c": b"int x;", "Kbuild": b"obj-m += a.o\n"}
    key = modbuild.cache_key(src, "6.1.192-2", "gcc-12 (Debian 12.2.0-14) 12.2.0")
    assert len(key) == 64
    assert key == modbuild.cache_key(dict(reversed(src.items())), "6.1.192-2", "gcc-12 (Debian 12.2.0-14) 12.2.0")
    assert key != modbuild.cache_key({**src, "a.c": b"int y;"}, "6.1.192-2", "gcc-12 (Debian 12.2.0-14) 12.2.0")
    assert key != modbuild.cache_key(src, "6.1.193-1", "gcc-12 (Debian 12.2.0-14) 12.2.0")
    assert key != modbuild.cache_key(src, "6.1.192-2", "gcc-12 (Debian 12.2.0-15) 12.2.0")


def test_module_sources_leave_out_build_products(tmp_path):
    for name, data in {"m.c": b"x", "m.h": b"h", "Kbuild": b"k", "Makefile": b"M", "m.mod.c": b"gen", "m.o": b"o",
                       "m.ko": b"ko", ".m.o.cmd": b"c"}.items():
        (tmp_path / name).write_bytes(data)
    assert set(modbuild.module_sources(tmp_path)) == {"m.c", "m.h", "Kbuild", "Makefile"}


def test_argv_and_the_module_sources_in_the_repository():
    assert argv.module_build(Path("/k"), Path("/m"), jobs=2) == ["make", "-C", "/k", "-j2", "M=/m", "modules"]
    assert argv.modinfo_vermagic(Path("/m/x.ko")) == ["modinfo", "-F", "vermagic", "/m/x.ko"]
    src = modbuild.module_sources(modbuild.MODULES_DIR / "sch_aqm_mark")
    assert set(src) == {"Kbuild", "Makefile", "sch_aqm_mark.c"}
    assert b'MODULE_LICENSE("GPL")' in src["sch_aqm_mark.c"]
    with pytest.raises(modbuild.ModuleBuildError):
        modbuild.check_vermagic("6.1.0-56-amd64 SMP preempt mod_unload modversions", "6.1.0-55-amd64 SMP")
    modbuild.check_vermagic("6.1.0-56-amd64 SMP preempt mod_unload modversions ",
                            "6.1.0-56-amd64 SMP preempt mod_unload modversions\n")


def test_the_c_attribute_numbers_match_the_python_ones():
    """The enum in the module's source and mark_netlink's numbers are the same list."""
    c = (modbuild.MODULES_DIR / "sch_aqm_mark" / "sch_aqm_mark.c").read_text()
    enum = c[c.index("TCA_AQM_MARK_UNSPEC,"):c.index("__TCA_AQM_MARK_MAX")]
    names = [line.strip().split(",")[0] for line in enum.splitlines()[1:] if line.strip()]
    assert names == ["TCA_AQM_MARK_MODE", "TCA_AQM_MARK_METRIC", "TCA_AQM_MARK_MIN_NS", "TCA_AQM_MARK_MAX_NS",
                     "TCA_AQM_MARK_LIMIT", "TCA_AQM_MARK_ON_DEQUEUE", "TCA_AQM_MARK_RATE", "TCA_AQM_MARK_PAD"]
    assert [mn.MODE, mn.METRIC, mn.MIN_NS, mn.MAX_NS, mn.LIMIT, mn.ON_DEQUEUE, mn.RATE, mn.PAD] == list(range(1, 9))
