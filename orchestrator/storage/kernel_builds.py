"""The kernel_build table's writer: one row per build key, replaced when the same key is recorded again."""
from __future__ import annotations

import datetime as dt

from sqlalchemy import Engine, delete

from orchestrator.storage import tables


def build_row(meta: dict) -> dict:
    """A row from a cache entry's metadata.json (orchestrator/kernel/builder.py)."""
    src = meta["inputs"]["source"]
    return {"build_key": meta["key"], "variant": meta["variant"], "release": meta["release"],
            "source": f"{src['kind']} {src['name']} {src['version']}",
            "finished_at": dt.datetime.fromisoformat(meta["finished_at"]), "duration_s": float(meta["duration_s"]),
            "metadata": meta}


def upsert_build(engine: Engine, meta: dict) -> None:
    row = build_row(meta)
    with engine.begin() as conn:
        conn.execute(delete(tables.kernel_build).where(tables.kernel_build.c.build_key == row["build_key"]))
        conn.execute(tables.kernel_build.insert(), row)
