"""htb burst/cburst read back from literal `tc -s -d class show` text (iproute2 6.1; the VM lab's Debian 6.1
kernel and this machine's, tests/fixtures/tc/README.md), against the burst and cburst each chain's .cmd set."""
from __future__ import annotations

from pathlib import Path

import pytest

from schemas.qdiscs.htb import htb_class_bursts

TC = Path(__file__).resolve().parents[1] / "fixtures" / "tc"
# chain -> its htb class; in the netem chains netem is 1: (with a class 1:1 of its own, not htb) and htb is 2:
HTB_CLASS = {"htb_fq_codel": "1:1", "htb_codel": "1:1", "htb_pie_ecn": "1:1", "htb_fq_pie": "1:1",
             "htb_cake": "1:1", "netem_htb_red_ecn": "2:1", "netem_htb_red_step_ecn": "2:1", "htb_pfifo": "1:1",
             "htb_bfifo": "1:1"}
BURSTS = {"htb_bfifo": (62500, 75000)}   # the others: `burst 2500 cburst 2500`


def test_every_class_text_fixture_is_covered():
    assert {p.name.removesuffix(".class.txt") for p in TC.glob("*.class.txt")} == set(HTB_CLASS)


@pytest.mark.parametrize("chain", sorted(HTB_CLASS))
def test_htb_bursts_from_literal_class_text(chain: str) -> None:
    text = (TC / f"{chain}.class.txt").read_text()
    assert htb_class_bursts(text) == {HTB_CLASS[chain]: BURSTS.get(chain, (2500, 2500))}
