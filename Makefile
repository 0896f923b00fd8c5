# tcplab: `make demo` builds the local netns lab, runs experiments/quickstart.yaml, stores and reports;
# `make test` runs the whole suite. Both install what they need (as root on Debian/Ubuntu).
SHELL := /bin/bash
VENV := .venv
PY := $(VENV)/bin/python
TCPLAB := $(VENV)/bin/tcplab
# `tcplab kernel build` (docs/kernels.md): what `make bindeb-pkg` of a 6.x tree needs
KERNEL_BUILD_PKGS := flex bison bc libelf-dev libssl-dev dwarves rsync cpio kmod dpkg-dev git patch xz-utils
APT_PKGS := iproute2 iputils-ping iperf3 tcpdump ethtool tshark python3 python3-venv python3-dev gcc make postgresql chromium \
	$(KERNEL_BUILD_PKGS)
# the VM lab (`tcplab lab up --kind vm`): QEMU for the aqm guest, busybox for its initramfs; disk guests
# (`--disk`): debootstrap for their base image, e2fsprogs (mkfs.ext4 -d, debugfs), ssh for Ansible
VM_APT_PKGS := qemu-system-x86 busybox-static debootstrap e2fsprogs openssh-client
# the UML lab (`tcplab lab up --kind uml`): Debian's UML kernel serves until `tcplab kernel build` has made the
# project's own (experiments/kernels/uml-lab.yaml: event tracing, HZ=1000)
UML_APT_PKGS := user-mode-linux
PG_ADMIN_URL ?= postgresql://postgres@127.0.0.1:5432/postgres

.PHONY: setup apt vm-deps uml-deps venv postgres tracefs demo test lint clean

setup: apt venv

apt:
	@missing=$$(for p in $(APT_PKGS); do dpkg -s $$p >/dev/null 2>&1 || echo $$p; done); \
	if [ -n "$$missing" ]; then \
	  echo "installing: $$missing"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null; \
	fi

vm-deps:
	@missing=$$(for p in $(VM_APT_PKGS); do dpkg -s $$p >/dev/null 2>&1 || echo $$p; done); \
	if [ -n "$$missing" ]; then \
	  echo "installing: $$missing"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $$missing >/dev/null; \
	fi

uml-deps:
	@missing=$$(for p in $(UML_APT_PKGS); do dpkg -s $$p >/dev/null 2>&1 || echo $$p; done); \
	if [ -n "$$missing" ]; then \
	  echo "installing: $$missing"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $$missing >/dev/null; \
	fi

venv: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test]'
	touch $@

# PostgreSQL for the shared-DB tests: start the local cluster if it is down.
postgres: apt
	@if ! pg_isready -q -h 127.0.0.1 -p 5432; then \
	  ver=$$(ls /etc/postgresql | sort -V | tail -1); \
	  pg_ctlcluster --skip-systemctl-redirect $$ver main start; \
	  for i in $$(seq 1 30); do pg_isready -q -h 127.0.0.1 -p 5432 && break; sleep 0.5; done; \
	fi
	@pg_isready -h 127.0.0.1 -p 5432

# tcp:tcp_probe and kernel timings read tracefs; a fresh machine may not have it mounted
tracefs:
	@mountpoint -q /sys/kernel/tracing || mount -t tracefs nodev /sys/kernel/tracing || \
	  echo "tracefs could not be mounted: tracing tests will skip naming it"

demo: setup tracefs
	$(TCPLAB) lab up
	@rc=0; \
	$(TCPLAB) run experiments/quickstart.yaml || rc=$$?; \
	[ $$rc -eq 0 ] && { $(TCPLAB) report --out results || rc=$$?; }; \
	$(TCPLAB) lab down; \
	exit $$rc

test: setup vm-deps uml-deps postgres tracefs
	TCPLAB_TEST_PG=$(PG_ADMIN_URL) $(VENV)/bin/pytest -q -rs --durations=40

lint: venv
	$(VENV)/bin/ruff check orchestrator agents analysis schemas tests bench

clean:
	-$(TCPLAB) lab down
	rm -rf results .pytest_cache
