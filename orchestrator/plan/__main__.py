"""`python -m orchestrator.plan {validate,expand,table} FILE` until the top-level CLI wires these in."""
from orchestrator.plan.commands import main

raise SystemExit(main())
