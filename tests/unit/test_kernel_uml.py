"""User-Mode Linux kernels (`arch: um`), the parts that need no build: the key, the plan field, the build's argv
and steps, the entry layout, the stock variant's files, and which UML kernel a lab is given
(orchestrator/kernel/spec.py, argv.py, umbuild.py, uml.py; docs/kernels.md, "UML kernels")."""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from orchestrator.kernel import argv, builder, cache, commands, umbuild, uml
from orchestrator.kernel.spec import REPRODUCIBLE_ENV, BuildInputs, FileInput, SourceRef, parse_config
from orchestrator.plan import PlanError, load_plan, load_plan_text
from orchestrator.plan.model.kernels import KernelSource, KernelVariant

ROOT = Path(__file__).resolve().parents[2]
KERNELS = ROOT / "experiments" / "kernels"
INPUTS = BuildInputs(variant="prr-fix", source=SourceRef("debian-package", "linux-source-6.1", "6.1.192-2"),
                     config_base="tinyconfig", patches=(FileInput("patches/a.patch", "aa" * 32),),
                     fragments=(FileInput("configs/net.config", "bb" * 32),), localversion="-prr",
                     toolchain={"gcc": "gcc (Debian 12.2.0-14+deb12u1) 12.2.0", "ld": "GNU ld 2.40", "make": "4.3"})
# INPUTS' key before `arch` existed: x86_64 builds keep their keys (cache entries, recorded build keys)
X86_KEY = "20e1dc8bf8af0d7b8abb1685480705153c17a1bf68310d01a33b522faea4bb50"
TREE, OUT = Path("/b/src/linux-source-6.1"), Path("/b/out")


def test_the_arch_is_in_the_key_and_x86_keys_are_unchanged():
    um = dataclasses.replace(INPUTS, arch="um")
    assert INPUTS.arch == "x86_64" and INPUTS.key == X86_KEY
    assert um.key != INPUTS.key and um.content()["arch"] == "um" and "arch" not in INPUTS.content()
    assert um.canonical()["arch"] == "um" and INPUTS.canonical()["arch"] == "x86_64"   # metadata names both
    assert dataclasses.replace(um, variant="other").key == um.key


def test_a_variant_says_arch_um_and_its_hash_moves_only_then():
    src = {"package": "linux-source-6.1", "config_base": "defconfig"}
    x86 = KernelVariant(vanilla=False, source=KernelSource(**src))
    assert x86.source is not None and x86.source.arch == "x86_64"
    assert KernelVariant(vanilla=False, source=KernelSource(**src, arch="x86_64")).content_hash() == x86.content_hash()
    assert KernelVariant(vanilla=False, source=KernelSource(**src, arch="um")).content_hash() != x86.content_hash()


@pytest.mark.parametrize("extra", ["arch: um", "arch: um\n      config_base: debian"])
def test_arch_um_on_debians_config_is_refused_naming_file_line_and_field(extra):
    text = f"""name: x
kernels:
  u:
    vanilla: false
    source:
      package: linux-source-6.1
      {extra}
run:
  duration: 5s
  traffic: {{src: server, dst: client, cc: reno, flows: 1}}
"""
    with pytest.raises(PlanError) as e:
        load_plan_text(text, "p.yaml")
    issue = str(e.value.issues[0])
    assert issue.startswith("p.yaml:6:7: kernels.u.source: arch um: config_base debian") and "defconfig" in issue


def test_arch_um_on_a_typo_is_refused():
    with pytest.raises(ValueError, match="arch"):
        KernelSource(package="linux-source-6.1", config_base="defconfig", arch="uml")


def test_um_argv_set_the_architecture_for_every_make():
    assert argv.arch_vars("x86_64") == () and argv.arch_vars("um") == ("ARCH=um",)
    assert argv.modules_install(TREE, OUT / "modules", "um") == [
        "make", "-C", str(TREE), "ARCH=um", "INSTALL_MOD_PATH=/b/out/modules", "INSTALL_MOD_STRIP=1",
        "modules_install"]
    assert argv.modules_install(TREE, OUT / "modules", "um", module_dir=Path("/b/m/sch_aqm_mark")) == [
        "make", "-C", str(TREE), "ARCH=um", "M=/b/m/sch_aqm_mark", "INSTALL_MOD_PATH=/b/out/modules",
        "INSTALL_MOD_STRIP=1", "modules_install"]
    assert argv.depmod(OUT / "modules", "6.1.192-uml-0123456789") == [
        "depmod", "-b", "/b/out/modules", "6.1.192-uml-0123456789"]


def test_the_um_build_steps_in_order():
    steps = umbuild.compile_steps(TREE, OUT, Path("/b"), jobs=2)
    assert [(s.name, s.argv) for s in steps] == [
        ("make ARCH=um linux modules", ["make", "-C", str(TREE), "-j2", "ARCH=um", "linux", "modules"]),
        ("make ARCH=um modules_install", argv.modules_install(TREE, OUT / "modules", "um"))]
    # the same fixed timestamp, user and host; the build directory (it names the builder's pid) out of the
    # debug info, so that two builds of one key give the same files
    assert steps[0].env == {**REPRODUCIBLE_ENV, "KCFLAGS": "-fdebug-prefix-map=/b=/tcplab-build",
                            "KAFLAGS": "-fdebug-prefix-map=/b=/tcplab-build"}
    assert steps[1].env == REPRODUCIBLE_ENV
    mod = umbuild.module_install_step(TREE, Path("/b/work/modules/sch_aqm_mark"), OUT)
    assert mod.name == "install module sch_aqm_mark" and "M=/b/work/modules/sch_aqm_mark" in mod.argv
    assert umbuild.index_step(OUT, "6.1.192-uml-0123456789").argv == argv.depmod(OUT / "modules",
                                                                                 "6.1.192-uml-0123456789")


def test_the_um_entry_layout():
    e, rel = Path("/c/3383bc4b"), "6.1.192-uml-3383bc4b61"
    assert umbuild.modules_root(e, rel) == e / "modules/lib/modules" / rel
    assert umbuild.extra_dir(e, rel) == e / "modules/lib/modules" / rel / "extra"
    assert umbuild.tree_links(e, rel) == [e / "modules/lib/modules" / rel / "build",
                                          e / "modules/lib/modules" / rel / "source"]


def test_configure_refuses_debians_config_for_um_before_running_anything(tmp_path):
    inputs = dataclasses.replace(INPUTS, arch="um", config_base="debian")
    ran: list[str] = []
    steps = builder._Steps(tmp_path / "log", ran.append)
    with pytest.raises(builder.BuildError, match="config_base debian .* arch um"):
        builder.configure(inputs, tmp_path, tmp_path, tmp_path, steps, jobs=1)
    assert ran == []


# ------------------------------------------------------------------ the stock variant's files

REQUIRED = {
    "CONFIG_ENABLE_DEFAULT_TRACERS": "y", "CONFIG_EVENT_TRACING": "y", "CONFIG_HZ_1000": "y", "CONFIG_HZ": "1000",
    "CONFIG_HIGH_RES_TIMERS": "y", "CONFIG_IKCONFIG_PROC": "y", "CONFIG_MODULES": "y", "CONFIG_MODULE_UNLOAD": "y",
    "CONFIG_UML_NET_VECTOR": "y", "CONFIG_HOSTFS": "y", "CONFIG_TMPFS": "y", "CONFIG_DEVTMPFS": "y",
    "CONFIG_PACKET": "y", "CONFIG_UNIX": "y", "CONFIG_IPV6": "y", "CONFIG_BRIDGE": "y", "CONFIG_TUN": "y",
    "CONFIG_VETH": "y", "CONFIG_BPF_SYSCALL": "y", "CONFIG_IFB": "y", "CONFIG_NET_ACT_MIRRED": "y",
    **{f"CONFIG_NET_SCH_{q}": "y" for q in ("NETEM", "HTB", "RED", "FQ", "FQ_CODEL", "CODEL", "PIE", "FQ_PIE",
                                             "TBF", "CAKE", "SFQ", "PRIO", "INGRESS")},
    "CONFIG_NET_CLS_U32": "y", "CONFIG_NET_CLS_BPF": "y",
    **{f"CONFIG_TCP_CONG_{c}": "y" for c in ("DCTCP", "BBR", "CUBIC", "VEGAS", "WESTWOOD", "HTCP", "BIC")},
}


def test_the_uml_lab_fragment_holds_what_the_lab_needs_built_in():
    fragment = parse_config((KERNELS / "configs" / "uml-lab.config").read_text())
    assert {k: fragment.get(k) for k in REQUIRED} == REQUIRED
    # 7.2 has no UML_NET (the vector NICs stand alone there): 6.1's menu is its own fragment
    assert "CONFIG_UML_NET" not in fragment
    assert parse_config((KERNELS / "configs" / "uml-6.1-net.config").read_text()) == {"CONFIG_UML_NET": "y"}
    assert [k for k, v in fragment.items() if v == "m"] == []       # built in: no module loading for the studies
    assert "CONFIG_KPROBES" not in fragment                          # UML has none


def test_the_stock_variant_is_a_um_build_of_debians_source_with_the_projects_patches():
    name, variant, plan_dir = uml.stock_variant()
    src = variant.source
    assert name == "uml-6.1" and plan_dir == KERNELS and src is not None
    assert (src.arch, src.config_base, src.package) == ("um", "defconfig", "linux-source-6.1")
    assert [(plan_dir / p).resolve() for p in src.patches] == [
        KERNELS / "patches" / name
        for name in ("uml-hz-1000.patch", "uml-host-xstate.patch", "uml-kernel-remap.patch", "uml-wallclock.patch",
                     "uml-vector-max-mtu.patch")]
    assert [(plan_dir / c).resolve() for c in src.config] == [KERNELS / "configs" / "uml-lab.config",
                                                              KERNELS / "configs" / "uml-6.1-net.config"]
    assert sorted(Path(m).name for m in variant.modules) == ["sch_aqm_mark", "tcp_dctcp_flaws"]
    assert all((plan_dir / m / "Kbuild").is_file() for m in variant.modules)
    assert load_plan(uml.STOCK_PLAN).kernels[name] == variant


def test_the_xstate_patch_sizes_the_transfers_from_the_host_and_the_stacks_hold_the_buffer():
    """The patch's transfers use the size the host reported; its buffer (16 KiB) sits in each task's thread_info
    at the bottom of the kernel stack, so the fragment asks for 64 KiB stacks (order 4)."""
    text = (KERNELS / "patches" / "uml-host-xstate.patch").read_text()
    added = [ln[1:].strip() for ln in text.splitlines() if ln.startswith("+") and not ln.startswith("+++")]
    assert added.count("iov.iov_len = host_xstate_bytes;") == 2 and "host_xstate_bytes = iov.iov_len;" in added
    assert "DEFINE_LONGS(HOST_FP_SIZE, 16384);" in added
    fragment = dict(ln.split("=", 1) for ln in (KERNELS / "configs" / "uml-lab.config").read_text().splitlines()
                    if ln.startswith("CONFIG_"))
    assert int(fragment["CONFIG_KERNEL_STACK_ORDER"]) >= 4      # 4 KiB << 4 = 64 KiB > 16 KiB + a call chain


def test_the_remap_patch_maps_present_kernel_pages_in_place_and_unmaps_only_absent_ones():
    text = (KERNELS / "patches" / "uml-kernel-remap.patch").read_text()
    body = text[text.index("--- a/arch/um/kernel/tlb.c"):]
    removed = [ln[1:].strip() for ln in body.splitlines() if ln.startswith("-") and not ln.startswith("---")]
    added = [ln[1:].strip() for ln in body.splitlines() if ln.startswith("+") and not ln.startswith("+++")]
    assert "if (!pte_present(*pte) || pte_newpage(*pte)) {" in removed     # unmap, then map again: the window
    assert "if (!pte_present(*pte)) {" in added and "else if (pte_newpage(*pte)) {" in added
    code = [ln for ln in added if not ln.startswith(("/*", "*"))]
    # the munmap stays in the not-present branch only: the present branch maps, never unmaps
    present = code[code.index("else if (pte_newpage(*pte)) {"):]
    assert not any("add_munmap" in ln for ln in present) and any("add_mmap" in ln for ln in present)


def test_the_wallclock_patch_sets_the_clock_from_the_machines_after_the_clocksource_switch():
    text = (KERNELS / "patches" / "uml-wallclock.patch").read_text()
    added = [ln[1:].strip() for ln in text.splitlines() if ln.startswith("+") and not ln.startswith("+++")]
    assert "late_initcall(um_wallclock_resync);" in added            # after fs_initcall's clocksource switch
    assert "ts = ns_to_timespec64(os_persistent_clock_emulation());" in added
    assert "return do_settimeofday64(&ts);" in added
    assert "if (time_travel_mode != TT_MODE_OFF)" in added            # time travel keeps its own time


@pytest.mark.parametrize("patch", ["uml-hz-1000.patch", "uml-7.2-hz-1000.patch"])
def test_the_hz_patch_turns_the_fixed_hz_into_the_generic_choice(patch):
    text = (KERNELS / "patches" / patch).read_text()
    body = text[text.index("--- a/arch/um/Kconfig"):]
    assert body.splitlines()[:2] == ["--- a/arch/um/Kconfig", "+++ b/arch/um/Kconfig"]
    assert "-config HZ\n-\tint\n-\tdefault 100\n+source \"kernel/Kconfig.hz\"\n" in body


def test_the_dualpi2_variant_is_7_2_with_the_stock_fragment_and_only_the_patches_7_2_needs():
    """Linux 7.2 sizes the host's XSAVE area at boot and remaps present kernel pages in place itself: the
    variant leaves 6.1's two patches for those out, and 6.1's network menu fragment (7.2 has no UML_NET)."""
    plan = load_plan(KERNELS / "uml-7.2.yaml")
    variant = plan.kernels["uml-7.2"]
    src = variant.source
    assert (src.arch, src.config_base, src.package) == ("um", "defconfig", "linux-source-7.2")
    assert src.patches == ["patches/uml-7.2-hz-1000.patch", "patches/uml-wallclock.patch",
                           "patches/uml-vector-max-mtu.patch"]
    assert src.config == ["configs/uml-lab.config", "configs/dualpi2.config"]
    assert parse_config((KERNELS / "configs" / "dualpi2.config").read_text()) == {"CONFIG_NET_SCH_DUALPI2": "y"}
    assert variant.modules == []


# ------------------------------------------------------------------ which UML kernel a lab gets


def um_entry(root: Path, key: str, variant: str = "uml-6.1", arch: str = "um", tracing: bool = True,
             modules: tuple[str, ...] = ("sch_aqm_mark",), finished: str = "2026-01-01T00:00:00") -> Path:
    release = f"6.1.192-uml-{key[:10]}"
    e = root / key
    (umbuild.extra_dir(e, release)).mkdir(parents=True)
    (umbuild.modules_root(e, release) / "modules.dep").write_text("")
    for m in modules:
        (umbuild.extra_dir(e, release) / f"{m}.ko").write_bytes(b"\x7fELF")
    (e / "linux").write_bytes(b"\x7fELF")
    (e / "config").write_text("CONFIG_EVENT_TRACING=y\n" if tracing else "# CONFIG_EVENT_TRACING is not set\n")
    (e / "metadata.json").write_text(json.dumps({"key": key, "variant": variant, "arch": arch, "release": release,
                                                 "finished_at": finished}))
    return e


def test_a_cached_um_build_describes_its_binary_modules_and_tracing(tmp_path):
    e = um_entry(tmp_path, "ab" * 32)
    k = uml.find_uml_build("abab", tmp_path)
    rel = f"6.1.192-uml-{'ab' * 5}"
    assert k == uml.UmlKernel(binary=e / "linux", modules_root=e / "modules/lib/modules" / rel, release=rel,
                              build_key="ab" * 32, tracing=True, source="build:uml-6.1",
                              extra_modules=e / "modules/lib/modules" / rel / "extra")
    assert k.install_root == e / "modules"
    assert uml.find_uml_build(rel, tmp_path) == k and uml.find_uml_build("uml-6.1", tmp_path) == k
    assert uml.find_uml_build("cdcd", tmp_path) is None


def test_an_x86_build_is_not_a_uml_kernel(tmp_path):
    e = um_entry(tmp_path, "cd" * 32, variant="cwnd16", arch="x86_64")
    assert uml.find_uml_build("cwnd16", tmp_path) is None
    with pytest.raises(uml.UmlKernelError, match="x86_64, not a User-Mode Linux kernel"):
        uml.kernel_of_build(e, json.loads((e / "metadata.json").read_text()), "")
    assert not uml.kernel_of_build(um_entry(tmp_path, "ef" * 32, tracing=False, modules=()),
                                   {"key": "ef" * 32, "arch": "um", "release": "r", "variant": "v"}, "").tracing


def test_the_stock_build_is_found_by_the_stock_inputs_key(tmp_path, monkeypatch):
    um_entry(tmp_path, "ab" * 32, finished="2026-01-02")                  # another um build: newer, not stock
    stock = dataclasses.replace(INPUTS, arch="um")
    monkeypatch.setattr(uml, "stock_uml_inputs", lambda: stock)
    assert uml.find_uml_build(None, tmp_path) is None
    um_entry(tmp_path, stock.key)
    assert uml.find_uml_build(None, tmp_path).build_key == stock.key
    assert uml.stock_uml(tmp_path).build_key == stock.key
    assert uml.ensure_stock_uml(build=True, root=tmp_path).build_key == stock.key      # cached: nothing built


def fake_debian(tmp_path: Path, version_output: str = "6.1.176") -> tuple[Path, Path]:
    binary = tmp_path / "linux.uml"
    binary.write_text(f"#!/bin/sh\necho {version_output}\n")
    binary.chmod(0o755)
    (tmp_path / "modules" / "6.1.176").mkdir(parents=True)
    (tmp_path / "modules" / "6.1.176" / "modules.dep").write_text("")
    return binary, tmp_path / "modules"


def test_debians_package_has_its_modules_root_and_no_tracing(tmp_path):
    binary, modules = fake_debian(tmp_path)
    k = uml.debian_uml(binary, modules)
    assert k is not None
    assert (k.binary, k.modules_root, k.release, k.build_key, k.tracing, k.extra_modules, k.install_root) == (
        binary, modules / "6.1.176", "6.1.176", None, False, None, None)
    assert k.source.startswith("debian:user-mode-linux=")
    assert uml.debian_uml(tmp_path / "absent", modules) is None


def test_without_the_stock_build_the_lab_gets_debians_and_without_both_an_error(tmp_path, monkeypatch):
    binary, modules = fake_debian(tmp_path)
    monkeypatch.setattr(uml, "stock_uml_inputs", lambda: dataclasses.replace(INPUTS, arch="um"))
    monkeypatch.setattr(uml, "debian_uml", lambda: uml.kernel_of_debian(binary, "6.1.176", None, "6.1um4"))
    assert uml.stock_uml(tmp_path / "cache").source == "debian:user-mode-linux=6.1um4"
    assert uml.ensure_stock_uml(build=False, root=tmp_path / "cache").binary == binary
    monkeypatch.setattr(uml, "debian_uml", lambda: None)
    with pytest.raises(uml.UmlKernelError, match="tcplab kernel build experiments/kernels/uml-lab.yaml uml-6.1"):
        uml.stock_uml(tmp_path / "cache")


def test_kernel_ls_shows_the_arch(tmp_path, capsys):
    um_entry(tmp_path, "ab" * 32)
    (tmp_path / "cd" / "x").mkdir(parents=True)
    old = tmp_path / ("cd" * 32)
    old.mkdir()
    (old / "metadata.json").write_text(json.dumps({"key": "cd" * 32, "variant": "cwnd16", "release": "6.1.192-x"}))
    assert len(cache.entries(tmp_path)) == 2
    commands.cmd_ls(type("A", (), {"cache": tmp_path})(), None)
    lines = capsys.readouterr().out.splitlines()
    assert any(" uml-6.1 " in line and " um " in line for line in lines)
    assert any(" cwnd16 " in line and " x86_64 " in line for line in lines)    # an entry from before `arch`
