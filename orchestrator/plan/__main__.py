"""`python -m orchestrator.plan {validate,expand,table} FILE`: the `tcplab plan ...` commands on their own."""
from orchestrator.plan.commands import main

raise SystemExit(main())
