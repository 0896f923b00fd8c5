"""The UML lab's stock kernel for real (docs/kernels.md, "UML kernels"): experiments/kernels/uml-lab.yaml's
`uml-6.1` built with `make ARCH=um` from Debian's linux-source-6.1 into the shared cache
(/var/cache/tcplab/kernels: the first run builds it, ~6 min on 2 cores; later runs find it), then booted as a
process with the host's / over hostfs and a tiny sh init that reports what the lab relies on: `uname -r`
names the build key, the tcp:tcp_probe tracepoint exists, /proc/config.gz says HZ=1000, and the project's
sch_aqm_mark (built against the same tree) insmods and takes a qdisc."""
from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
from pathlib import Path

import pytest

from orchestrator.kernel import cache, umbuild, uml
from orchestrator.kernel.spec import parse_config
from tests.support.shipped import ROOT

NEEDED = ("gcc", "make", "flex", "bison", "bc", "patch", "dpkg-deb", "apt-get", "depmod", "modinfo")
SOURCE_TARBALL = Path("/usr/src/linux-source-6.1.tar.xz")      # the installed linux-source-6.1 package
BOOT_TIMEOUT_S = 30
INIT = """#!/bin/sh
# PID 1 of a UML test host: report, then power off (sysrq o). Each report is one `key=value` line.
PATH=/usr/sbin:/usr/bin:/sbin:/bin
export PATH
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t tracefs tracefs /sys/kernel/tracing
echo "release=$(uname -r)"
[ -d /sys/kernel/tracing/events/tcp/tcp_probe ] && echo tcp_probe=yes || echo tcp_probe=no
[ -d /sys/kernel/tracing/events/qdisc/qdisc_dequeue ] && echo qdisc_dequeue=yes || echo qdisc_dequeue=no
echo "hz=$(zcat /proc/config.gz | grep '^CONFIG_HZ=')"
insmod {ko} && echo insmod=ok
grep -q '^sch_aqm_mark ' /proc/modules && echo module=loaded
ip link set lo up
tc qdisc add dev lo root handle 1: aqm_mark && echo "qdisc=$(tc qdisc show dev lo)"
echo done=1
echo o > /proc/sysrq-trigger
sleep 10
"""


@pytest.fixture(autouse=True)
def _tools() -> None:
    missing = [t for t in NEEDED if shutil.which(t) is None]
    if missing:
        pytest.skip(f"kernel builds need {', '.join(missing)}: run `make apt`")
    if "Candidate: (none)" in subprocess.run(["apt-cache", "policy", "linux-source-6.1"], capture_output=True,
                                             text=True).stdout:
        pytest.skip("apt knows no linux-source-6.1 (apt-get update?)")


def test_the_hz_patch_applies_to_linux_source_6_1(tmp_path):
    if not SOURCE_TARBALL.exists():
        pytest.skip(f"needs {SOURCE_TARBALL} (apt-get install linux-source-6.1)")
    subprocess.run(["tar", "-xaf", str(SOURCE_TARBALL), "-C", str(tmp_path), "linux-source-6.1/arch/um/Kconfig",
                    "linux-source-6.1/kernel/Kconfig.hz"], check=True)
    tree = tmp_path / "linux-source-6.1"
    done = subprocess.run(["patch", "-d", str(tree), "-p1", "--forward", "--batch", "-i",
                           str(ROOT / "experiments/kernels/patches/uml-hz-1000.patch")], capture_output=True, text=True)
    assert done.returncode == 0 and "FAILED" not in done.stdout and "offset" not in done.stdout, done.stdout
    kconfig = (tree / "arch/um/Kconfig").read_text()
    assert 'source "kernel/Kconfig.hz"' in kconfig and not re.search(r"^config HZ$", kconfig, re.M)
    assert "config HZ_1000" in (tree / "kernel/Kconfig.hz").read_text()


@pytest.fixture(scope="module")
def stock() -> uml.UmlKernel:
    root = cache.DEFAULT_ROOT
    try:
        root.mkdir(parents=True, exist_ok=True)
    except PermissionError:
        pytest.skip(f"the kernel cache {root} is not writable here (root, or TCPLAB_KERNEL_CACHE)")
    kernel = uml.ensure_stock_uml(build=True, root=root, jobs=2, progress=lambda step: print(f"uml-6.1: {step}"))
    meta = cache.entry(root, kernel.build_key or "").metadata
    print(f"\nstock UML build {kernel.build_key[:16]} release {kernel.release}: {meta['duration_s']} s with "
          f"-j{meta['jobs']}")
    return kernel


def test_the_stock_uml_build_is_a_binary_and_a_module_tree(stock):
    e = cache.entry(cache.DEFAULT_ROOT, stock.build_key)
    meta = e.metadata
    assert meta["arch"] == "um" and meta["inputs"]["arch"] == "um" and meta["release"] == stock.release
    assert stock.release.endswith(f"-uml-{stock.build_key[:10]}") and stock.tracing
    assert stock.binary == e.path / "linux" and os.access(stock.binary, os.X_OK)
    assert (stock.modules_root / "modules.dep").exists() and stock.install_root == e.path / "modules"
    assert sorted(p.name for p in stock.extra_modules.glob("*.ko")) == ["sch_aqm_mark.ko", "tcp_dctcp_flaws.ko"]
    assert "extra/sch_aqm_mark.ko" in (stock.modules_root / "modules.dep").read_text()
    assert not any(p.is_symlink() for p in umbuild.tree_links(e.path, stock.release))   # no link to the gone tree
    vermagic = subprocess.run(["modinfo", "-F", "vermagic", str(stock.extra_modules / "sch_aqm_mark.ko")],
                              capture_output=True, text=True, check=True).stdout
    assert vermagic.split()[0] == stock.release
    config = parse_config((e.path / "config").read_text())
    assert (config["CONFIG_HZ"], config["CONFIG_EVENT_TRACING"], config["CONFIG_UML_NET_VECTOR"]) == ("1000", "y", "y")
    assert not list(e.path.glob("*.deb"))
    assert f".tmp-{stock.build_key}".encode() not in stock.binary.read_bytes()   # the build dir is not in it
    names = {o["name"] for o in meta["outputs"]}
    assert {"linux", "config", f"modules/lib/modules/{stock.release}/modules.dep"} <= names
    steps = [s["step"] for s in meta["steps"]]
    assert steps.index("make ARCH=um olddefconfig") < steps.index("make ARCH=um linux modules") < steps.index(
        "make ARCH=um modules_install") < steps.index("depmod")
    assert meta["command"] == "tcplab kernel build experiments/kernels/uml-lab.yaml uml-6.1"
    assert uml.stock_uml() == stock == uml.find_uml_build(stock.release)


def boot(kernel: uml.UmlKernel, init: Path, tmp: Path) -> str:
    """Run the UML kernel with `init` as PID 1 until it powers off (or BOOT_TIMEOUT_S); its console output."""
    (tmp / "uml").mkdir()
    cmd = [str(kernel.binary), f"umid=tcplab-test-{os.getpid()}", f"uml_dir={tmp / 'uml'}", "mem=256M",
           "root=/dev/root", "rootfstype=hostfs", "rootflags=/", "ro", f"init={init}", "con=null",
           "con0=fd:0,fd:1"]
    proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            env={**os.environ, "TMPDIR": str(tmp)}, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=BOOT_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)       # its own session: the UML kernel and its helper processes
        out, _ = proc.communicate()
        pytest.fail(f"the UML kernel did not power off within {BOOT_TIMEOUT_S} s:\n"
                    + out.decode(errors="replace")[-3000:])
    return out.decode(errors="replace")


def test_the_stock_uml_kernel_boots_traces_at_1000_hz_and_loads_a_project_module(stock, tmp_path):
    init = tmp_path / "init.sh"
    init.write_text(INIT.format(ko=stock.extra_modules / "sch_aqm_mark.ko"))
    init.chmod(0o755)
    out = boot(stock, init, tmp_path)
    report = dict(m.groups() for m in re.finditer(r"^(\w+)=(.*?)\r?$", out, re.M))
    assert report.get("done") == "1", out[-3000:]
    assert report["release"] == stock.release and stock.build_key[:10] in report["release"]
    assert (report["tcp_probe"], report["qdisc_dequeue"]) == ("yes", "yes")
    assert report["hz"] == "CONFIG_HZ=1000"
    assert (report.get("insmod"), report.get("module")) == ("ok", "loaded"), out[-3000:]
    assert report.get("qdisc", "").startswith("qdisc aqm_mark 1: root"), out[-3000:]
