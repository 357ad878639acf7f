"""The trainer page's workshop (``guides/training-optimization/use-with-your-trainer.md``).

:mod:`~trainopt_site.stability.integrations.checks` trains one tiny run per framework (the
Hugging Face ``Trainer``, Lightning, Accelerate), with and without trainopt, for the tests that
back the page's comparisons. Each imports its framework when called.
"""
