"""Disk guests' images (effects): the cached Debian base image, a guest's own copy of it, and reading and
writing files inside a stopped guest's disk without mounting it (debugfs, as the firmware needs).

The base image is built once per recipe (orchestrator.lab.vm_disk_recipe.recipe_key) into
`/var/cache/tcplab/vm/disk/<key>/base.img` (`TCPLAB_VM_CACHE`): debootstrap of Debian 12 with sshd, python3,
the agent's tools and a distribution kernel, then `mkfs.ext4 -d` (no loop device, no mount). A guest's disk
is a sparse copy with the guest's own files written by `debugfs -w`.
"""
from __future__ import annotations

import fcntl
import json
import os
import re
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from orchestrator.lab import vm_disk_recipe as recipe
from orchestrator.lab.netns import LabError
from schemas import procs

CACHE = Path(os.environ.get("TCPLAB_VM_CACHE", "/var/cache/tcplab/vm")) / "disk"


def _run(argv: list[str], timeout: float, what: str) -> str:
    r = procs.run(argv, check=False, timeout=timeout)
    if r.returncode != 0:
        raise LabError(f"{what} failed (exit {r.returncode}): {' '.join(argv[:3])} ...\n{r.stderr.strip()[-2000:]}")
    return r.stdout


def ensure_base_image(timeout_s: float = 1800.0, progress=print) -> tuple[Path, dict]:
    """The cached base image for the current recipe and its metadata ({key, kernel_releases, build_s})."""
    key = recipe.recipe_key()
    entry = CACHE / key
    image, meta_file = entry / "base.img", entry / "metadata.json"
    CACHE.mkdir(parents=True, exist_ok=True)
    with open(CACHE / f".{key}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if image.exists() and meta_file.exists():
            return image, json.loads(meta_file.read_text())
        started = time.monotonic()
        tmp = Path(tempfile.mkdtemp(prefix=f".build-{key}-", dir=CACHE))
        try:
            tree = tmp / "root"
            progress(f"disk image {key}: debootstrap {recipe.SUITE} ({len(recipe.PACKAGES)} packages) ...")
            _run(recipe.debootstrap_argv(str(tree)), timeout_s, "debootstrap")
            for rel, (mode, text) in recipe.BASE_FILES.items():
                path = tree / rel
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(text)
                path.chmod(mode)
            for argv in recipe.CHROOT_STEPS:
                _run(["chroot", str(tree), *argv], 300, f"image step {argv[0]}")
            releases = sorted(p.name.removeprefix("vmlinuz-") for p in (tree / "boot").glob("vmlinuz-*"))
            progress(f"disk image {key}: mkfs.ext4 -d ({recipe.DISK_SIZE}, kernels {', '.join(releases)}) ...")
            _run(recipe.mkfs_argv(str(tree), str(tmp / "base.img")), 600, "mkfs.ext4")
            meta = {"key": key, "suite": recipe.SUITE, "packages": list(recipe.PACKAGES), "kernel_releases": releases,
                    "build_s": round(time.monotonic() - started, 1)}
            (tmp / "metadata.json").write_text(json.dumps(meta, indent=2))
            shutil.rmtree(tree)
            entry.parent.mkdir(parents=True, exist_ok=True)
            os.rename(tmp, entry)
            return image, meta
        finally:
            shutil.rmtree(tmp, ignore_errors=True)


def make_guest_disk(base: Path, dest: Path, files: dict[str, tuple[int, bytes]]) -> Path:
    """A guest's disk: a sparse copy of `base` with `files` (path without leading `/` -> mode, bytes)."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    part = dest.with_suffix(".part")
    _run(["cp", "--sparse=always", str(base), str(part)], 300, "copy the base image")
    write_files(part, files)
    os.rename(part, dest)
    return dest


def write_files(image: Path, files: dict[str, tuple[int, bytes]]) -> None:
    """Replace files inside a stopped guest's disk (owned by root, with the given modes)."""
    with tempfile.TemporaryDirectory(prefix="tcplab-disk-") as tmp:
        local, modes = {}, {}
        for i, (rel, (mode, data)) in enumerate(files.items()):
            path = Path(tmp) / f"f{i}"
            path.write_bytes(data)
            local[f"/{rel}"], modes[f"/{rel}"] = str(path), mode
        script = Path(tmp) / "script"
        script.write_text(recipe.debugfs_write_script(local, modes))
        out = _run(["debugfs", "-w", "-f", str(script), str(image)], 120, "debugfs write")
        if "write:" in out and "error" in out.lower():
            raise LabError(f"debugfs could not write into {image}: {out[-500:]}")


def read_file(image: Path, path: str) -> bytes | None:
    """A file of a stopped guest's disk (symlinks in the path resolved by debugfs), or None if absent."""
    with tempfile.TemporaryDirectory(prefix="tcplab-disk-") as tmp:
        out = Path(tmp) / "out"
        # debugfs creates the output only for a file it found (a missing one: "File not found" on stderr)
        subprocess.run(["debugfs", "-R", f'dump "{path}" {out}', str(image)], capture_output=True, timeout=120)
        return out.read_bytes() if out.exists() else None


def list_dir(image: Path, path: str) -> list[str]:
    """Names in a directory of a stopped guest's disk (debugfs `ls -p`: /inode/mode/uid/gid/name/size/)."""
    r = subprocess.run(["debugfs", "-R", f'ls -p "{path}"', str(image)], capture_output=True, text=True, timeout=60)
    names = [line.split("/")[5] for line in r.stdout.splitlines() if line.count("/") >= 6]
    return [n for n in names if n not in (".", "..")]


def overwrite_in_place(image: Path, path: str, data: bytes) -> None:
    """Overwrite an existing file's bytes where they lie, without a new inode or allocation -- how GRUB
    itself saves its environment block. `data` must have the file's length and fit in its first block."""
    with tempfile.NamedTemporaryFile("w", prefix="tcplab-debugfs-") as cmds:   # one debugfs run: size, blocks, fs
        cmds.write(f'stat "{path}"\nblocks "{path}"\nstats\n')
        cmds.flush()
        out = subprocess.run(["debugfs", "-f", cmds.name, str(image)], capture_output=True, text=True,
                             timeout=60).stdout
    size = re.search(r"Size: (\d+)", out)
    if not size or int(size.group(1)) != len(data):
        found = size.group(1) if size else "none"
        raise LabError(f"{path} in {image}: expected a {len(data)}-byte file, found {found}")
    listed = re.search(r"^debugfs: blocks .*\n([0-9 ]+)$", out, re.M)
    blocks = listed.group(1).split() if listed else []
    block_size = re.search(r"Block size:\s+(\d+)", out)
    if not blocks or not block_size or len(data) > int(block_size.group(1)):
        raise LabError(f"{path} in {image}: cannot locate its block")
    with open(image, "r+b") as f:
        f.seek(int(blocks[0]) * int(block_size.group(1)))
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def ssh_keypair(directory: Path, name: str, kind: str = "ed25519") -> tuple[Path, str]:
    """A key pair in `directory` (private key 0600), created once; returns (private key path, public key)."""
    key = directory / name
    if not key.exists():
        directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        _run(["ssh-keygen", "-q", "-t", kind, "-N", "", "-C", name, "-f", str(key)], 60, "ssh-keygen")
    return key, Path(f"{key}.pub").read_text().strip()


def host_keys(directory: Path) -> dict[str, bytes]:
    """A guest's own SSH host key (ed25519): ssh_host_ed25519_key{,.pub}."""
    key = directory / "ssh_host_ed25519_key"
    if not key.exists():
        directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        _run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "tcplab-guest", "-f", str(key)], 60, "ssh-keygen")
    return {"ssh_host_ed25519_key": key.read_bytes(), "ssh_host_ed25519_key.pub": Path(f"{key}.pub").read_bytes()}
