"""The troubleshooting page's workshop (``guides/troubleshooting.md``): the recorder of the runs it
ships (``python -m trainopt_site.diagnostics.runs``), the grid of generated runs with a known cause
that :func:`trainopt.diagnostics.diagnose` is proven on, and the page's figures and tables.
"""
