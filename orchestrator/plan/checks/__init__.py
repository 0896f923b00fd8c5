"""Everything that refuses a plan, run once when the plan is loaded.

Owns reading YAML with the line and column of every node (`yamlpos`), the validation passes (`passes`:
the model, the varied values, plan-wide rules, every instantiated cell), their rules (`plan_rules`,
`run_rules`), turning pydantic errors into located problems (`diagnose`), and errors as values reported
as FILE:LINE:COL (`errors`). `loader` is the entry point: `load_plan`, `load_plan_text`, `check_plan`.
Instantiates cells with the expansion's own functions, so a plan that passes expands without surprises.
"""
