"""The app-limited flow's logs (agents/appwriter.py format): a magic line, one JSON metadata line, then fixed
little-endian records, read with one numpy.frombuffer each (pure apart from the caller reading the bytes)."""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import numpy as np

MAGIC = b"tcplab-app-log 1\n"
WRITE_LOG = np.dtype([("sched_ns", "<i8"), ("t_ns", "<i8"), ("offset", "<i8"), ("len", "<i4"),
                      ("accepted", "<i4")])            # agents/appwriter.WRITE_RECORD
READ_LOG = np.dtype([("t_ns", "<i8"), ("end", "<i8")])   # agents/appwriter.READ_RECORD
SEND_FAILED, SKIPPED = -1, -2
MAX_HEADER = 4096


@dataclass(frozen=True)
class AppLog:
    meta: dict[str, Any]
    rows: np.ndarray


def parse_app_log(data: bytes, dtype: np.dtype) -> AppLog:
    """Header and records of one log. ValueError (naming what is wrong) for anything else; a log cut
    mid-record (the writer killed) keeps its whole records and says how many bytes were dropped in meta."""
    if not data.startswith(MAGIC):
        raise ValueError(f"not an app log: the first line is not {MAGIC!r}")
    end = data.find(b"\n", len(MAGIC), len(MAGIC) + MAX_HEADER)
    if end < 0:
        raise ValueError(f"no metadata line within {MAX_HEADER} bytes")
    try:
        meta = json.loads(data[len(MAGIC):end])
    except ValueError as exc:
        raise ValueError(f"line 2: metadata is not JSON: {exc}") from exc
    if not isinstance(meta, dict):
        raise ValueError("line 2: metadata is not a JSON object")
    body = memoryview(data)[end + 1:]
    whole = len(body) - len(body) % dtype.itemsize
    if whole != len(body):
        meta = {**meta, "trailing_bytes": len(body) - whole}
    return AppLog(meta=meta, rows=np.frombuffer(body[:whole], dtype=dtype).copy())


def parse_write_log(data: bytes) -> AppLog:
    log = parse_app_log(data, WRITE_LOG)
    if "local_port" not in log.meta:
        raise ValueError("line 2: the writer's metadata has no local_port")
    if log.rows.size and np.any(np.diff(log.rows["sched_ns"]) <= 0):
        raise ValueError("write instants are not increasing")
    return log


def parse_read_log(data: bytes) -> AppLog:
    log = parse_app_log(data, READ_LOG)
    if log.rows.size and np.any(np.diff(log.rows["end"]) <= 0):
        raise ValueError("read offsets are not increasing")
    return log
