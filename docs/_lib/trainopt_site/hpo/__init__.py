"""The hyperparameter-optimization page's workshop (``guides/training-optimization/
hyperparameter-optimization.md``): what a study costs per trial against plain Optuna
(``python -m trainopt_site.hpo.overhead``), and the table the page renders of it.
"""
