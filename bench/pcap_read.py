"""Benchmark: tcplab's pcap reader vs `tshark -T fields` on the same capture, measured in one run.

Usage: .venv/bin/python bench/pcap_read.py PCAP [PCAP ...]
(e.g. results/<run-id>/aqm/capture-to-client.pcap from `make demo`). Prints packets/s of both, their
ratio and this process's peak RSS. The ingest-into-PostgreSQL benchmark (bench/ingest.py) extends this.
"""
from __future__ import annotations

import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path

from orchestrator.ingest.pcap import iter_pcap

TSHARK_FIELDS = ["frame.time_epoch", "ip.src", "ip.dst", "tcp.srcport", "tcp.dstport", "tcp.seq_raw",
                 "tcp.ack_raw", "tcp.len", "ip.len", "tcp.flags", "ip.dsfield.ecn", "ip.id",
                 "tcp.options.timestamp.tsval", "tcp.options.timestamp.tsecr"]


def main(paths: list[Path]) -> None:
    if not paths:
        sys.exit(__doc__)
    t = time.perf_counter()
    packets = 0
    for p in paths:   # streamed as the ingest reads it: no copy of the whole capture into one array
        packets += sum(chunk.size for chunk in iter_pcap(p))
    ours = packets / (time.perf_counter() - t)
    rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    if shutil.which("tshark") is None:
        print(f"pcap read: {ours:,.0f} pkts/s ({packets} packets), tshark missing, rss {rss_mb:.0f} MB")
        return
    argv = ["tshark", "-n", "-T", "fields", *[a for f in TSHARK_FIELDS for a in ("-e", f)], "-Y", "tcp"]
    t = time.perf_counter()
    for p in paths:
        subprocess.run([*argv, "-r", str(p)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
    theirs = packets / (time.perf_counter() - t)
    print(f"pcap read: {ours:,.0f} pkts/s, tshark {theirs:,.0f} pkts/s, ratio {ours / theirs:.1f}, "
          f"rss {rss_mb:.0f} MB ({packets} packets)")


if __name__ == "__main__":
    main([Path(a) for a in sys.argv[1:]])
