"""Conn ids: one small integer per direction of a TCP/UDP 5-tuple at one capture point of a run.

The `packet` table stores a conn id instead of point, protocol, addresses and ports (5 columns and
two 16-byte addresses fewer per packet row); the `conn` table maps ids back. The registry is filled
chunk by chunk while a capture streams through: each chunk's distinct keys are found with np.unique
(a run has a handful of conns, a chunk a million packets), only those few go through a dict.
"""
from __future__ import annotations

import numpy as np

from orchestrator.storage import addr, records

_KEY = np.dtype([(n, records.PACKET.fields[n][0]) for n in records.CONN_FIELDS])
_WORDS = _KEY.itemsize // 4
_MIX = (np.arange(1, _WORDS + 1, dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15)) | np.uint64(1)
assert _KEY.itemsize % 4 == 0


def _factorize(h: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Sorted distinct values of h and each row's index among them; fast when few are distinct:
    the distinct values of a sample, a binary search per row, and a fallback for what it missed."""
    uniq = np.unique(h[:: max(1, h.size // 4096)])
    code = np.searchsorted(uniq, h)
    missed = (code == uniq.size) | (uniq[np.minimum(code, uniq.size - 1)] != h)
    if missed.any():
        uniq = np.union1d(uniq, np.unique(h[missed]))
        code = np.searchsorted(uniq, h)
    return uniq, code


class ConnRegistry:
    """conn key -> id (0, 1, 2, ... in order of first appearance); the ids of a run's conn rows."""

    def __init__(self) -> None:
        self._ids: dict[bytes, int] = {}
        self._keys: list[np.void] = []

    def __len__(self) -> int:
        return len(self._keys)

    def ids(self, packets: np.ndarray) -> np.ndarray:
        """int32 conn id of every row of a records.PACKET array (registering new conns)."""
        key = np.empty(packets.size, _KEY)
        for n in records.CONN_FIELDS:
            key[n] = packets[n]
        if key.size == 0:
            return np.zeros(0, dtype=np.int32)
        words = key.view(np.uint32).reshape(key.size, _WORDS)
        h = (words * _MIX).sum(axis=1, dtype=np.uint64)   # a hash; collisions are checked below
        uniq, inverse = _factorize(h)
        first = np.zeros(uniq.size, dtype=np.int64)
        first[inverse[::-1]] = np.arange(key.size)[::-1]   # a row holding each distinct hash
        if not (words == words[first][inverse]).all():     # two keys share a hash: exact but slow path
            raw = key.view(f"V{_KEY.itemsize}")
            _, first, inverse = np.unique(raw, return_index=True, return_inverse=True)
            inverse = inverse.reshape(-1)
        local = np.empty(first.size, dtype=np.int32)
        for i, row in enumerate(first.tolist()):
            b = key[row].tobytes()
            cid = self._ids.get(b)
            if cid is None:
                cid = self._ids[b] = len(self._keys)
                self._keys.append(np.frombuffer(b, _KEY)[0])
            local[i] = cid
        return local[inverse]

    def rows(self, point_names: list[str]) -> list[dict]:
        """`conn` table rows (without run_key); point_names[i] is the label of point id i."""
        if not self._keys:
            return []
        keys = np.array(self._keys, dtype=_KEY)
        src = addr.format_column(keys["ipv"], keys["src_addr"])
        dst = addr.format_column(keys["ipv"], keys["dst_addr"])
        return [{"conn_id": i, "point": point_names[int(k["point"])], "proto": int(k["proto"]),
                 "ipv": int(k["ipv"]), "src_addr": str(src[i]), "dst_addr": str(dst[i]),
                 "src_port": int(k["src_port"]), "dst_port": int(k["dst_port"])}
                for i, k in enumerate(keys)]
