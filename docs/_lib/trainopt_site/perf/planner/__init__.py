"""The layout planner page's workshop: its checks and the tables it renders.

:mod:`~trainopt_site.perf.planner.checks` holds the planner to a trace on fake tensors and a
fake process group (FSDP2 and tensor parallelism) and to a measured two-process gloo step (DDP
and FSDP2); :mod:`~trainopt_site.perf.planner.tables` renders the GPU table, the comparison
with published runs (``docs/_data/published_runs.json``) and the decision tables by scale.
"""
