"""iperf3 -J's stdout as it really comes: iperf3 3.12 may print warning lines before the JSON document
(`WARNING:  Size of data read does not correspond to offered length` when its control connection broke while
the results were exchanged). Shared by the agent (is the document an error?) and the ingest (the parser)."""
from __future__ import annotations

MAX_LEADING_LINES = 20      # warnings before the document; more than this is not iperf3 -J output


def split_leading_warnings(text: str) -> tuple[tuple[str, ...], str]:
    """(the lines before the JSON document, the document): the document starts at the first line that opens
    with `{`. Text without one, or with more than MAX_LEADING_LINES before it, is returned whole."""
    if text.lstrip().startswith("{"):
        return (), text
    lines = text.split("\n", MAX_LEADING_LINES + 1)
    for i, line in enumerate(lines[:MAX_LEADING_LINES + 1]):
        if line.startswith("{"):
            return tuple(ln.strip() for ln in lines[:i] if ln.strip()), "\n".join(lines[i:])
    return (), text
