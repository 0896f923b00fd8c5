"""What a plan may make a root agent write: the sysctl prefixes and kernel modules a testbed allows.

An agent writes a sysctl only when its name falls under one of the agent's prefixes, and loads a module or
writes its parameters only when the module is on the agent's module list. The testbed sets both when it starts
the agent (`--allow-sysctl`, `--allow-module`); a plan cannot widen them. Without flags the agent uses the
defaults below: what the studies need, nothing under `kernel.`, `vm.`, `fs.` or `dev.` (a writable
`kernel.core_pattern` or `kernel.modprobe` runs a program as root).

The agent reports its lists in hello (`Capabilities`), so the manager refuses a plan outside them before any
host is touched. Every decision here is pure; the agent and the manager call the same functions.
"""
from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

# A dotted sysctl name as sysctl(8) writes it: components separated by `.`; a `.` inside one component (an
# interface such as eth0.100) is written `/` (`net.ipv4.conf.eth0/100.forwarding`). A `/` only ever joins two
# non-empty runs, so no component can become `.` or `..` when turned into a path.
SYSCTL_COMPONENT = r"[A-Za-z0-9_-]+(?:/[A-Za-z0-9_-]+)*"
SYSCTL_NAME_PATTERN = rf"^[a-z][a-z0-9_]*(?:\.{SYSCTL_COMPONENT})+$"
MAX_SYSCTL_NAME = 255
# a module name as modprobe knows it, and a parameter name under /sys/module/<module>/parameters
MODULE_NAME_PATTERN = r"^[a-z][a-z0-9_]{0,55}$"
PARAM_NAME_PATTERN = r"^[A-Za-z][A-Za-z0-9_]{0,63}$"

INTERFACE = "{interface}"  # in a prefix: one copy per allow-listed interface (in its sysctl form)
DEFAULTS = "default"       # as a flag value: the default list, so a testbed can add to it

DEFAULT_SYSCTL_PREFIXES: tuple[str, ...] = (
    "net.ipv4.tcp_",                    # congestion control, ECN, buffers, SACK, timestamps, pacing ratios
    "net.core.",                        # rmem/wmem limits, default_qdisc
    "net.ipv4.ip_forward",              # the aqm host forwards
    f"net.ipv4.conf.{INTERFACE}.",      # per data interface only, never `all` or `default`
    f"net.ipv6.conf.{INTERFACE}.",
)
DEFAULT_MODULES: tuple[str, ...] = (
    # congestion controls in the kernel tree
    "tcp_bbr", "tcp_bic", "tcp_cdg", "tcp_cubic", "tcp_dctcp", "tcp_highspeed", "tcp_htcp", "tcp_hybla",
    "tcp_illinois", "tcp_lp", "tcp_nv", "tcp_scalable", "tcp_vegas", "tcp_veno", "tcp_westwood", "tcp_yeah",
    # congestion controls the studies build (experiments/*: dctcp-flaws, lsaimd, timer-cc, paced-chirping, L4S)
    "tcp_prague", "tcp_dctcp_flaws", "tcp_lsaimd", "tcp_tb", "dctcp_chirping",
    # the qdiscs a chain can hold (schemas/qdiscs)
    "sch_cake", "sch_codel", "sch_dualpi2", "sch_fq", "sch_fq_codel", "sch_fq_pie", "sch_htb", "sch_netem",
    "sch_pie", "sch_red", "sch_tbf",
    # the qdiscs the studies build (experiments/modules: the DCTCP-flaws marker)
    "sch_aqm_mark",
)

# what a plan itself may name: the network stack only. A testbed may still widen its agents beyond `net.`, but
# the plans of the studies never need that, so the plan validator refuses it with the file and line.
PLAN_SYSCTL_ROOT = "net."

_PREFIX = re.compile(r"^[a-z][a-z0-9_]*(?:\.(?:" + SYSCTL_COMPONENT + r"|\{interface\}))*[._]?$")
_MODULE = re.compile(MODULE_NAME_PATTERN)


class AllowListError(ValueError):
    """A testbed-given entry that is not a prefix or module name (refused when the agent starts)."""


def sysctl_form(interface: str) -> str:
    """An interface name as one component of a dotted sysctl name (`eth0.100` -> `eth0/100`)."""
    return interface.replace(".", "/")


def sysctl_prefixes(given: Sequence[str]) -> tuple[str, ...]:
    """The testbed's `--allow-sysctl` values (none: the defaults; `default` among them: the defaults plus the
    rest), each checked: an empty prefix or one like `kernel` without a dot would allow too much by accident,
    so a prefix must name at least `x.`; `kernel.` is allowed when a testbed writes it."""
    out: list[str] = []
    for entry in given or (DEFAULTS,):
        if entry == DEFAULTS:
            out += DEFAULT_SYSCTL_PREFIXES
        elif "." not in entry or not _PREFIX.fullmatch(entry):
            raise AllowListError(f"--allow-sysctl {entry!r}: not a sysctl prefix such as `net.ipv4.tcp_` or "
                                 f"`net.ipv4.conf.{INTERFACE}.`")
        else:
            out.append(entry)
    return tuple(dict.fromkeys(out))


def modules(given: Sequence[str]) -> tuple[str, ...]:
    """The testbed's `--allow-module` values (none: the defaults; `default` among them: the defaults too)."""
    out: list[str] = []
    for entry in given or (DEFAULTS,):
        if entry == DEFAULTS:
            out += DEFAULT_MODULES
        elif not _MODULE.fullmatch(entry):
            raise AllowListError(f"--allow-module {entry!r}: not a module name")
        else:
            out.append(entry)
    return tuple(dict.fromkeys(out))


def expand_prefixes(prefixes: Iterable[str], interfaces: Iterable[str]) -> list[str]:
    """Prefixes with `{interface}` replaced by each allow-listed interface (none left: no interface, no
    per-interface sysctl). This is the list an agent reports and enforces."""
    out: list[str] = []
    for p in prefixes:
        if INTERFACE in p:
            out += [p.replace(INTERFACE, sysctl_form(dev)) for dev in interfaces]
        else:
            out.append(p)
    return list(dict.fromkeys(out))


def prefix_covers(prefix: str, name: str) -> bool:
    """A prefix ending in `.` or `_` covers every name that starts with it; any other prefix names one sysctl
    or one subtree (`net.ipv4.ip_forward` covers itself, not `net.ipv4.ip_forward_update_priority`)."""
    if INTERFACE in prefix:
        return False   # an unexpanded template names no sysctl
    if prefix.endswith((".", "_")):
        return name.startswith(prefix)
    return name == prefix or name.startswith(prefix + ".")


def sysctl_allowed(name: str, prefixes: Iterable[str], interfaces: Iterable[str] = ()) -> bool:
    """Whether the sysctl `name` (dotted, sysctl(8) form) falls under one of `prefixes`, with `{interface}`
    standing for each of `interfaces`. A name that is not a sysctl name is never allowed."""
    if len(name) > MAX_SYSCTL_NAME or not re.fullmatch(SYSCTL_NAME_PATTERN, name):
        return False
    return any(prefix_covers(p, name) for p in expand_prefixes(prefixes, interfaces))


def module_allowed(name: str, allowed: Iterable[str]) -> bool:
    return bool(_MODULE.fullmatch(name)) and name in set(allowed)


def sysctl_refusal(name: str, prefixes: Sequence[str]) -> str:
    return (f"sysctl {name} is outside this agent's allow-list ({', '.join(prefixes) or 'empty'}); a testbed "
            "widens it with --allow-sysctl")


def module_refusal(name: str, allowed: Sequence[str]) -> str:
    return (f"module {name} is not on this agent's allow-list ({', '.join(allowed) or 'empty'}); a testbed "
            "widens it with --allow-module")


def plan_may_set_sysctl(name: str) -> bool:
    return name.startswith(PLAN_SYSCTL_ROOT)
