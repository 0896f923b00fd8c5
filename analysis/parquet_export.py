"""`tcplab export`: a selection of runs as one Parquet file for pandas, polars and DuckDB (docs/database.md "Export").

Every row carries its run's metadata columns (`RUN_COLUMNS`: run id, plan, experiment, arm, variant, kernel, status,
provenance, and each plan parameter as a `param_<key>` column), so a file answers questions without the database.
What a row is: a run (`runs`), a flow (`flows`, v_flow), a paired packet's queue delay (`qdelay`) or a captured
packet (`packets`, with its connection's capture point and endpoints). The file's schema metadata `tcplab` holds the
selection (selectors, run ids), what was exported and the tcplab version, as JSON.

Bulk kinds are written run by run (`ParquetWriter`), so memory is bounded by the largest run, not the selection.
"""
from __future__ import annotations

import datetime as dt
import json
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from sqlalchemy import JSON, BigInteger, DateTime, Engine, Float, Integer, SmallInteger, String, bindparam, text

from orchestrator.storage import tables as T

WHATS = ("runs", "flows", "qdelay", "packets")
METADATA_KEY = b"tcplab"
RUN_COLUMNS = ("run_id", "plan_name", "plan_sha256", "experiment", "arm", "repetition", "seed", "status", "profile",
               "variant", "kernel_variant", "kernel_release", "duration_s", "started_at", "finished_at", "run_by",
               "testbed", "tcplab_version", "tcplab_commit", "plan_commit")
_FLOW_COLUMNS = ("flow_id", "src_host", "dst_host", "src_addr", "dst_addr", "src_port", "dst_port", "cc", "tool",
                 "start_s", "duration_s", "ack_ratio", "iperf_intervals", "iperf_bytes", "goodput_bps",
                 "retransmits", "iperf_rtt_mean_us")
_CONN_COLUMNS = ("point", "proto", "src_addr", "src_port", "dst_addr", "dst_port")
_ARROW = {SmallInteger: pa.int16(), BigInteger: pa.int64(), Integer: pa.int32(), Float: pa.float64(),
          String: pa.string()}


def _arrow_type(column) -> pa.DataType:
    for cls, arrow in _ARROW.items():   # subclasses first: BigInteger is an Integer
        if isinstance(column.type, cls):
            return arrow
    raise TypeError(f"no Arrow type for {column!r}")


def _bulk(table, conn_key: str, values: Sequence[str]) -> tuple[str, pa.Schema]:
    """SQL of one run's rows of a per-packet table with its connection's columns, and their Arrow types."""
    cols = [f"c.{c}" for c in _CONN_COLUMNS] + [f"b.{c}" for c in values]
    sql = (f"SELECT {', '.join(cols)} FROM {table.name} b JOIN conn c ON c.run_key = b.run_key AND "
           f"c.conn_id = b.{conn_key} WHERE b.run_key = :key ORDER BY c.point, b.{values[0]}")
    fields = [pa.field(c, _arrow_type(T.conn.c[c])) for c in _CONN_COLUMNS]
    fields += [pa.field(c, _arrow_type(table.c[c])) for c in values]
    return sql, pa.schema(fields)


_BULK = {"qdelay": _bulk(T.qdelay, "conn_id", ("ts_in_ns", "ts_out_ns", "sojourn_ns", "payload_len", "ce", "dropped")),
         "packets": _bulk(T.packet, "conn_id", ("ts_ns", "seq", "ack", "payload_len", "ip_len", "tcp_flags", "ecn",
                                                "ip_id", "tsval", "tsecr"))}


# --- pure ------------------------------------------------------------------------------------------------------

def param_columns(params: Sequence[dict[str, Any]]) -> dict[str, list[Any]]:
    """`param_<key>` columns of the runs' params: a key whose values are all numbers, all strings or all booleans
    keeps them; any other mix (or a list or mapping) is written as JSON text, so one column has one type."""
    keys = sorted({k for p in params for k in p})
    out = {}
    for key in keys:
        values = [p.get(key) for p in params]
        kinds = {_kind(v) for v in values if v is not None}
        plain = len(kinds) <= 1 and kinds <= {"number", "str", "bool"}
        out[f"param_{key}"] = values if plain else [None if v is None else json.dumps(v, sort_keys=True)
                                                    for v in values]
    return out


def _kind(value: Any) -> str:
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int | float):
        return "number"
    return "str" if isinstance(value, str) else "json"


def _utc(value: Any) -> Any:
    """SQLite hands DateTime back naive (stored as UTC text), PostgreSQL aware: both become aware UTC."""
    if isinstance(value, dt.datetime) and value.tzinfo is None:
        return value.replace(tzinfo=dt.UTC)
    return value


def file_metadata(selectors: Sequence[str], run_ids: Sequence[str], what: str, version: str | None) -> dict:
    return {"selectors": list(selectors), "run_ids": list(run_ids), "what": what, "tcplab_version": version,
            "exported_at": dt.datetime.now(dt.UTC).isoformat()}


# --- effects ---------------------------------------------------------------------------------------------------

def run_metadata(engine: Engine, run_ids: Sequence[str]) -> pa.Table:
    """One row per run (in `run_ids` order): RUN_COLUMNS and the param_ columns, from v_run."""
    stmt = (text(f"SELECT {', '.join(RUN_COLUMNS)}, params FROM v_run WHERE run_id IN :ids")
            .bindparams(bindparam("ids", expanding=True))
            .columns(started_at=DateTime(timezone=True), finished_at=DateTime(timezone=True), params=JSON))
    with engine.connect() as conn:
        found = {r.run_id: r._mapping for r in conn.execute(stmt, {"ids": list(run_ids)})}
    rows = [found[r] for r in run_ids if r in found]
    columns: dict[str, list[Any]] = {c: [_utc(r[c]) for r in rows] for c in RUN_COLUMNS}
    columns.update(param_columns([r["params"] or {} for r in rows]))
    return pa.table(columns)


def _with_run(meta: pa.Table, run_index: pa.Array, rows: pa.Table) -> pa.Table:
    """The run metadata columns of each row (by its run's index in `meta`), then the row's own columns."""
    picked = meta.take(run_index)
    return pa.Table.from_arrays([*picked.columns, *rows.columns], names=[*picked.column_names, *rows.column_names])


def _flows(engine: Engine, meta: pa.Table) -> pa.Table:
    ids = meta.column("run_id").to_pylist()
    stmt = (text(f"SELECT run_id, {', '.join(_FLOW_COLUMNS)} FROM v_flow WHERE run_id IN :ids ORDER BY run_id, "
                 "flow_id").bindparams(bindparam("ids", expanding=True)))
    with engine.connect() as conn:
        rows = conn.execute(stmt, {"ids": ids}).all()
    position = {r: i for i, r in enumerate(ids)}
    # a flow's own duration_s is flow_duration_s: the run's is among the metadata columns
    flows = pa.table({f"flow_{c}" if c in RUN_COLUMNS else c: [r._mapping[c] for r in rows] for c in _FLOW_COLUMNS})
    return _with_run(meta, pa.array([position[r.run_id] for r in rows], pa.int64()), flows)


def _bulk_batches(engine: Engine, meta: pa.Table, what: str) -> Iterator[pa.Table]:
    sql, schema = _BULK[what]
    keys = dict(zip(meta.column("run_id").to_pylist(), range(meta.num_rows), strict=True))
    with engine.connect() as conn:
        run_keys = dict(conn.execute(text("SELECT run_id, run_key FROM run WHERE run_id IN :ids")
                                     .bindparams(bindparam("ids", expanding=True)), {"ids": list(keys)}).all())
        for run_id, index in keys.items():
            rows = conn.execute(text(sql), {"key": run_keys[run_id]}).all()
            cols = list(zip(*rows, strict=True)) if rows else [[] for _ in schema]
            own = pa.Table.from_arrays([pa.array(c, f.type) for c, f in zip(cols, schema, strict=True)], schema=schema)
            yield _with_run(meta, pa.array([index] * len(rows), pa.int64()), own)


def export(engine: Engine, run_ids: Sequence[str], what: str, out: Path, selectors: Sequence[str] = (),
           version: str | None = None) -> int:
    """Write the runs' `what` rows to `out` (Parquet); returns the number of rows."""
    if what not in WHATS:
        raise ValueError(f"--what {what!r}: one of {', '.join(WHATS)}")
    meta = run_metadata(engine, run_ids)
    info = {METADATA_KEY: json.dumps(file_metadata(selectors, meta.column("run_id").to_pylist(), what, version))}
    out.parent.mkdir(parents=True, exist_ok=True)
    if what in ("runs", "flows"):
        table = meta if what == "runs" else _flows(engine, meta)
        pq.write_table(table.replace_schema_metadata(info), out)
        return table.num_rows
    rows = 0
    writer = None
    try:
        for batch in _bulk_batches(engine, meta, what):
            if writer is None:
                writer = pq.ParquetWriter(out, batch.schema.with_metadata(info))
            writer.write_table(batch.replace_schema_metadata(info))
            rows += batch.num_rows
    finally:
        if writer is not None:
            writer.close()
    return rows


def read_metadata(path: Path) -> dict:
    """The `tcplab` entry of an exported file's schema metadata."""
    return json.loads(pq.read_schema(path).metadata[METADATA_KEY])
