"""Guards on the sampled qdisc counters of a run (M-DROP, G-NETEM and G-HTB after the run)."""
from __future__ import annotations

import numpy as np

from orchestrator.plan import RunSpec
from schemas.flag import Flag
from schemas.hoststate import Netem

SHAPERS = ("htb", "tbf")
DATA_SHARE_OF_RATE = 0.10   # an htb that carried less than this share of R x window carried ACKs, not data


def _counter_deltas(samples: np.ndarray) -> dict[str, dict[str, int | str]]:
    """handle -> kind, parent and the drops/overlimits/bytes its counters advanced by over the samples."""
    out: dict[str, dict[str, int | str]] = {}
    for handle in dict.fromkeys(samples["handle"].tolist()):
        mine = samples[samples["handle"] == handle]
        first, last = mine[0], mine[-1]
        out[handle] = {"kind": str(last["kind"]), "parent": str(last["parent"]),
                       **{c: int(last[c]) - int(first[c]) for c in ("drops", "overlimits", "bytes")}}
    return out


def _own_drops(handle: str, deltas: dict[str, dict[str, int | str]]) -> int:
    """A qdisc's drop counter includes what its child qdiscs dropped (htb and netem count a refused child
    enqueue as their own drop), so its own drops are the difference."""
    major = handle.split(":")[0]
    children = [d for d in deltas.values() if str(d["parent"]).split(":")[0] == major and d["parent"] != "root"]
    return int(deltas[handle]["drops"]) - sum(int(c["drops"]) for c in children)


def qdisc_findings(spec: RunSpec, host: str, iface: str, samples: np.ndarray) -> list[Flag]:
    """On one sampled interface: drops anywhere but in the chain's last qdisc (M-DROP: netem -> G-NETEM,
    a shaper -> G-HTB, unless the plan asked netem for loss), and a bottleneck htb that carried data
    without ever throttling (G-HTB post: the shaper was not the bottleneck)."""
    if samples.size < 2:
        return []
    deltas = _counter_deltas(samples)
    window_s = max(1e-9, (int(samples["ts_ns"].max()) - int(samples["ts_ns"].min())) / 1e9)
    parents = {str(d["parent"]).split(":")[0] for d in deltas.values()}
    hp = spec.hosts.get(host)
    planned_loss = any(isinstance(s, Netem) and s.loss > 0 for c in (hp.qdiscs.values() if hp else ()) for s in c)
    out = []
    for handle, d in deltas.items():
        leaf = handle.split(":")[0] not in parents
        own = _own_drops(handle, deltas)
        if not leaf and own > 0 and not (d["kind"] == "netem" and planned_loss):
            guard = "G-NETEM" if d["kind"] == "netem" else "G-HTB" if d["kind"] in SHAPERS else "M-DROP"
            out.append(Flag(guard=guard, host=host,
                            message=f"{d['kind']} {handle} on {iface} dropped {own} packets itself, above "
                               "the queue under test: drops outside the AQM (raise its limit)"))
    rate = spec.derived.bottleneck_rate_bit
    bulk = any(f.tool in ("iperf3", "bulk") and not f.bytes for f in spec.flows)
    for handle, d in deltas.items():
        carried_bit = int(d["bytes"]) * 8
        if (d["kind"] == "htb" and bulk and rate and carried_bit >= DATA_SHARE_OF_RATE * rate * window_s
                and int(d["overlimits"]) == 0):
            out.append(Flag(guard="G-HTB", host=host,
                            message=f"htb {handle} on {iface} carried {carried_bit / window_s / 1e6:.1f} "
                               "Mbit/s of bulk traffic but never throttled (overlimits 0): the shaper was not "
                               "the bottleneck"))
    return out
