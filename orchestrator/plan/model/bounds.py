"""The plan loader's own bounds, in one place: how large a plan may be before it is refused.

They keep `tcplab plan validate` fast and small on any input (a hostile or mistyped plan fails in well
under a second instead of running for minutes); each sits far above what the study plans in
experiments/ need, with the figure it was set against. The bounds the *agents* enforce (run length,
sampling intervals, tasks per schedule, ...) are in schemas/limits.py; the plan checks apply those too
(checks/agent_limits.py). docs/plans.md#limits lists both.
"""
from __future__ import annotations

# the file and its YAML
MAX_PLAN_BYTES = 2**20     # the largest study plan is 25 KB; a megabyte of YAML parses in about a second
MAX_NODES = 50_000         # YAML nodes (scalars, lists, mappings, expanded aliases); the largest study
                           # plan has under 2,000
MAX_DEPTH = 40             # nesting levels; real plans nest about 8 deep
MAX_NUMBER_CHARS = 40      # characters of one written number (a 128-bit integer has 39 digits)
MAX_EXPONENT = 100         # decimal exponents within 1e-100 .. 1e100 keep exact arithmetic cheap

# the expansion
MAX_RUNS = 10_000          # runs of a plan, repetitions included; the largest study plan has 1,140
MAX_FLOWS_PER_RUN = 1024   # flows of one run over all its groups (one group already stops at 1024)
MAX_PLAN_FLOWS = 50_000    # flows summed over the plan's matrix cells; the largest study plan has 3,271
