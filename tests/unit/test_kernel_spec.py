"""The kernel build pipeline's pure parts (orchestrator/kernel/spec.py, argv.py, cache.py on a temp dir): the
build key, LOCALVERSION, config parsing and the dropped-symbol check, argv lists, cache lookup and gc."""
from __future__ import annotations

import dataclasses
import json
import os
import time
from pathlib import Path

import pytest

from orchestrator.kernel import argv, cache
from orchestrator.kernel.sources import SourceError, git_commit, is_remote, resolve
from orchestrator.kernel.spec import (
    REPRODUCIBLE_ENV,
    BuildInputs,
    FileInput,
    SourceRef,
    dropped_symbols,
    localversion,
    parse_config,
)
from orchestrator.plan.model.kernels import KernelVariant

INPUTS = BuildInputs(variant="prr-fix", source=SourceRef("debian-package", "linux-source-6.1", "6.1.192-2"),
                     config_base="tinyconfig", patches=(FileInput("patches/a.patch", "aa" * 32),),
                     fragments=(FileInput("configs/net.config", "bb" * 32),), localversion="-prr",
                     toolchain={"gcc": "gcc (Debian 12.2.0-14+deb12u1) 12.2.0", "ld": "GNU ld 2.40", "make": "4.3"})

# `make olddefconfig` output as written to .config (6.1, tinyconfig + fragment), trimmed
FINAL_CONFIG = """#
# Automatically generated file; DO NOT EDIT.
# Linux/x86 6.1.192 Kernel Configuration
#
CONFIG_CC_VERSION_TEXT="gcc (Debian 12.2.0-14+deb12u1) 12.2.0"
CONFIG_LOCALVERSION="-prr-0123456789"
# CONFIG_LOCALVERSION_AUTO is not set
CONFIG_64BIT=y
CONFIG_NET=y
CONFIG_NET_SCHED=y
CONFIG_NET_SCH_HTB=y
# CONFIG_NET_SCH_RED is not set
CONFIG_NR_CPUS=64
"""


def test_the_key_follows_every_input_but_the_variant_name():
    k = INPUTS.key
    assert len(k) == 64 and dataclasses.replace(INPUTS, variant="other-name").key == k
    changed = [
        dataclasses.replace(INPUTS, source=SourceRef("debian-package", "linux-source-6.1", "6.1.193-1")),
        dataclasses.replace(INPUTS, config_base="defconfig"),
        dataclasses.replace(INPUTS, patches=(FileInput("patches/a.patch", "ab" * 32),)),
        dataclasses.replace(INPUTS, patches=()),
        dataclasses.replace(INPUTS, fragments=(FileInput("configs/net.config", "bc" * 32),)),
        dataclasses.replace(INPUTS, modules=(FileInput("modules/x", "cc" * 32),)),
        dataclasses.replace(INPUTS, localversion="-other"),
        dataclasses.replace(INPUTS, toolchain={**INPUTS.toolchain, "gcc": "gcc 13.1"}),
    ]
    keys = {c.key for c in changed}
    assert len(keys) == len(changed) and k not in keys


def test_localversion_names_the_build():
    lv = localversion(INPUTS)
    assert lv == f"-prr-{INPUTS.key[:10]}"
    assert localversion(dataclasses.replace(INPUTS, localversion="")).startswith("-prr-fix-")
    odd = localversion(dataclasses.replace(INPUTS, localversion="-a b/c"))
    assert odd.startswith("-a-b-c-") and all(ch.isalnum() or ch in ".+-" for ch in odd)


def test_config_lines_that_did_not_survive_are_named():
    final = parse_config(FINAL_CONFIG)
    assert final["CONFIG_NET_SCH_RED"] == "n" and final["CONFIG_LOCALVERSION"] == '"-prr-0123456789"'
    fragment = parse_config("CONFIG_NET_SCH_HTB=y\nCONFIG_NET_SCH_RED=m\n"
                            "# CONFIG_NET_SCH_RED is not set\nCONFIG_NR_CPUS=64\n")
    assert dropped_symbols(fragment, final) == []      # the later line for RED wins, as in Kconfig
    fragment = parse_config("CONFIG_NET_SCH_HTB=y\nCONFIG_NET_SCH_DUALPI2=y\nCONFIG_NET_SCH_RED=m\n")
    assert dropped_symbols(fragment, final) == ["CONFIG_NET_SCH_DUALPI2=y (got: not set)",
                                                "CONFIG_NET_SCH_RED=m (got: not set)"]


def test_argv_lists_and_the_reproducible_environment():
    tree = Path("/b/linux")
    assert argv.patch(tree, Path("/p/x.patch")) == ["patch", "-d", "/b/linux", "-p1", "--forward", "--batch",
                                                    "--no-backup-if-mismatch", "-i", "/p/x.patch"]
    assert argv.make(tree, "bindeb-pkg", jobs=2) == ["make", "-C", "/b/linux", "-j2", "bindeb-pkg"]
    assert argv.merge_config(tree, [Path("/f/a.config")])[:4] == ["/b/linux/scripts/kconfig/merge_config.sh", "-m",
                                                                  "-O", "/b/linux"]
    assert argv.module_build(tree, Path("/m/sch_x"), 2)[-2:] == ["M=/m/sch_x", "modules"]
    assert argv.apt_download("linux-source-6.1", "6.1.192-2")[-1] == "linux-source-6.1=6.1.192-2"
    assert REPRODUCIBLE_ENV["KBUILD_BUILD_TIMESTAMP"] and REPRODUCIBLE_ENV["SOURCE_DATE_EPOCH"] == "0"


@pytest.mark.parametrize("url, remote", [("https://git.kernel.org/pub/scm/linux.git", True),
                                         ("git@github.com:L4STeam/linux.git", True), ("ssh://h/r.git", True),
                                         ("../linux", False), ("/srv/linux", False)])
def test_remote_git_urls_are_told_apart_from_local_trees(url, remote):
    assert is_remote(url) is remote


def test_an_unreachable_git_url_fails_at_once_with_what_to_do(tmp_path):
    started = time.monotonic()
    with pytest.raises(SourceError, match="unreachable from this machine") as e:
        git_commit("https://git.invalid/linux.git", "v6.1", tmp_path)
    assert "git.invalid" in str(e.value) and "linux-source-6.1" in str(e.value)
    assert time.monotonic() - started < 20


def test_missing_inputs_are_named_before_anything_runs(tmp_path):
    v = KernelVariant(vanilla=False, source={"package": "linux-source-6.1", "patches": ["patches/none.patch"]})
    with pytest.raises(SourceError, match=r"patch patches/none.patch: no such file"):
        resolve("v", v, tmp_path)
    with pytest.raises(SourceError, match="a distribution package"):
        resolve("d", KernelVariant(vanilla=True, package="linux-image-6.1.0-56-amd64"), tmp_path)


def _fake_entry(root: Path, key: str, variant: str, finished: str, age_days: float = 0) -> None:
    d = root / key
    d.mkdir(parents=True)
    (d / "metadata.json").write_text(json.dumps({"key": key, "variant": variant, "release": f"6.1.192-{key[:6]}",
                                                 "finished_at": finished}))
    t = time.time() - age_days * 86400
    os.utime(d / "metadata.json", (t, t))


def test_the_cache_lists_finds_and_collects(tmp_path):
    root = tmp_path / "cache"
    _fake_entry(root, "a" * 64, "v1", "2026-11-20T00:00:00+00:00", age_days=3)
    _fake_entry(root, "b" * 64, "v1", "2026-11-21T00:00:00+00:00", age_days=2)
    _fake_entry(root, "c" * 64, "v2", "2026-11-22T00:00:00+00:00", age_days=1)
    (root / ("d" * 64)).mkdir()                                   # no metadata: not a build
    (root / ".tmp-eeee-999999999").mkdir()                         # a builder that is gone
    (root / f".tmp-ffff-{os.getpid()}").mkdir()                    # one that is alive (this process)
    (root / f"failed-{'f' * 64}").mkdir()                          # the log of a failed build
    assert [e.key[0] for e in cache.entries(root)] == ["c", "b", "a"]
    assert [e.key[0] for e in cache.find(root, "v1")] == ["b", "a"]
    assert [e.key[0] for e in cache.find(root, "bbbb")] == ["b"]
    assert cache.entry(root, "d" * 64) is None
    removed = cache.gc(root, keep=1, older_than_days=None)
    assert sorted(removed) == sorted(["a" * 64, ".tmp-eeee-999999999", f"failed-{'f' * 64}"])
    assert (root / f".tmp-ffff-{os.getpid()}").exists()
    assert cache.gc(root, keep=5, older_than_days=1.5) == ["b" * 64]


def test_runs_expect_the_release_of_their_variants_build(tmp_path):
    from orchestrator.engine.kernel_builds import attach_builds
    from orchestrator.plan import expand, load_plan_text

    (tmp_path / "linux.tar.xz").write_bytes(b"not really a kernel: only its sha256 is used here")
    (tmp_path / "fix.patch").write_text("--- a/x\n+++ b/x\n")
    plan = load_plan_text(f"""
name: kb
kernels:
  built: {{vanilla: false, source: {{tarball: {tmp_path}/linux.tar.xz, patches: [{tmp_path}/fix.patch]}}}}
  unbuilt: {{vanilla: false, source: {{tarball: {tmp_path}/linux.tar.xz, config_base: tinyconfig}}}}
  broken: {{vanilla: false, source: {{tarball: {tmp_path}/linux.tar.xz, patches: [{tmp_path}/gone.patch]}}}}
  stock: {{vanilla: true, package: linux-image-6.1.0-56-amd64}}
run:
  duration: 5s
  traffic: {{src: server, dst: client, cc: reno, flows: 1}}
  hosts: {{client: {{kernel: built}}, aqm: {{kernel: stock}}, server: {{kernel: unbuilt}}}}
experiments:
  - name: a
  - name: b
    set: {{hosts.server.kernel: broken}}
""")
    key = resolve("built", plan.kernels["built"], tmp_path).key
    _fake_entry(tmp_path / "cache", key, "built", "2026-11-23T00:00:00+00:00")
    specs, missing = attach_builds(expand(plan), plan.kernels, tmp_path, tmp_path / "cache")
    client = specs[0].hosts["client"].kernel
    assert (client.release, client.build_key) == (f"6.1.192-{key[:6]}", key)
    assert specs[0].hosts["aqm"].kernel.release == "6.1.0-56-amd64" and specs[0].hosts["aqm"].kernel.build_key is None
    assert specs[0].hosts["server"].kernel.release is None
    assert missing["unbuilt"].startswith("not built yet (key ")
    assert "tcplab kernel build PLAN unbuilt" in missing["unbuilt"]
    assert "patch " in missing["broken"] and "gone.patch: no such file" in missing["broken"]
    assert "build_key" in specs[0].model_dump(mode="json")["hosts"]["client"]["kernel"]
    assert "build_key" not in specs[0].model_dump(mode="json")["hosts"]["aqm"]["kernel"]


def test_the_key_follows_contents_not_paths():
    moved = dataclasses.replace(INPUTS, patches=(FileInput("/elsewhere/clone/patches/a.patch", "aa" * 32),),
                                fragments=(FileInput("other/net.config", "bb" * 32),))
    assert moved.key == INPUTS.key
    a = dataclasses.replace(INPUTS, source=SourceRef("tarball", "/a/linux.tar.xz", "cc" * 32))
    b = dataclasses.replace(INPUTS, source=SourceRef("tarball", "/b/copy.tar.xz", "cc" * 32))
    c = dataclasses.replace(INPUTS, source=SourceRef("git", "/srv/linux", "dd" * 20))
    d = dataclasses.replace(INPUTS, source=SourceRef("git", "/home/me/linux", "dd" * 20))
    assert a.key == b.key and c.key == d.key and a.key != c.key
    assert dataclasses.replace(INPUTS, source=SourceRef("debian-package", "linux-source-6.12", "6.1.192-2")).key \
        != INPUTS.key


def test_the_debian_changelog_is_dated_from_the_fixed_epoch(tmp_path):
    from orchestrator.kernel.builder import date_changelog_from_epoch

    script = tmp_path / "scripts" / "package" / "mkdebian"
    script.parent.mkdir(parents=True)
    # the line of linux-source-6.1's scripts/package/mkdebian that dates the changelog
    script.write_text("cat <<EOF > debian/changelog\n\n -- $maintainer  $(date -R)\nEOF\n")
    assert date_changelog_from_epoch(tmp_path) is True
    assert ' -- $maintainer  $(date -R -d "@${SOURCE_DATE_EPOCH}")' in script.read_text()
    assert date_changelog_from_epoch(tmp_path) is False           # nothing left to change
    assert argv.clamp_mtimes(Path("/r")) == ["find", "/r", "-exec", "touch", "-h", "-d", "@0", "{}", "+"]
    assert argv.deb_build(Path("/r"), Path("/x.deb")) == ["dpkg-deb", "--root-owner-group", "-b", "/r", "/x.deb"]
