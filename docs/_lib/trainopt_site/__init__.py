"""The site's workshop: the code that makes the pages' evidence, kept out of the wheel.

``trainopt`` (``src/``) is the library a reader installs. This package, beside the pages in
``docs/_lib/``, holds what exists to produce the site's evidence: the corpora the stabilizer is
scored on and the fault demonstrations, the recorders and generators of recorded runs, the
pages' figures, overhead runs and the integrations' comparison runs. It is laid out like the
library, section by section (``trainopt_site.stability`` serves the stability page). The pages
(Sphinx's ``conf.py``), the tests (``tests/conftest.py``) and the development environment
(``make venv`` puts ``docs/_lib`` on its path, so ``python -m trainopt_site.stability.corpus``
works there) import it; the wheel does not install it, and nothing in ``src/`` imports it.
"""
