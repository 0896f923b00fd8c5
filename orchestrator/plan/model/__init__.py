"""The plan document as typed values: what a plan file may say, and nothing about what it means for a run.

Owns the pydantic models of a plan (`plan.Plan`: matrix, arms, experiments; `template.RunTemplate`: the
`run:` section with its bottleneck, hosts, captures and pollers; `traffic`, `conditions`, `qdiscs`,
`kernels`), the unit-typed quantities they are written in (`units`, `quantities`), the frame sizes the
model's defaults count in (`frames`), key paths and dotted field paths into the model (`paths`), and the
JSON Schema generated from it (`schema`). Only single-field rules live here; rules that relate fields are
in `orchestrator.plan.checks`. Depends on nothing else in the plan package.
"""
