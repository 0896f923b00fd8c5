"""The kernel_trace artifact (agents/ktrace.py, format in schemas/ktrace.py) -> records.KERNEL_TRACE rows. Pure.

- `raw mono` section: `pid cpu ts_ns type: ID` lines; the probe events (ids in the `#@ probe` header) are paired
  entry -> return per (pid, cpu) with a stack (nested calls pair inside out), vectorised: each event's nesting
  level is the running count of entries minus returns, and an entry pairs with the next return at its level.
  One row per pair: ts_ns of the entry, duration_ns = return - entry.
- `text mono` section: the instance's text form; tracepoint lines (`system`-less event name: mapped back to the
  asked `system:event`) keep their fields as text; trace_printk lines (text form `caller: message`) keep the
  message and, when it reads `<name> ... <n> ns` (docs/ingest.md#kernel-trace), the number as value, name as event.
- `printk <clock>` section: the top-level buffer of a kernel without trace_printk_dest; its clock is mapped to
  mono by the `tcplab-sync <mono ns>` lines the agent wrote to trace_marker (their stamps vs their numbers).

Stamps become CLOCK_REALTIME with the mean of the start and end `realtime - mono` offsets the agent sampled.
Text stamps have microsecond resolution (the kernel prints them so); raw stamps nanoseconds.
"""
from __future__ import annotations

import re
import warnings

import numpy as np

from orchestrator.storage.records import KERNEL_TRACE
from schemas.ktrace import SYNC_MARKER


class KtraceError(ValueError):
    pass


RAW_LINE = re.compile(rb"^\s*(\d+) (\d+) (\d+) type: (\d+)$", re.MULTILINE)
TEXT_LINE = re.compile(r"^\s*(.+?)-(\d+)\s+(?:\(\s*[-\d]+\)\s+)?\[(\d+)\]\s+(?:\S{4,6}\s+)?(\d+)\.(\d{6}):\s+"
                       r"([A-Za-z0-9_.]+):\s?(.*)$")
# a trace_printk timing line: `<name> ... <n> ns` (the number right before a closing `ns`)
PRINTK_TIMING = re.compile(r"^\s*([A-Za-z_][A-Za-z0-9_.]{0,63})\b.*?(-?\d+(?:\.\d+)?)\s*ns\s*$")
TEXT_CUT = KERNEL_TRACE["text"].itemsize // 4


def split_sections(data: bytes) -> tuple[dict[str, list[str]], dict[str, bytes]]:
    """(header: key -> its `#@` lines' words, sections: title -> bytes)."""
    header: dict[str, list[str]] = {}
    sections: dict[str, bytes] = {}
    parts = re.split(rb"^#@ section ([^\n]*)\n", data, flags=re.MULTILINE)
    for line in parts[0].decode(errors="replace").splitlines():
        if not line.startswith("#@ "):
            continue
        key, _, rest = line[3:].partition(" ")
        header.setdefault(key, []).append(rest)
    if "tcplab-kernel-trace" not in header:
        raise KtraceError("not a kernel_trace artifact (no `#@ tcplab-kernel-trace` line)")
    for title, body in zip(parts[1::2], parts[2::2], strict=True):
        sections[title.decode()] = body
    return header, sections


def offsets_ns(header: dict[str, list[str]]) -> int:
    """realtime - mono: the mean of the offsets sampled at the start and the end."""
    vals = [int(v.split()[1]) for v in header.get("offset", [])]
    if not vals:
        raise KtraceError("no `#@ offset` line: the stamps cannot be put on the run's clock")
    return sum(vals) // len(vals)


def probe_ids(header: dict[str, list[str]]) -> dict[int, tuple[str, str]]:
    """type id -> (kind entry|return, symbol)."""
    out = {}
    for v in header.get("probe", []):
        tid, kind, sym = v.split()
        out[int(tid)] = (kind, sym)
    return out


def pair_calls(pid: np.ndarray, cpu: np.ndarray, ts: np.ndarray, is_entry: np.ndarray
               ) -> tuple[np.ndarray, np.ndarray]:
    """Indices (entry, return) of matched calls of one function, events in buffer order. Per (pid, cpu) the
    nesting level of an entry is the count of entries minus returns up to and including it, of a return the
    count before it; an entry pairs with the next event of its key and level if that is a return. A return
    before its entry (tracing began inside the call) or an entry without return stays unpaired."""
    n = len(ts)
    if n == 0:
        return np.empty(0, np.int64), np.empty(0, np.int64)
    order = np.lexsort((np.arange(n), ts, cpu, pid))   # stable: buffer order within equal stamps
    p, c, e = pid[order], cpu[order], is_entry[order]
    new_key = np.ones(n, bool)
    new_key[1:] = (p[1:] != p[:-1]) | (c[1:] != c[:-1])
    step = np.where(e, 1, -1)
    csum = np.cumsum(step)
    base = np.maximum.accumulate(np.where(new_key, np.arange(n), 0))
    level_after = csum - (csum[base] - step[base])   # running sum restarted at each key
    level = np.where(e, level_after, level_after + 1)
    key_id = np.cumsum(new_key)
    o2 = np.lexsort((np.arange(n), level, key_id))
    ke, lv, ee = key_id[o2], level[o2], e[o2]
    ok = (ee[:-1] & ~ee[1:]) & (ke[:-1] == ke[1:]) & (lv[:-1] == lv[1:])
    i = np.flatnonzero(ok)
    return order[o2[i]], order[o2[i + 1]]


NOT_EVENTS = re.compile(rb"^(?:#|CPU:).*\n?", re.MULTILINE)   # headers, `CPU:N [LOST n EVENTS]`


def raw_columns(body: bytes) -> np.ndarray:
    """(n, 4) int64 pid, cpu, ts_ns, type id of the raw section's event lines: numpy reads the numbers in one
    pass (millions of lines at a high packet rate); a section with any other line falls back to a regex."""
    events = NOT_EVENTS.sub(b"", body)
    lines = events.count(b"\n") + (0 if events.endswith(b"\n") or not events else 1)
    if lines == 0:
        return np.empty((0, 4), np.int64)
    if events.count(b" type: ") == lines:
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("error")   # numpy only warns when it stops at a non-number
                numbers = np.fromstring(events.replace(b" type: ", b" ").decode("ascii"), dtype=np.int64, sep=" ")
            if len(numbers) == 4 * lines:
                return numbers.reshape(-1, 4)
        except (ValueError, DeprecationWarning, UnicodeDecodeError):
            pass
    m = RAW_LINE.findall(body)
    return np.array(m, dtype=np.int64).reshape(-1, 4)


def parse_raw(body: bytes, ids: dict[int, tuple[str, str]], offset: int) -> np.ndarray:
    """kprobe/kretprobe pairs of the raw section -> rows (one per call)."""
    a = raw_columns(body)
    if len(a) == 0:
        return np.empty(0, KERNEL_TRACE)
    pid, cpu, ts, tid = a[:, 0], a[:, 1], a[:, 2], a[:, 3]
    rows = []
    for sym in sorted({s for _, s in ids.values()}):
        entry_ids = [t for t, (k, s) in ids.items() if s == sym and k == "entry"]
        ret_ids = [t for t, (k, s) in ids.items() if s == sym and k == "return"]
        mine = np.isin(tid, entry_ids + ret_ids)
        ei, ri = pair_calls(pid[mine], cpu[mine], ts[mine], np.isin(tid[mine], entry_ids))
        out = np.zeros(len(ei), KERNEL_TRACE)
        out["ts_ns"] = ts[mine][ei] + offset
        out["cpu"], out["pid"] = cpu[mine][ei], pid[mine][ei]
        out["source"], out["event"] = "kprobe", sym
        out["duration_ns"] = ts[mine][ri] - ts[mine][ei]
        out["value"] = np.nan
        rows.append(out)
    return np.concatenate(rows) if rows else np.empty(0, KERNEL_TRACE)


OWN_PROBE_EVENT = re.compile(r"^kt\d+_")   # the agent's kprobe events (schemas/ktrace.py event_base): raw section


def _text_rows(body: bytes, tracepoints: dict[str, str], clock_to_mono: int, offset: int,
               printk_only: bool = False) -> list[tuple]:
    rows = []
    for line in body.decode(errors="replace").splitlines():
        if not line or line.startswith("#"):
            continue
        m = TEXT_LINE.match(line)
        if m is None:
            continue
        _task, pid, cpu, sec, usec, event, msg = m.groups()
        if OWN_PROBE_EVENT.match(event):
            continue
        ts = (int(sec) * 1_000_000 + int(usec)) * 1000 + clock_to_mono + offset
        if event in tracepoints and not printk_only:
            rows.append((ts, int(cpu), int(pid), "tracepoint", tracepoints[event], -1, np.nan, msg[:TEXT_CUT]))
        elif event not in tracepoints:
            if event == "tracing_mark_write" and msg.startswith(SYNC_MARKER):
                continue
            timing = PRINTK_TIMING.match(msg)
            name, value = (timing.group(1), float(timing.group(2))) if timing else (event, np.nan)
            rows.append((ts, int(cpu), int(pid), "printk", name[:64], -1, value, msg[:TEXT_CUT]))
    return rows


def sync_offset(body: bytes, header: dict[str, list[str]]) -> int:
    """mono - top-level clock, from the agent's trace_marker lines (their stamp vs the mono ns they carry)."""
    marks = {int(v.split()[1]) for v in header.get("sync", [])}
    diffs = []
    for line in body.decode(errors="replace").splitlines():
        m = TEXT_LINE.match(line)
        if m and m.group(6) == "tracing_mark_write" and m.group(7).startswith(SYNC_MARKER):
            mono = int(m.group(7).split()[1])
            if mono in marks:
                diffs.append(mono - (int(m.group(4)) * 1_000_000 + int(m.group(5))) * 1000)
    if not diffs:
        raise KtraceError("the top-level trace_printk section has none of the agent's tcplab-sync lines: its "
                          "clock cannot be mapped to the run's")
    return sum(diffs) // len(diffs)


def parse_kernel_trace(data: bytes, tracepoints: list[str]) -> np.ndarray:
    """All rows of one host's artifact, in time order. `tracepoints`: the asked `system:event` names (the text
    form names an event without its system)."""
    header, sections = split_sections(data)
    offset = offsets_ns(header)
    ids = probe_ids(header)
    names = {tp.split(":")[1]: tp for tp in tracepoints}
    parts = []
    if "raw mono" in sections:
        parts.append(parse_raw(sections["raw mono"], ids, offset))
    rows = _text_rows(sections.get("text mono", b""), names, 0, offset)
    if rows:
        parts.append(np.array(rows, dtype=KERNEL_TRACE))
    for title in [t for t in sections if t.startswith("printk ")]:
        body = sections[title]
        top = _text_rows(body, names, sync_offset(body, header), offset, printk_only=True)
        if top:   # the top-level buffer may hold older lines: only those between the agent's two sync marks
            arr = np.array(top, dtype=KERNEL_TRACE)
            marks = sorted(int(v.split()[1]) + offset for v in header.get("sync", []))
            parts.append(arr[(arr["ts_ns"] >= marks[0]) & (arr["ts_ns"] <= marks[-1])])
    out = np.concatenate(parts) if parts else np.empty(0, KERNEL_TRACE)
    return out[np.argsort(out["ts_ns"], kind="stable")]
