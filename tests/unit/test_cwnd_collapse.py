"""M-CWNDCOLLAPSE (analysis/metrics/tcpstate.reduction_episodes): reductions found from tcp_probe's ssthresh,
the episode's lowest cwnd against the ssthresh it set, cwnd validation told apart. The fixture is the first 400
tcp_probe events of the DCTCP flow of a DCTCP-flaws run on the UML lab (k-stock-5.9 stood in by
uml-6.1-prr-5.9, TSO on): slow start ends at ssthresh 43, a CE echo during PRR's descent sets 28, and cwnd
goes on down to 20 -- 0.71 of it, below ssthresh but not a collapse (below half)."""
from __future__ import annotations

from pathlib import Path

import numpy as np

from analysis import metrics as m
from orchestrator.ingest.tcp_probe import parse_tcp_probe

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "ingest" / "tcp_probe_prr_bug_uml.txt"


def test_reductions_of_a_real_dctcp_start_under_the_prr_bug():
    s = m.cwnd_series(parse_tcp_probe(FIX.read_text(), 0))
    r = m.reduction_episodes(s.ssthresh, s.cwnd)
    assert (r.episodes, r.collapsed, r.validations) == (3, 0, 0)
    assert r.lowest_share == 20 / 28
    assert r.collapsed_share == 0.0
    # a stricter bound than half counts that episode
    assert m.reduction_episodes(s.ssthresh, s.cwnd, below=0.75).collapsed == 1


def test_a_reduction_that_ends_above_the_last_one_counts_and_cwnd_validation_does_not():
    nan = np.nan
    cwnd = np.array([40, 60, 80, 78, 70, 62, 60, 58, 50, 80, 80, 75, 72, 70, 40, 10], dtype=float)
    ssthresh = np.array([nan, nan, nan, 60, 60, 60, 60, 45, 45, 45, 60, 60, 70, 70, 30, 30])
    r = m.reduction_episodes(ssthresh, cwnd)
    # slow start's end (60 < cwnd 80), a CE echo (45), cwnd validation at the 11th ACK (60 = 3/4 of cwnd 80:
    # not a reduction), a CE echo after cwnd grew (70: above the last ssthresh, below cwnd 75), a loss (30)
    # after which cwnd fell to 10: a third of ssthresh, collapsed
    assert (r.episodes, r.collapsed, r.validations) == (4, 1, 1)
    assert r.lowest_share == 10 / 30 and r.collapsed_share == 0.25
    none = m.reduction_episodes(np.full(5, nan), np.arange(5.0))
    assert (none.episodes, none.collapsed) == (0, 0) and np.isnan(none.collapsed_share)
