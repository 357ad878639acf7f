"""Troubleshooting: name the likely problem of a run from its logged metrics.

- :mod:`~trainopt.diagnostics.symptoms`: :func:`~trainopt.diagnostics.symptoms.diagnose` and
  the checks behind each symptom.
- :mod:`~trainopt.diagnostics.advice`: the cause and the fix of each symptom.
- :mod:`~trainopt.diagnostics.records`: reading a run's records (JSON Lines or dicts).
- :mod:`~trainopt.diagnostics.runs` and :mod:`~trainopt.diagnostics.plots`: the recorded runs of
  the troubleshooting page, and their figure and table (demonstrations).
"""

from trainopt.diagnostics.records import load_records
from trainopt.diagnostics.symptoms import SYMPTOMS, Finding, diagnose

__all__ = ["SYMPTOMS", "Finding", "diagnose", "load_records"]
