"""Reading a host's state back: each data interface through tc, ethtool, `ip neigh` and netlink (htb classes),
and the `Readback` a run records as evidence -- the literal tool output the manager compares with the plan.

A driver that lacks an ethtool operation is recorded as such (`unsupported`), never mistaken for "off".
"""
from __future__ import annotations

import json
import os
import re
from concurrent.futures import ThreadPoolExecutor

from pyroute2 import IPRoute

from agents.host import ethtool, linkinfo, neighbours, routes
from agents.host.argv import readback_argv, tc_handle
from agents.host.tunables import congestion_controls, module_param_path, read_module_param, read_sysctl, sysctl_path
from schemas import procs, rawqdisc
from schemas.nic import OFFLOAD_LONG_NAMES
from schemas.protocol import InterfaceReadback, LinkSpeed, Readback
from schemas.qdiscs import KINDS

# TCA_KIND of the kinds stock tc cannot print: read back over netlink
RAW_KINDS = frozenset(k.tc_kind for k in KINDS.values() if k.netlink is not None)
# what the read-back keeps of each (protocol.InterfaceReadback.raw_qdiscs): the kernel's bytes; the counters
# rawqdisc.dump adds (`stats`) are tc's JSON's already
RAW_READBACK_KEYS = ("handle", "parent", "kind", "options_hex", "xstats_hex")


def raw_readback(dumped: list[dict]) -> list[dict[str, str]]:
    """rawqdisc.dump's entries as the read-back records them."""
    return [{k: q[k] for k in RAW_READBACK_KEYS} for q in dumped]


# iproute2 6.1 prints the options of a kind it has no module for as text even with -j, which breaks the JSON:
# `"options":{[Unknown qdisc, optlen=68] }` (tests/fixtures/tc/netem_aqm_mark.json). Their bytes are read over
# netlink instead (`raw_qdiscs`), so the text goes, leaving `"options":{}`.
_UNKNOWN_QDISC = re.compile(r"\[Unknown qdisc, optlen=\d+\] ?")


def parse_tc_qdisc_json(text: str) -> list[dict]:
    """`tc -s -d -j qdisc show` output as a list, tolerant of tc's text for qdisc kinds it does not know."""
    return json.loads(_UNKNOWN_QDISC.sub("", text) or "[]")


def read_qdiscs(dev: str) -> list[dict]:
    return parse_tc_qdisc_json(procs.run(readback_argv(dev)["tc_qdisc"]).stdout)


def read_driver(dev: str) -> str:
    done = procs.run(["ethtool", "-i", dev], check=False)
    for line in done.stdout.splitlines():
        if line.startswith("driver:"):
            return line.split(":", 1)[1].strip()
    return ""


def _read_unless_unsupported(argv: list[str], parse):
    """(parse(stdout), None), or (None, the driver's refusal) when it lacks the operation."""
    done = procs.run(argv, check=False)
    if reason := ethtool.unsupported_reason(done.returncode, done.stderr):
        return None, reason
    if done.returncode != 0:
        raise procs.CommandFailed(done.argv, done.returncode, done.stderr)
    return parse(done.stdout), None


def read_coalesce(dev: str) -> tuple[dict[str, int | bool] | None, str | None]:
    return _read_unless_unsupported(["ethtool", "-c", dev], ethtool.parse_coalesce)


def read_pause(dev: str) -> tuple[dict[str, bool] | None, str | None]:
    return _read_unless_unsupported(["ethtool", "--json", "-a", dev], ethtool.parse_pause_json)


def read_neighbours(dev: str) -> list[dict]:
    return json.loads(procs.run(neighbours.show_argv(dev)).stdout or "[]")


def read_features(dev: str) -> dict[str, dict]:
    out = json.loads(procs.run(readback_argv(dev)["features"]).stdout)
    return {k: v for k, v in out[0].items() if isinstance(v, dict)}


def read_link(dev: str) -> tuple[int, int, int]:
    """(mtu, min_mtu, max_mtu) of `dev`."""
    return linkinfo.parse_link(procs.run(linkinfo.link_argv(dev)).stdout)


def read_speed(dev: str, driver: str) -> LinkSpeed:
    done = procs.run(["ethtool", dev], check=False)
    return linkinfo.link_speed(done.stdout, driver)


def read_fixed_offloads(dev: str) -> dict[str, bool]:
    """The features the driver fixed; from `--json -k`'s own `fixed` marks when the text (which also shows
    the features made of fixed parts) is in a form this agent does not know (another ethtool version)."""
    try:
        return linkinfo.fixed_offloads(procs.run(["ethtool", "-k", dev]).stdout)
    except linkinfo.LinkParseError:
        feats = read_features(dev)
        return {short: bool(feats[long]["active"]) for short, long in OFFLOAD_LONG_NAMES.items()
                if long in feats and feats[long].get("fixed")}


def read_interface(dev: str) -> InterfaceReadback:
    """Every read of one interface, run side by side: each is its own tool process (a few ms to start on a busy
    2-core host), none writes, and the read-back sits on every run's critical path twice (apply and reset)."""
    argv = readback_argv(dev)
    reads = {"qdiscs": lambda: read_qdiscs(dev), "coalesce": lambda: read_coalesce(dev),
             "pause": lambda: read_pause(dev), "driver": lambda: read_driver(dev),
             "class_text": lambda: procs.run(argv["tc_class_text"]).stdout, "htb": lambda: read_htb_classes(dev),
             "features": lambda: read_features(dev), "mtu": lambda: read_link(dev)[0],
             "neighbours": lambda: read_neighbours(dev), "routes": lambda: routes.read_routes(dev)}
    with ThreadPoolExecutor(max_workers=len(reads), thread_name_prefix=f"readback-{dev}") as pool:
        pending = {name: pool.submit(read) for name, read in reads.items()}
        got = {name: fut.result() for name, fut in pending.items()}   # the first failure is raised as it was
    qdiscs = got["qdiscs"]
    (coalesce, no_coalesce), (pause, no_pause), driver = got["coalesce"], got["pause"], got["driver"]
    unsupported = {op: why for op, why in (("coalesce", no_coalesce), ("pause", no_pause)) if why}
    return InterfaceReadback(
        tc_qdisc=qdiscs,
        tc_class_text=got["class_text"],
        htb_classes=got["htb"],
        features=got["features"],
        driver=driver, mtu=got["mtu"], speed=read_speed(dev, driver),
        coalesce=coalesce, pause=pause, unsupported=unsupported,
        neighbours=got["neighbours"],
        routes=got["routes"],
        raw_qdiscs=raw_readback(rawqdisc.dump(dev, RAW_KINDS)) if any(q.get("kind") in RAW_KINDS for q in qdiscs)
        else [],
    )


def read_htb_classes(dev: str) -> list[dict]:
    """htb class parameters over netlink: iproute2 6.1 prints htb classes only as text, even with -j."""
    with IPRoute() as ipr:
        idx = ipr.link_lookup(ifname=dev)[0]
        out = []
        for msg in ipr.get_classes(index=idx):
            if msg.get_attr("TCA_KIND") != "htb":
                continue
            parms = msg.get_attr("TCA_OPTIONS").get_attr("TCA_HTB_PARMS")
            handle = msg["handle"]
            out.append({
                "classid": tc_handle(handle),
                "rate_bit": parms["rate"] * 8, "ceil_bit": parms["ceil"] * 8,
                "quantum_bytes": parms["quantum"], "prio": parms["prio"],
            })
        return out


def readback(interfaces: list[str], sysctl_names: list[str],
             module_params: dict[str, list[str]] | None = None) -> Readback:
    u = os.uname()
    return Readback(
        kernel_release=u.release,
        uname={"sysname": u.sysname, "release": u.release, "version": u.version, "machine": u.machine},
        congestion_controls=congestion_controls(),
        sysctls={n: read_sysctl(n) for n in sysctl_names if sysctl_path(n).exists()},
        module_params={m: {p: read_module_param(m, p) for p in params if module_param_path(m, p).exists()}
                       for m, params in (module_params or {}).items()},
        interfaces=_each_interface(interfaces),
    )


def _each_interface(interfaces: list[str]) -> dict[str, InterfaceReadback]:
    if len(interfaces) < 2:
        return {dev: read_interface(dev) for dev in interfaces}
    with ThreadPoolExecutor(max_workers=len(interfaces), thread_name_prefix="readback") as pool:
        return dict(zip(interfaces, pool.map(read_interface, interfaces), strict=True))
