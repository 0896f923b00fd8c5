"""Guards: the pitfalls of testbed measurement as named checks (docs/guards.md).

- `pre_run`: pure checks of a RunSpec before any host is touched (refuse unless the plan accepts them);
- `clock`, `cpu`, `qdisc`, `ss`, `ecn`: checks of what a run measured;
- `finalise.finalise_run`: the one ending of every run (engine and `tcplab ingest`): parse, judge, write;
- `flag.Flag`: a finding as a value (guard code, host, message, evidence).
"""
