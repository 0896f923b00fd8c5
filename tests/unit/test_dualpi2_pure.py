"""DualPI2 without a patched tc, and 7.2 guest kernels from Debian unstable: the pure parts, on literal bytes and
text (schemas/qdiscs/dualpi2_netlink.py, orchestrator/lab/apt_suite.py, orchestrator/kernel/modbuild.py).

The dump below is the guest kernel's own (Debian 7.2.13 + sch_dualpi2.ko built by tcplab, configured by
tests/lab/test_dualpi2.py with limit 1000 and the defaults written out), as dualpi2_nl printed it."""
from __future__ import annotations

import struct
from pathlib import Path

import numpy as np
import pytest
from pydantic import ValidationError

from orchestrator.kernel import argv, modbuild
from orchestrator.lab import apt_suite
from schemas.qdiscs import dualpi2_netlink as dn
from schemas.qdiscs.dualpi2 import DualPi2

GUEST_DUMP = bytes.fromhex(
    "08000100e8030000" "0800020020342e00" "08000300983a0000" "08000400803e0000" "0800050028000000"
    "0800060032030000" "08000800e8030000" "0800090000000000" "05000a0002000000" "05000b0001000000"
    "05000c0000000000" "05000d000a000000" "05000e0001000000" "05000f0001000000")
ASKED = {dn.LIMIT: 1000, dn.TARGET: 15000, dn.TUPDATE: 16000, dn.STEP_THRESH_US: 1000, dn.COUPLING: 2,
         dn.ECN_MASK: 1}


def test_the_guest_kernels_dump_decodes():
    assert dn.decode_options(GUEST_DUMP) == {
        "limit_packets": 1000, "memory_limit_bytes": 3028000,  # 1000 * 2 * 1514: get_memory_limit's rule of thumb
        "target_us": 15000, "tupdate_us": 16000, "alpha": 40, "beta": 818, "step_thresh_us": 1000,
        "min_qlen_step": 0, "coupling_factor": 2, "drop_overload": True, "drop_early": False,
        "c_protection_pct": 10, "ecn_mask": "l4s_ect", "split_gso": True}
    assert dn.readback_mismatches(ASKED, dn.decode_options(GUEST_DUMP)) == []
    assert dn.readback_mismatches({**ASKED, dn.COUPLING: 3}, dn.decode_options(GUEST_DUMP)) == [
        "coupling_factor: asked 3, kernel has 2"]


def test_encoding_is_the_kernels_attribute_layout():
    assert dn.encode({dn.LIMIT: 1000, dn.COUPLING: 2}) == (b"\x08\x00\x01\x00\xe8\x03\x00\x00"
                                                            b"\x05\x00\x0a\x00\x02\x00\x00\x00")
    # the attributes the test sent, in the order and with the padding of the kernel's own dump
    sent = dn.encode(ASKED)
    assert sent == (bytes.fromhex("08000100e8030000") + bytes.fromhex("08000300983a0000")
                    + bytes.fromhex("08000400803e0000") + bytes.fromhex("08000800e8030000")
                    + bytes.fromhex("05000a0002000000") + bytes.fromhex("05000e0001000000"))
    assert all(chunk in GUEST_DUMP for chunk in (sent[i:i + 8] for i in range(0, len(sent), 8)))
    with pytest.raises(dn.Dualpi2NetlinkError):
        dn.encode({dn.STEP_THRESH_PKTS: 5, dn.STEP_THRESH_US: 1000})
    with pytest.raises(dn.Dualpi2NetlinkError):
        dn.encode({99: 1})


def test_the_plan_stage_is_the_encoders_input():
    stage = DualPi2(limit_packets=1000, target_ns=15_000_000, tupdate_ns=16_000_000, step_thresh_ns=1_000_000,
                    coupling_factor=2, ecn_mask="l4s_ect")
    assert dn.values_for(stage) == ASKED
    assert dn.options_for(stage) == dn.encode(ASKED)
    assert dn.values_for(DualPi2()) == {}   # unset: the kernel's defaults
    assert dn.values_for(DualPi2(ecn_mask="any_ect", split_gso=False)) == {dn.ECN_MASK: 3, dn.SPLIT_GSO: 0}
    assert dn.values_for(DualPi2(alpha=41, beta=819)) == {dn.ALPHA: 41, dn.BETA: 819}
    # what the kernel cannot take is refused by the stage (so a plan is refused when it is expanded) ...
    for bad in ({"target_ns": 15_000_500}, {"step_thresh_ns": 1}, {"coupling_factor": 300}, {"alpha": 2**31}):
        with pytest.raises(ValidationError):
            DualPi2(**bad)
    # ... and by the encoder, for a stage built without validation
    with pytest.raises(dn.Dualpi2NetlinkError, match="whole number of µs"):
        dn.values_for(DualPi2.model_construct(target_ns=15_000_500))
    with pytest.raises(dn.Dualpi2NetlinkError, match="u8"):
        dn.values_for(DualPi2.model_construct(coupling_factor=300))


def test_what_the_kernel_holds_for_rounded_and_saturated_values():
    assert dn.alpha_beta_roundtrip(41) == 40 and dn.alpha_beta_roundtrip(819) == 818   # as the dump shows
    assert dn.readback_mismatches({dn.ALPHA: 41, dn.BETA: 819}, {"alpha": 40, "beta": 818}) == []
    assert dn.kernel_holds(dn.STEP_THRESH_US, 5_000_000) == 4_294_967   # u32 ns saturates at ~4.29 s
    assert dn.kernel_holds(dn.TARGET, 5_000_000) == 5_000_000          # kept in a u64


GUEST_XSTATS = bytes.fromhex(  # the same guest after the test's 30 s transfer (queues empty again)
    "000000000000000000000000d33100006a180000800000001c0f0000660900001051feff0000000080b2060020342e00")


def test_xstats_decode():
    assert dn.decode_xstats(GUEST_XSTATS) == {
        "prob": 0, "p_prime": 0.0, "delay_c_us": 0, "delay_l_us": 0, "packets_in_c": 12755, "packets_in_l": 6250,
        "maxq": 128, "ecn_mark": 3868, "step_marks": 2406, "credit": -110320, "memory_used": 0,
        "max_memory_used": 438912, "memory_limit": 3028000}
    raw = struct.pack("=8Ii3I", 0x20000000, 15210, 120, 19287, 6250, 29, 2943, 1525, -115360, 0, 104576, 3028000)
    xs = dn.decode_xstats(raw)
    assert xs["prob"] == 0x20000000 and xs["p_prime"] == pytest.approx(0.125)
    assert xs["credit"] == -115360 and xs["step_marks"] == 1525 and xs["memory_limit"] == 3028000
    with pytest.raises(dn.Dualpi2NetlinkError):
        dn.decode_xstats(raw[:40])


# ---------------------------------------------------------------- unstable suite, split kernel packages
DEBIAN_SOURCES = """Types: deb
# http://snapshot.debian.org/archive/debian/20250520T000000Z
URIs: http://deb.debian.org/debian
Suites: bookworm bookworm-updates
Components: main

Types: deb
URIs: http://deb.debian.org/debian-security
Suites: bookworm-security
"""
IMAGE_SHOW = """Package: linux-image-7.2.13+deb14-amd64
Version: 7.2.13-1
Installed-Size: 15
Depends: dracut | initramfs-tools (>= 0.120+deb8u2) | linux-initramfs-tool, linux-base-7.2.13+deb14-amd64 (= 7.2.13-1), linux-binary-7.2.13+deb14-amd64 (= 7.2.13-1), linux-modules-7.2.13+deb14-amd64 (= 7.2.13-1)
Size: 1892
"""  # noqa: E501 (apt-cache show's line, verbatim)
OLD_SHOW = ("Package: linux-image-6.1.0-56-amd64\n"
            "Depends: kmod, linux-base (>= 4.3~), initramfs-tools (>= 0.120+deb8u2)\n")


def test_the_unstable_suite_uses_the_machines_mirror_and_a_private_index():
    assert apt_suite.mirror_from_sources([DEBIAN_SOURCES]) == "http://deb.debian.org/debian"
    assert apt_suite.mirror_from_sources(["deb [arch=amd64] http://ftp.de.debian.org/debian/ bookworm main\n"]) \
        == "http://ftp.de.debian.org/debian"
    assert apt_suite.mirror_from_sources(["deb https://packages.cloud.google.com/apt cloud-sdk main\n"]) \
        == apt_suite.DEFAULT_MIRROR
    assert apt_suite.sources_line("http://m/debian", "unstable") == (
        "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://m/debian unstable main\n")
    opts = apt_suite.options(Path("/c/apt/unstable"))
    assert "Dir::Etc::sourcelist=/c/apt/unstable/sources.list" in opts and "Dir::Etc::sourceparts=-" in opts
    assert apt_suite.update_argv(opts)[-1] == "update"


def test_a_72_image_is_its_split_parts():
    deps = apt_suite.depends(IMAGE_SHOW)
    assert deps[0] == "dracut" and "linux-modules-7.2.13+deb14-amd64" in deps
    assert apt_suite.split_parts("linux-image-7.2.13+deb14-amd64", deps) == [
        "linux-base-7.2.13+deb14-amd64", "linux-binary-7.2.13+deb14-amd64", "linux-modules-7.2.13+deb14-amd64"]
    assert apt_suite.split_parts("linux-image-6.1.0-56-amd64", apt_suite.depends(OLD_SHOW)) == [
        "linux-image-6.1.0-56-amd64"]


# ---------------------------------------------------------------- building against 7.2's headers with gcc 12
MAKEFILE_72 = ("KBUILD_OUTPUT=/usr/src/linux-headers-7.2.13+deb14-amd64\n"
               "include /usr/src/linux-headers-7.2.13+deb14-common/Makefile\n")
GLIBC = ("/c/usr/src/linux-headers-7.2.13+deb14-amd64/tools/objtool/objtool: /lib/x86_64-linux-gnu/libc.so.6: "
         "version `GLIBC_2.38' not found (required by /c/usr/src/linux-headers-7.2.13+deb14-amd64/tools/objtool/"
         "objtool)")


def test_72_headers_and_source_package_names():
    hp = modbuild.header_packages("linux-image-7.2.13+deb14-amd64")
    assert hp.names == ["linux-headers-7.2.13+deb14-amd64", "linux-headers-7.2.13+deb14-common",
                        "linux-kbuild-7.2.13+deb14"]
    assert modbuild.source_package("linux-image-7.2.13+deb14-amd64") == "linux-source-7.2"
    assert modbuild.source_package("linux-image-6.1.0-56-cloud-amd64") == "linux-source-6.1"
    assert modbuild.relocated_makefile(MAKEFILE_72, Path("/c")) == (
        "KBUILD_OUTPUT=/c/usr/src/linux-headers-7.2.13+deb14-amd64\n"
        "include /c/usr/src/linux-headers-7.2.13+deb14-common/Makefile\n")
    assert modbuild.source_module_files("sch_dualpi2", b"int x;") == {
        "sch_dualpi2.c": b"int x;", "Kbuild": b"obj-m += sch_dualpi2.o\n"}


def test_compiler_substitution_for_gcc16_headers():
    config = ("CONFIG_CC_VERSION_TEXT=\"x86_64-linux-gnu-gcc-16 (Debian 16.2.0-4) 16.2.0\"\n"
              "CONFIG_CC_HAS_MIN_FUNCTION_ALIGNMENT=y\nCONFIG_DEBUG_INFO_BTF_MODULES=y\n"
              "# CONFIG_NET_SCH_DUALPI2 is not set\n")
    assert modbuild.config_state(config, "CONFIG_NET_SCH_DUALPI2") is None
    assert modbuild.config_state(config, "CONFIG_DEBUG_INFO_BTF_MODULES") == "y"
    tools = (Path("/s/tools/objtool/objtool"), Path("/s/scripts/mod/modpost"))
    assert modbuild.substitute_compiler_vars(config, "gcc", tools) == [
        "CC=gcc", "CONFIG_CC_HAS_MIN_FUNCTION_ALIGNMENT=", "CONFIG_DEBUG_INFO_BTF_MODULES=",
        "objtool=/s/tools/objtool/objtool", "MODPOST=/s/scripts/mod/modpost"]
    assert modbuild.substitute_compiler_vars("", "gcc", None) == ["CC=gcc"]
    assert modbuild.needs_newer_glibc(GLIBC)
    assert not modbuild.needs_newer_glibc("usage: objtool COMMAND [ARGS]")
    assert argv.module_build(Path("/k"), Path("/m"), 2, ["CC=gcc"]) == ["make", "-C", "/k", "-j2", "M=/m", "CC=gcc",
                                                                        "modules"]


# ---------------------------------------------------------------- the coupling check of tests/lab/test_dualpi2.py
def _sample(t: float, p: float, marks: int, steps: int, delay_c_us: int = 15000) -> dict:
    return {"t": t, "xstats": {"p_prime": p, "ecn_mark": marks, "step_marks": steps, "delay_c_us": delay_c_us}}


def test_backlog_at_dequeue_from_paired_times():
    from tests.lab.dualpi2_coupling import backlog_at_dequeue

    # three 1514-byte packets arrive at 0, 1, 2 and leave at 10, 11, 12: the first leaves two behind
    ts_in, ts_out = np.array([0, 1, 2]), np.array([10, 11, 12])
    assert backlog_at_dequeue(ts_in, ts_out, np.array([1514] * 3)).tolist() == [3028, 1514, 0]
    # one arriving after the first left is not behind it
    assert backlog_at_dequeue(np.array([0, 11]), np.array([10, 12]), np.array([100, 100])).tolist() == [0, 0]


def test_coupling_counts_only_steady_intervals():
    from tests.lab.dualpi2_coupling import coupling, steady_intervals

    samples = [_sample(0.0, 0.1, 0, 0), _sample(0.1, 0.1, 30, 5), _sample(0.5, 0.1, 40, 5),   # 0.4 s gap
               _sample(0.6, 0.3, 60, 5, delay_c_us=60000)]                                     # queue too long
    assert steady_intervals(samples, 0.25, 15000).tolist() == [0]
    ns = 1_000_000_000
    ts_l = np.array([0.01, 0.02, 0.03, 0.2]) * ns      # three in the steady interval, one in the stalled one
    ts_c = np.array([0.05, 0.06, 0.3]) * ns
    ce_c = np.array([1.0, 0.0, 1.0])
    r = coupling(samples, ts_l, ts_c, ce_c, 2, 0.25, 15000, np.ones(4, bool), np.ones(3, bool))
    assert r["steady_intervals"] == 1 and r["l_packets"] == 3 and r["c_packets"] == 2
    assert r["coupled_l"] == 30 - 5 - 1                  # Δecn_mark − Δstep_marks − classic CE in the interval
    assert r["expected_l"] == pytest.approx(3 * 0.2) and r["expected_c"] == pytest.approx(2 * 0.01)
    assert r["ce_c"] == 1 and r["expected_c_if_linear"] == pytest.approx(0.2)
    none_eligible = coupling(samples, ts_l, ts_c, ce_c, 2, 0.25, 15000, np.zeros(4, bool), np.zeros(3, bool))
    assert none_eligible["expected_l"] == 0 and none_eligible["expected_c"] == 0
