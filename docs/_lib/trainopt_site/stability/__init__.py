"""The stability page's workshop (``guides/training-optimization/training-stability.md``).

:mod:`~trainopt_site.stability.corpus` trains the healthy and faulty corpora
(:mod:`~trainopt_site.stability.corpus_runs`) through the stabilizer and through plain torch, and
:mod:`~trainopt_site.stability.corpus_table` renders the page's classifier tables from what it
wrote; :mod:`~trainopt_site.stability.faults` is the page's fault-injection run and its figure;
:mod:`~trainopt_site.stability.rank_agreement` is its multi-process check; and
:mod:`~trainopt_site.stability.integrations` holds the trainer page's comparison runs.
"""
