"""Campaign statistics (docs/statistics.md): pure NumPy/SciPy, seeded, no database and no manager.

- verdict: estimate (ratio of medians, bootstrap CI, Mann-Whitney p), benjamini_hochberg, decide, absolute
- resample: the seeded, vectorised bootstrap and the Mann-Whitney method choice behind verdict
- sequential: the repetition policy (ABBA order, how many more repetitions)
- trend (with edivisive): change points over nights and the last good night
- defaults: the recommended alpha and minimum effects per metric kind
- simulate: seeded campaign simulation for the benchmark and the tests
"""
