"""Writing Tables to files (effects): CSV always, Parquet when pyarrow is installed."""
from __future__ import annotations

import csv
from pathlib import Path

from analysis.tables import Table


def parquet_available() -> bool:
    try:
        import pyarrow  # noqa: F401
    except ImportError:
        return False
    return True


def write_csv(table: Table, path: Path) -> Path:
    """Full precision, base units; an empty field for no data."""
    with path.open("w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(table.columns)
        writer.writerows(["" if v is None else v for v in row] for row in table.rows)
    return path


def write_parquet(table: Table, path: Path) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    columns = {name: [row[i] for row in table.rows] for i, name in enumerate(table.columns)}
    pq.write_table(pa.table(columns), path)
    return path


def write_tables(tables: list[Table], out_dir: Path) -> list[Path]:
    """out_dir/<name>.csv (and .parquet) for every table; returns the CSV paths."""
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    parquet = parquet_available()
    for t in tables:
        paths.append(write_csv(t, out_dir / f"{t.name}.csv"))
        if parquet:
            write_parquet(t, out_dir / f"{t.name}.parquet")
    return paths
