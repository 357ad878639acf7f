"""Troubleshooting: name the likely problem of a run from its logged metrics.

- :mod:`~trainopt.diagnostics.symptoms`: :func:`~trainopt.diagnostics.symptoms.diagnose`, which
  runs the checks of :mod:`~trainopt.diagnostics.explosions` (from the first step on),
  :mod:`~trainopt.diagnostics.dynamics` (the shape of the loss) and
  :mod:`~trainopt.diagnostics.resources` (memory, step time, communication), on the robust
  statistics of :mod:`~trainopt.diagnostics.robust`.
- :mod:`~trainopt.diagnostics.causes`: root cause first, and what followed a blow-up tied to it.
- :mod:`~trainopt.diagnostics.findings` and :mod:`~trainopt.diagnostics.advice`: the symptoms, a
  finding, and the cause and fix of each symptom in its context.
- :mod:`~trainopt.diagnostics.records`: reading a run's records (JSON Lines or dicts).
- :mod:`trainopt.diagnostics.logs`: reading the logs people have (a Hugging Face
  ``trainer_state.json``, TensorBoard events, CSV and JSON Lines with named columns); imported
  when ``diagnose`` is given a path, never here. ``python -m trainopt.diagnostics PATH``
  (:mod:`~trainopt.diagnostics.cli`) prints the findings of a log.
- :mod:`~trainopt.diagnostics.known_causes`:
  :func:`~trainopt.diagnostics.known_causes.generate_run`, a training run with a known cause of
  trouble, to see what ``diagnose`` says of it and what a fix does.

The recorder of the runs the page ships (in :mod:`trainopt.data`), and the page's figures and
tables, are the site's workshop (``trainopt_site.diagnostics``, beside the pages), not part of
this package.
"""

from trainopt.diagnostics.findings import Finding
from trainopt.diagnostics.known_causes import generate_run
from trainopt.diagnostics.records import load_records
from trainopt.diagnostics.symptoms import diagnose

__all__ = ["Finding", "diagnose", "generate_run", "load_records"]
