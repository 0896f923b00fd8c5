"""From a checked plan to its runs: pure, deterministic, and never checking the plan again.

Owns the matrix (`matrix`: cells and the plan's assignments), instantiating a cell into a run template
and the run key hashed into its ids (`instantiate`, over the canonical form in `canon`), the derived
values (`derive`), the kernel-unit parts of a RunSpec (`build`), the RunSpec models themselves
(`runspec`), run ids, params, seeds and order (`runs`: `expand`), and the study-style table (`table`).
Depends on `orchestrator.plan.model` only.
"""
