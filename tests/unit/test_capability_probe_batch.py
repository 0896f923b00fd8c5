"""The capability probe's qdisc kinds in one `tc -batch` process (agents/host/capabilities.py): the lines it
writes and which kinds tc's literal stderr leaves accepted."""
from __future__ import annotations

from pathlib import Path

from agents.host.capabilities import accepted_kinds, qdisc_probe_batch
from agents.tcbatch import failed_lines

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "tc" / "probe_batch_no_netem.stderr"


def test_each_kind_is_added_and_deleted_then_clsact():
    text, add_lines = qdisc_probe_batch("tlp0a", {"htb": ("htb",), "netem": ("netem", "delay", "1ms")})
    assert text.splitlines() == ["qdisc add dev tlp0a root handle 1: htb", "qdisc del dev tlp0a root",
                                 "qdisc add dev tlp0a root handle 1: netem delay 1ms", "qdisc del dev tlp0a root",
                                 "qdisc add dev tlp0a clsact"]
    assert add_lines == {"htb": 1, "netem": 3, "clsact": 5}


def test_a_kind_tc_refused_is_left_out_and_a_refused_delete_does_not_count():
    _, add_lines = qdisc_probe_batch("tlfx0", {"htb": ("htb",), "netem": ("netem", "delay", "1ms")})
    assert accepted_kinds(add_lines, failed_lines(FIXTURE.read_text())) == ["clsact", "htb"]
    assert accepted_kinds(add_lines, []) == ["clsact", "htb", "netem"]
