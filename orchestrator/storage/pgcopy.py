"""PostgreSQL binary COPY streams built with numpy: no Python tuple, no Python object per row.

A binary COPY row is `int16 field count`, then per field `int32 length` + the value in network byte
order (length -1 and no bytes for NULL). When every field of a row has a fixed width, a row is exactly
one element of a structured numpy dtype (big-endian fields, lengths as constant fields), so a whole
batch is one `ndarray.tobytes()`. Columns that vary in width (text) or may be NULL split the batch into
groups of rows that share the same widths (the same text values and the same NULL pattern); each group
is again one structured array. Text columns are meant for low-cardinality values (addresses, qdisc
handles): a group per distinct combination. A bytea column is given as an array of one fixed-width void
type (`V<w>`), one value per row, or as a 2-D (rows, k) array of it whose k items make a row's value
(e.g. a block of k packed packet records): the bytes are copied as they are.
"""
from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence

import numpy as np

HEADER = b"PGCOPY\n\xff\r\n\x00" + b"\x00" * 8   # signature, flags, header extension length
TRAILER = b"\xff\xff"
FIXED = {"int2": ">i2", "int4": ">i4", "int8": ">i8", "float8": ">f8"}
TYPES = (*FIXED, "text", "bytea")


def batch_rows(data: Mapping[str, object]) -> int:
    """Rows of a batch: the length of its first one-dimensional array (0 if it has none)."""
    return next((len(v) for v in data.values() if isinstance(v, np.ndarray) and v.ndim == 1), 0)


def _layout(cols: Sequence[tuple[str, str]], data: Mapping[str, np.ndarray], text: Mapping[str, bytes],
            null: set[str]) -> np.dtype:
    fields: list[tuple[str, str | np.dtype]] = [("nf", ">i2")]
    for i, (name, kind) in enumerate(cols):
        fields.append((f"l{i}", ">i4"))
        if name in null:
            continue
        if kind == "text":
            fields.append((f"v{i}", f"S{len(text[name])}" if text[name] else "V0"))
        elif kind == "bytea":
            value = _void(data[name])
            fields.append((f"v{i}", (value.dtype, value.shape[1:])))
        else:
            fields.append((f"v{i}", FIXED[kind]))
    return np.dtype(fields)


def _fill(cols: Sequence[tuple[str, str]], data: Mapping[str, np.ndarray], rows: np.ndarray | slice, n: int,
          text: Mapping[str, bytes], null: set[str]) -> bytes:
    rec = np.empty(n, _layout(cols, data, text, null))
    rec["nf"] = len(cols)
    for i, (name, kind) in enumerate(cols):
        if name in null:
            rec[f"l{i}"] = -1
        elif kind == "text":
            rec[f"l{i}"] = len(text[name])
            if text[name]:
                rec[f"v{i}"] = text[name]
        elif kind == "bytea":
            value = _void(data[name])
            rec[f"l{i}"] = value.dtype.itemsize * int(np.prod(value.shape[1:]))
            rec[f"v{i}"] = value[rows]
        else:
            rec[f"l{i}"] = np.dtype(FIXED[kind]).itemsize
            value = data[name]
            rec[f"v{i}"] = value[rows] if isinstance(value, np.ndarray) else value
    return rec.tobytes()


def encode(cols: Sequence[tuple[str, str]], data: Mapping[str, np.ndarray],
           nulls: Mapping[str, np.ndarray] | None = None) -> Iterator[bytes]:
    """Binary COPY rows (no header/trailer) of `cols` = [(column, kind)], kind in TYPES.

    `data[column]` holds one value per row (text columns: str or bytes values), or one scalar for all
    rows; `nulls[column]` is a boolean mask of rows where that column is NULL.
    """
    for _, kind in cols:
        if kind not in TYPES:
            raise TypeError(f"no binary COPY encoding for {kind!r}")
    nulls = {k: np.asarray(v, dtype=bool) for k, v in (nulls or {}).items() if np.any(v)}
    n = batch_rows(data)
    const = {name: _utf8(data[name]) for name, kind in cols
             if kind == "text" and not isinstance(data[name], np.ndarray)}
    texts = [name for name, kind in cols if kind == "text" and name not in const]
    if n == 0:
        return
    if not texts and not nulls:
        yield _fill(cols, data, slice(None), n, const, set())
        return
    uniq: dict[str, np.ndarray] = {}
    codes: list[np.ndarray] = []
    for name in texts:
        uniq[name], inv = np.unique(np.asarray(data[name]), return_inverse=True)
        codes.append(inv.reshape(-1))
    null_names = sorted(nulls)
    codes += [nulls[name].astype(np.int64) for name in null_names]
    combos, group = np.unique(np.stack(codes, axis=1), axis=0, return_inverse=True)
    group = group.reshape(-1)
    order = np.argsort(group, kind="stable")
    bounds = np.searchsorted(group[order], np.arange(len(combos) + 1))
    for g, combo in enumerate(combos):
        rows = order[bounds[g]:bounds[g + 1]]
        text = {**const, **{name: _utf8(uniq[name][combo[k]]) for k, name in enumerate(texts)}}
        null = {name for k, name in enumerate(null_names) if combo[len(texts) + k]}
        yield _fill(cols, data, rows, rows.size, text, null)


def _void(value: object) -> np.ndarray:
    if not (isinstance(value, np.ndarray) and value.dtype.kind == "V" and value.dtype.names is None
            and value.ndim in (1, 2)):
        raise TypeError("a bytea column takes a 1-D or 2-D array of one fixed-width void type (V<w>)")
    return value


def _utf8(value: object) -> bytes:
    return value if isinstance(value, bytes) else str(value).encode()
