"""Sphinx configuration for the trainopt site (built with ``sphinx-build -c . docs _build/html``)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT / "docs" / "_ext"))
sys.path.insert(0, str(ROOT / "src"))

os.environ.setdefault("MPLBACKEND", "Agg")

project = "trainopt"
author = "trainopt developers"
copyright = "2026, trainopt developers"

extensions = [
    "myst_parser",
    "sphinx_design",
    "sphinx_copybutton",
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
    "sphinx.ext.mathjax",
    "sphinx-mathjax-offline",  # MathJax served from _static: the site works offline
    "trainopt_docs",
]

source_suffix = {".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build", "_data", "_ext", "_generated", "**/.ipynb_checkpoints", "README.md"]
templates_path = []
html_static_path = ["docs/_static"]
html_css_files = ["trainopt.css"]

myst_enable_extensions = [
    "colon_fence",
    "dollarmath",
    "amsmath",
    "deflist",
    "fieldlist",
    "attrs_inline",
    "attrs_block",
    "substitution",
]
myst_heading_anchors = 3
myst_dmath_double_inline = True

# Copying a ``>>>`` block gives the code only: no prompts, no output.
copybutton_prompt_text = r">>> |\.\.\. |\$ "
copybutton_prompt_is_regexp = True
copybutton_only_copy_prompt_lines = True
copybutton_remove_prompts = True

autodoc_typehints = "description"
autodoc_member_order = "bysource"
napoleon_google_docstring = True
napoleon_numpy_docstring = False

html_theme = "pydata_sphinx_theme"
html_title = "trainopt"
html_favicon = "docs/_static/favicon.svg"
html_theme_options = {
    "navigation_with_keys": False,
    "show_toc_level": 2,
    "navbar_align": "left",
    "header_links_before_dropdown": 6,
    "secondary_sidebar_items": ["page-toc"],
    "footer_start": ["copyright"],
    "footer_end": [],
}
html_context = {"default_mode": "auto"}
html_show_sourcelink = False

nitpicky = False
nitpick_ignore_regex = [
    (r"py:.*", r"(torch|optuna|numpy|np|matplotlib|yaml|nn|optim|collections|pathlib|typing)\..*"),
    (r"py:class", r"(Tensor|Module|Optimizer|LRScheduler|LambdaLR|Figure|Trial|Study|Path|PathLike|Callable|Iterable|Iterator|Sequence|Mapping|Any|DataLoader|ParamsT|Generator|T|.*\.T)"),
    (r"py:class", r"(optional|default|callable|array-like)"),
]
suppress_warnings = ["myst.header"]
