"""`tcplab kernel build` for real (docs/kernels.md): Debian's linux-source-6.1, tinyconfig + a fragment + one
patch, `make bindeb-pkg`. The packages must carry the build key in the release, the patch (TCP_INIT_CWND 16 in
the headers) and the fragment's lines in the config; the metadata must describe every output by its sha256; a
second build of the same key is a cache hit that runs no make; the build is recorded in the database.

The first build takes ~10-15 min on 2 cores (docs/kernels.md has the figure); it goes to the shared cache
(/var/cache/tcplab/kernels), so later runs of this test find it there, as a researcher's second build would.
A fragment line olddefconfig drops is named before anything is compiled (a temp cache, ~1 min)."""
from __future__ import annotations

import io
import json
import shutil
import subprocess
import tarfile
from pathlib import Path

import pytest
from sqlalchemy import select

from orchestrator.kernel import builder, cache
from orchestrator.plan import load_plan
from orchestrator.storage import tables
from orchestrator.storage.db import open_db
from orchestrator.storage.kernel_builds import upsert_build
from schemas.digest import sha256_file
from tests.support.shipped import ROOT

KERNELS = ROOT / "experiments" / "kernels"
NEEDED = ("gcc", "make", "flex", "bison", "bc", "patch", "dpkg-deb", "apt-get", "rsync", "pahole")


def plan_text(fragment: str) -> str:
    return f"""
name: kbuild
kernels:
  cwnd16:
    vanilla: false
    source:
      package: linux-source-6.1
      config_base: tinyconfig
      patches: [{KERNELS}/patches/tcp-init-cwnd-16.patch]
      config: [{fragment}]
      localversion: -cwnd16
run:
  duration: 5s
  traffic: {{src: server, dst: client, cc: reno, flows: 1}}
"""


@pytest.fixture(autouse=True)
def _tools() -> None:
    missing = [t for t in NEEDED if shutil.which(t) is None]
    if missing:
        pytest.skip(f"kernel builds need {', '.join(missing)}: run `make apt`")
    if subprocess.run(["apt-cache", "policy", "linux-source-6.1"], capture_output=True, text=True).stdout.find(
            "Candidate: (none)") >= 0:
        pytest.skip("apt knows no linux-source-6.1 (apt-get update?)")


def members(deb: Path) -> dict[str, bytes | None]:
    """A .deb's data members (path -> content for regular files under 1 MiB, else None)."""
    data = subprocess.run(["dpkg-deb", "--fsys-tarfile", str(deb)], capture_output=True, check=True).stdout
    out: dict[str, bytes | None] = {}
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        for m in tar:
            f = tar.extractfile(m) if m.isfile() and m.size < (1 << 20) else None
            out[m.name.lstrip("./")] = f.read() if f else None
    return out


def test_a_dropped_fragment_line_is_named_before_compiling(tmp_path):
    frag = tmp_path / "bad.config"
    frag.write_text("CONFIG_NET=y\nCONFIG_NET_SCH_DUALPI2=y\n")      # no DualPI2 in 6.1
    (tmp_path / "p.yaml").write_text(plan_text(str(frag)))
    plan = load_plan(tmp_path / "p.yaml")
    with pytest.raises(builder.BuildError) as e:
        builder.build("cwnd16", plan.kernels["cwnd16"], tmp_path, tmp_path / "cache")
    assert "CONFIG_NET_SCH_DUALPI2=y (got: not set)" in str(e.value)
    assert "CONFIG_NET=y" not in str(e.value)
    assert cache.entries(tmp_path / "cache") == []                        # nothing half-built is a cache entry
    assert (tmp_path / "cache" / next(p.name for p in (tmp_path / "cache").glob("failed-*")) / "build.log").exists()


def test_a_patched_tinyconfig_build_carries_its_key_patch_and_config(tmp_path):
    (tmp_path / "p.yaml").write_text(plan_text(str(KERNELS / "configs" / "minimal-net.config")))
    variant = load_plan(tmp_path / "p.yaml").kernels["cwnd16"]
    steps: list[str] = []
    outcome = builder.build("cwnd16", variant, tmp_path, progress=steps.append)
    e, meta = outcome.entry, outcome.entry.metadata
    print(f"\nbuild {e.key[:16]} release {e.release}: {'cache hit' if outcome.hit else 'built'}, "
          f"{meta['duration_s']} s with -j{meta['jobs']} (steps: {', '.join(steps) or 'none'})")
    assert e.release == f"6.1.192-cwnd16-{e.key[:10]}" or e.release.endswith(f"-cwnd16-{e.key[:10]}")
    for out in meta["outputs"]:
        assert sha256_file(e.path / out["name"]) == out["sha256"], out["name"]
    debs = {p.name.split("_")[0]: p for p in e.path.glob("*.deb")}
    image = members(debs[f"linux-image-{e.release}"])
    assert f"boot/vmlinuz-{e.release}" in image
    config = image[f"boot/config-{e.release}"].decode()
    assert f'CONFIG_LOCALVERSION="-cwnd16-{e.key[:10]}"' in config
    assert "CONFIG_NET_SCH_NETEM=y" in config and "CONFIG_VIRTIO_NET=y" in config
    headers = members(debs[f"linux-headers-{e.release}"])
    tcp_h = next(v for k, v in headers.items() if k.endswith("include/net/tcp.h"))
    assert b"#define TCP_INIT_CWND\t\t16" in tcp_h
    assert meta["inputs"]["patches"][0]["sha256"] == sha256_file(KERNELS / "patches" / "tcp-init-cwnd-16.patch")
    assert any(s["step"] == "make bindeb-pkg" and s["env"]["KBUILD_BUILD_TIMESTAMP"] for s in meta["steps"])

    again: list[str] = []
    second = builder.build("cwnd16", variant, tmp_path, progress=again.append)
    assert second.hit and second.entry.key == e.key and again == []     # no step ran: no make, no download
    assert builder.dry_run("cwnd16", variant, tmp_path) == (e.key, True)

    db = open_db(f"sqlite:///{tmp_path / 'k.db'}")
    upsert_build(db, meta)
    upsert_build(db, meta)                                                 # recording twice keeps one row
    with db.connect() as conn:
        rows = conn.execute(select(tables.kernel_build.c.build_key, tables.kernel_build.c.release)).all()
    assert rows == [(e.key, e.release)]
    assert json.loads((e.path / "metadata.json").read_text())["key"] == e.key
