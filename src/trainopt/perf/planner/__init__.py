"""The layout planner: will a model fit on a cluster, and which parallel layout to use.

- :mod:`~trainopt.perf.planner.shape`: a transformer's shape, or any ``nn.Module``'s
  (:class:`ModelShape`), its parameters and FLOPs per token.
- :mod:`~trainopt.perf.planner.layout`: the run (:class:`Training`), the parallel layout
  (:class:`Layout`) and the GPUs (:class:`Cluster`, from the GPU table with its sources).
- :mod:`~trainopt.perf.planner.memory`: memory per GPU by part (:func:`memory_per_gpu`).
- :mod:`~trainopt.perf.planner.collectives`: communication per step by collective.
- :mod:`~trainopt.perf.planner.step_time`: the step-time estimate and its assumptions.
- :mod:`~trainopt.perf.planner.layouts`: one layout's :func:`plan`, and :func:`rank_layouts`.
- :mod:`~trainopt.perf.planner.cli`: ``python -m trainopt.perf.planner``.
"""

from trainopt.perf.planner.collectives import Collective, communication_per_step
from trainopt.perf.planner.layout import Cluster, Layout, Training
from trainopt.perf.planner.layouts import Plan, plan, rank_layouts
from trainopt.perf.planner.memory import MemoryPerGPU, memory_per_gpu
from trainopt.perf.planner.shape import ModelShape
from trainopt.perf.planner.step_time import StepTime, step_time

__all__ = [
    "Cluster",
    "Collective",
    "Layout",
    "MemoryPerGPU",
    "ModelShape",
    "Plan",
    "StepTime",
    "Training",
    "communication_per_step",
    "memory_per_gpu",
    "plan",
    "rank_layouts",
    "step_time",
]
