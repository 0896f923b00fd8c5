"""Campaign statistics (docs/statistics.md): pure NumPy/SciPy, seeded, no database and no manager.

- verdict: estimate (ratio of medians, bootstrap CI, Mann-Whitney p), Benjamini-Hochberg, decide, absolute
- sequential: the repetition policy (ABBA order, how many more repetitions)
- trend: change points over nights (E-Divisive) and the last good night
"""
