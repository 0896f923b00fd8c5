"""The VM lab's firmware for a disk guest (effects): `python -m orchestrator.lab.vm_firmware <guest dir>`.

At each power-on it does what GRUB does on a Debian machine, from the guest's own disk: read
/boot/grub/grubenv, boot `next_entry` once (clearing it in the block, in place, before booting, so a boot
that fails falls back), else `saved_entry`, else the newest kernel in /boot (orchestrator.lab.grubenv); load
that kernel's vmlinuz and its initrd.img from /boot -- or, where the guest made none (the lab's images do not
run mkinitramfs: under TCG it costs minutes), a small initramfs holding busybox and the modules the root disk
needs, taken from the guest's own /lib/modules/<release>. Then it starts QEMU and watches its QMP events: a
guest reset (`reboot`, a panic) is a new power-on; a guest power-off or a signal ends the firmware.
Every boot is appended to <guest dir>/boots.jsonl (time, release, why, fallback, whose initrd, seconds to
stage it); the console of the boots before the last is kept as console.<n>.log.
"""
from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

from orchestrator.lab import grubenv, vm_disk
from orchestrator.lab.vm_recipe import (
    BUSYBOX,
    INIT_PROLOGUE,
    closure,
    cpio_newc,
    initramfs_entries,
    parse_modules_dep,
    uncompressed,
)

GRUBENV = "/boot/grub/grubenv"
ROOT_MODULES = ["virtio_pci", "virtio_blk", "ext4", "crc32c_generic"]
DISK_INIT = r"""#!/bin/busybox sh
# tcplab VM lab firmware's initramfs for a disk guest: the root disk's modules, then the guest's own init.
""" + INIT_PROLOGUE + r"""rel=$(uname -r)
for m in $(cat /etc/tcplab/load); do insmod "/lib/modules/$rel/$m" 2>/dev/null; done
i=0; while [ ! -b /dev/vda ] && [ $i -lt 100 ]; do sleep 0.1; i=$((i + 1)); done
mkdir -p /newroot
# a kernel that cannot mount the root disk resets the machine, as a panic with panic=-1 does: the firmware then
# boots the saved default (the one-shot entry is spent)
mount -t ext4 -o rw /dev/vda /newroot || { echo "tcplab-firmware: cannot mount /dev/vda: reset"; sleep 1; reboot -f; }
for d in dev proc sys; do mount --move "/$d" "/newroot/$d"; done
exec switch_root /newroot /sbin/init
"""


def _say(gdir: Path, msg: str) -> None:
    line = f"{time.strftime('%Y-%m-%dT%H:%M:%S')} firmware guest={gdir.name.removeprefix('vm-')} {msg}"
    print(line, file=sys.stderr, flush=True)


KEEP_CONSOLES = 8
EARLY_EXIT_S = 10.0


def _keep_console(gdir: Path, boot: int) -> None:
    """QEMU truncates console.log at each start: the previous boot's becomes console.<n>.log (the last few),
    so a boot that failed can still be read after the fallback."""
    console = gdir / "console.log"
    if boot and console.exists():
        console.rename(gdir / f"console.{boot - 1}.log")
        (gdir / f"console.{boot - 1 - KEEP_CONSOLES}.log").unlink(missing_ok=True)


def kernel_releases(disk: Path) -> list[str]:
    return [n.removeprefix("vmlinuz-") for n in vm_disk.list_dir(disk, "/boot") if n.startswith("vmlinuz-")]


def minimal_initramfs(disk: Path, release: str) -> bytes:
    """busybox + the root disk's module closure, read from the guest's own module tree."""
    moddir = f"/usr/lib/modules/{release}"
    deps = parse_modules_dep((vm_disk.read_file(disk, f"{moddir}/modules.dep") or b"").decode())
    builtin = (vm_disk.read_file(disk, f"{moddir}/modules.builtin") or b"").decode().split()
    roots = [m for m in ROOT_MODULES if any(p.rsplit("/", 1)[-1].split(".ko")[0].replace("-", "_") == m for p in deps)]
    load = closure(deps, roots, builtin)
    modules, order = {}, []
    for rel in load:
        name, data = uncompressed(rel, vm_disk.read_file(disk, f"{moddir}/{rel}") or b"")
        modules[name] = data
        order.append(name)
    return cpio_newc(initramfs_entries(BUSYBOX.read_bytes(), release, modules, order, {}, init=DISK_INIT))


def power_on(gdir: Path, disk: Path) -> tuple[Path, Path, dict]:
    """Choose and stage this boot's kernel and initrd (and consume a one-shot entry), as GRUB would."""
    started = time.monotonic()
    block = vm_disk.read_file(disk, GRUBENV)
    env = grubenv.parse(block) if block else {}
    choice = grubenv.choose(env, kernel_releases(disk))
    if block and choice.env_after != env:
        vm_disk.overwrite_in_place(disk, GRUBENV, grubenv.render(choice.env_after))
    boot = gdir / "boot"
    boot.mkdir(exist_ok=True)
    vmlinuz, initrd = boot / "vmlinuz", boot / "initrd"
    vmlinuz.write_bytes(vm_disk.read_file(disk, f"/boot/vmlinuz-{choice.release}") or b"")
    guest_initrd = vm_disk.read_file(disk, f"/boot/initrd.img-{choice.release}")
    initrd.write_bytes(guest_initrd or minimal_initramfs(disk, choice.release))
    record = {"time": time.time(), "release": choice.release, "why": choice.why, "fallback": choice.fallback,
              "initrd": "guest" if guest_initrd else "firmware", "staged_s": round(time.monotonic() - started, 2)}
    with open(gdir / "boots.jsonl", "a") as f:
        f.write(json.dumps(record) + "\n")
    return vmlinuz, initrd, record


class QmpWatcher(threading.Thread):
    """Reads QEMU's QMP events; keeps the reason of the last SHUTDOWN (guest-reset, guest-shutdown, ...)."""

    def __init__(self, path: Path) -> None:
        super().__init__(daemon=True)
        self.path, self.reason = path, None

    def run(self) -> None:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                sock = socket.socket(socket.AF_UNIX)
                sock.connect(str(self.path))
                break
            except OSError:
                time.sleep(0.1)
        else:
            return
        with sock, sock.makefile("rwb") as f:
            f.readline()                                           # the greeting
            f.write(b'{"execute": "qmp_capabilities"}\n')
            f.flush()
            for _ in range(100_000):                               # events are few: a bound, not a limit
                line = f.readline()
                if not line:
                    return
                msg = json.loads(line)
                if msg.get("event") == "SHUTDOWN":
                    self.reason = msg.get("data", {}).get("reason")


def main(gdir_arg: str) -> int:
    gdir = Path(gdir_arg)
    cfg = json.loads((gdir / "firmware.json").read_text())
    disk = Path(cfg["disk"])
    stopping = False
    qemu: subprocess.Popen | None = None

    def stop(signum, frame):  # noqa: ARG001 - signal handler signature
        nonlocal stopping
        stopping = True
        if qemu and qemu.poll() is None:
            qemu.terminate()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    failures = 0
    for boot in range(1000):                                      # power-ons of one lab's life
        if stopping:
            return 0
        try:
            vmlinuz, initrd, record = power_on(gdir, disk)
        except Exception as exc:  # noqa: BLE001 - a firmware reports a failed boot and tries again
            failures += 1
            _say(gdir, f"boot={boot} failed to load a kernel: {exc!r}")
            if failures >= 3:       # the one-shot entry is consumed: the retries went to the default
                return 1
            continue
        _keep_console(gdir, boot)
        _say(gdir, f"boot={boot} release={record['release']} why={record['why']!r} initrd={record['initrd']}"
                   + (f" fallback={record['fallback']!r}" if record["fallback"] else ""))
        qmp_path = gdir / "qmp.sock"
        qmp_path.unlink(missing_ok=True)
        argv = [*cfg["argv"], "-kernel", str(vmlinuz), "-initrd", str(initrd), "-append", cfg["cmdline"],
                "-qmp", f"unix:{qmp_path},server=on,wait=off"]
        qemu = subprocess.Popen(argv, stdin=subprocess.DEVNULL, pass_fds=tuple(cfg.get("pass_fds", ())))
        watcher = QmpWatcher(qmp_path)
        watcher.start()
        started = time.monotonic()
        rc = qemu.wait()
        watcher.join(timeout=2)
        if stopping:
            return 0
        if rc != 0 and watcher.reason is None and time.monotonic() - started < EARLY_EXIT_S:
            # QEMU refused the kernel (not a bootable image): a machine would hang in its boot loader until
            # power-cycled; power on again -- the one-shot entry is spent, the default boots
            failures += 1
            _say(gdir, f"boot={boot} qemu exited rc={rc} before the guest ran: power-cycled")
            if failures >= 3:
                return 1
            continue
        failures = 0                 # the guest ran: a later failure starts counting afresh
        if watcher.reason != "guest-reset":
            _say(gdir, f"qemu exited rc={rc} reason={watcher.reason}: powered off")
            return 0 if watcher.reason == "guest-shutdown" else 1
        _say(gdir, "guest reset: power-on again")
    return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
