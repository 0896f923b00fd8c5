"""The C header decoder (orchestrator/ingest/pcap_cdecode.py) gives exactly the numpy decoder's rows and
counts: on every real capture, on a synthetic bottleneck capture, and on 40,000 fuzzed frames (random
bytes in the headers, random captured/wire lengths, every supported link type mixed in one block)."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from orchestrator.ingest import pcap, pcap_cdecode
from orchestrator.ingest.pcap_format import SUPPORTED_LINKTYPES, Frames, iter_frames
from orchestrator.storage import records
from tests.support.synth import write_bottleneck_pcap

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "ingest"
REAL = ["eth.pcap", "sll2.pcap", "sll_us.pcap", "eth.pcapng", "multi_if.pcapng", "v6.pcap"]

pytestmark = pytest.mark.skipif(not pcap_cdecode.available(), reason="no C compiler: the C decoder cannot be built")


def assert_same(fr: Frames, point: int = 0) -> int:
    a, ca = pcap.decode_numpy(fr, point)
    b, cb = pcap_cdecode.decode(fr, point)
    assert a.dtype == b.dtype == records.PACKET
    assert a.size == b.size and a.tobytes() == b.tobytes()
    assert ca.tolist() == cb.tolist()
    return a.size


@pytest.mark.parametrize("name", REAL)
def test_real_captures(name: str) -> None:
    blocks = [fr for fr in iter_frames(FIX / name, block_bytes=4096) if not isinstance(fr, int)]
    assert sum(assert_same(fr, point=3) for fr in blocks) > 0


def test_synthetic_bottleneck_capture(tmp_path: Path) -> None:
    path = tmp_path / "s.pcap"
    write_bottleneck_pcap(path, 20_000)
    assert sum(assert_same(fr) for fr in iter_frames(path) if not isinstance(fr, int)) > 29_000


def _frames_of(path: Path) -> list[bytes]:
    """Frame bytes of a classic pcap (Ethernet)."""
    raw = path.read_bytes()
    out, p = [], 24
    while p + 16 <= len(raw):
        incl = int.from_bytes(raw[p + 8:p + 12], "little")
        out.append(raw[p + 16:p + 16 + incl])
        p += 16 + incl
    return out


@pytest.mark.parametrize("seed", range(4))
def test_fuzzed_headers_lengths_and_link_types(seed: int) -> None:
    rng = np.random.default_rng(seed)
    base = _frames_of(FIX / "eth.pcap") + _frames_of(FIX / "v6.pcap")
    linktypes = np.array(sorted(SUPPORTED_LINKTYPES))
    n = 10_000
    parts, data, caplen = [], [], []
    pos = 0
    for _ in range(n):
        frame = bytearray(base[int(rng.integers(len(base)))])
        cut = int(rng.integers(0, 6))
        lead = bytes(rng.integers(0, 256, cut, dtype=np.uint8))   # shift: a different link header length
        if rng.random() < 0.3:   # rewrite the ethertype / version to exercise VLAN, IPv6 and raw paths
            frame[12:14] = [(0x81, 0x00), (0x88, 0xA8), (0x86, 0xDD), (0x08, 0x00)][int(rng.integers(4))]
        for _ in range(int(rng.integers(0, 4))):                  # random bytes somewhere in the headers
            k = int(rng.integers(0, min(len(frame), 100)))
            frame[k] = int(rng.integers(0, 256))
        frame = lead + bytes(frame)
        cl = int(rng.integers(0, len(frame) + 1)) if rng.random() < 0.3 else len(frame)
        parts.append(frame[:cl])
        data.append(pos)
        caplen.append(cl)
        pos += cl
    buf = np.frombuffer(b"".join(parts) + b"\0" * 8, dtype=np.uint8)
    caplen_a = np.array(caplen, dtype=np.int64)
    lt = linktypes[rng.integers(0, linktypes.size, n)].astype(np.int64)
    wire = np.where(rng.random(n) < 0.2, rng.integers(0, 2000, n), caplen_a + rng.integers(0, 1500, n))
    fr = Frames(buf=buf, data=np.array(data, dtype=np.int64), caplen=caplen_a, wirelen=wire.astype(np.int64),
                linktype=lt, linktypes=tuple(sorted(set(lt.tolist()))),
                ts_ns=rng.integers(0, 2**62, n).astype(np.int64), extra_other=int(rng.integers(0, 3)))
    rows = assert_same(fr, point=7)
    assert 0 < rows < n    # some decoded, some refused
