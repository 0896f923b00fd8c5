#!/bin/sh
# Stage 1 of a UML lab host: its init, run from the machine's root (hostfs, read-only) before anything of
# the guest's own exists. It mounts the guest's kernel filesystems and tmpfs, keeps visible the host paths
# the guest runs from (a clone or venv under /tmp), gives the kernel its modules at /lib/modules/<release>,
# and execs stage 2 (orchestrator.lab.vm_guest) with the host's interpreter. Its inputs are environment
# variables from the UML command line (orchestrator.lab.uml_config.stage1_env): paths only.
set -e
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
mount -t proc proc /proc
mount -t sysfs sysfs /sys
# the guest files (token, guest.json) live in the lab's state dir, which a tmpfs below may hide: set aside
mkdir -p /dev/.tcplab-guest
cp "$TCPLAB_GUEST"/* /dev/.tcplab-guest/
mount -t tmpfs -o mode=1777 tmpfs /tmp
mount -t tmpfs -o mode=1777 tmpfs /var/tmp
mount -t tmpfs -o mode=0755 tmpfs /run
mkdir -p /dev/shm && mount -t tmpfs -o mode=1777 tmpfs /dev/shm
mkdir -p -m 0700 /run/tcplab-vm
mv /dev/.tcplab-guest/* /run/tcplab-vm/
rmdir /dev/.tcplab-guest
if [ -n "$TCPLAB_KEEP" ]; then
  for p in $(echo "$TCPLAB_KEEP" | tr , ' '); do
    mkdir -p "$p"
    mount -t hostfs -o ro,"$p" none "$p"
  done
fi
if [ -n "$TCPLAB_MODULES" ]; then
  # the machine's /lib/modules is for its own kernel: the guest sees only its own (so modprobe finds them)
  mount -t tmpfs -o mode=0755 tmpfs /lib/modules
  mkdir -p "/lib/modules/$(uname -r)"
  mount -t hostfs -o ro,"$TCPLAB_MODULES" none "/lib/modules/$(uname -r)"
  # tcp_available_congestion_control lists loaded ones only: load every congestion control the kernel has
  for ko in "/lib/modules/$(uname -r)"/kernel/net/ipv4/tcp_*.ko; do
    [ -e "$ko" ] && modprobe "$(basename "$ko" .ko)" 2>/dev/null || true
  done
fi
mount -t tracefs nodev /sys/kernel/tracing 2>/dev/null || true
mount -t debugfs nodev /sys/kernel/debug 2>/dev/null || true
mount -t bpf bpf /sys/fs/bpf 2>/dev/null || true
cd "$TCPLAB_REPO"
exec "$TCPLAB_PYTHON" -m orchestrator.lab.vm_guest /run/tcplab-vm/guest.json
