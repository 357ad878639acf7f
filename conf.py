"""Sphinx configuration for the trainopt site (built with
``sphinx-build -c . docs _build/html``)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT / "docs" / "_ext"))
sys.path.insert(
    0, str(ROOT / "docs" / "_lib")
)  # the site's workshop (trainopt_site), not in the wheel
sys.path.insert(0, str(ROOT / "src"))

os.environ.setdefault("MPLBACKEND", "Agg")

import trainopt  # noqa: E402 - from src/, put on the path above

project = "trainopt"
release = trainopt.__version__
version = ".".join(release.split(".")[:2])
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
    "trainopt_reading",
]

source_suffix = {".md": "markdown"}
root_doc = "index"
exclude_patterns = [
    "_build",
    "_data",
    "_ext",
    "_lib",
    "_generated",
    "**/.ipynb_checkpoints",
    "README.md",
]
templates_path = []
html_static_path = ["docs/_static"]
html_css_files = [("trainopt.css", {"priority": 800})]
# Sphinx's search weights, but a section titled with the whole query ranks first
html_search_scorer = "docs/_search/scorer.js"

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
myst_substitutions = {"release": release}
myst_dmath_double_inline = True

# Copying a ``>>>`` block gives the code only: no prompts, no output.
copybutton_prompt_text = r">>> |\.\.\. |\$ "
copybutton_prompt_is_regexp = True
copybutton_only_copy_prompt_lines = True
copybutton_remove_prompts = True
# A long shell command wraps with a trailing backslash; its continuation lines are copied too.
copybutton_line_continuation_character = "\\"

autodoc_typehints = "description"
autodoc_member_order = "bysource"
napoleon_google_docstring = True
napoleon_numpy_docstring = False

html_theme = "pydata_sphinx_theme"
html_title = f"trainopt {release}"
html_favicon = "docs/_static/favicon.svg"
html_permalinks_icon = "#"
html_theme_options = {
    "navigation_with_keys": False,
    "show_toc_level": 2,
    "navbar_align": "left",
    "header_links_before_dropdown": 6,
    "secondary_sidebar_items": ["page-toc"],
    "footer_start": ["copyright"],
    "footer_end": [],
    "icon_links": [],
    "logo": {},
}
html_context = {"default_mode": "auto"}
# Pages without siblings have nothing to put in a "Section Navigation" sidebar.
html_sidebars = {
    "index": [],
    "glossary": [],
    "concepts/*": [],
    "guides/troubleshooting": [],
}
html_show_sourcelink = False

nitpicky = False
nitpick_ignore_regex = [
    (r"py:.*", r"(torch|optuna|numpy|np|matplotlib|yaml|nn|optim|collections|pathlib|typing)\..*"),
    (
        r"py:class",
        r"(Tensor|Module|Optimizer|LRScheduler|LambdaLR|Figure|Trial|Study|Path|PathLike|Callable|Iterable|Iterator|Sequence|Mapping|Any|DataLoader|ParamsT|Generator|T|.*\.T)",
    ),
    (r"py:class", r"(optional|default|callable|array-like)"),
]
suppress_warnings = ["myst.header"]


# --------------------------------------------------------------------------------------------
# A no-op rebuild reads nothing. Sphinx compares this file's values with the ones it pickled at
# the end of the last build, after the theme and extensions had added to them. Set those
# additions here, in the form they end in, so the two agree; ``_drop_repeats`` removes the
# second copy the extensions append when the builder starts.
# --------------------------------------------------------------------------------------------


def _extension_paths() -> tuple[list[str], list[str]]:
    import pydata_sphinx_theme
    import sphinx_copybutton
    import sphinx_design.extension

    static = [
        str(sphinx_design.extension.STATIC_DIR),
        str(Path(sphinx_copybutton.__file__).parent.joinpath("_static").absolute()),
    ]
    theme = Path(pydata_sphinx_theme.__file__).parent.resolve() / "theme" / "pydata_sphinx_theme"
    return static, [str(theme / "components")]


_static, _templates = _extension_paths()
html_static_path += _static
templates_path += _templates
mathjax4_config = {
    "options": {"processHtmlClass": "tex2jax_process|mathjax_process|math|output_area"}
}


def _drop_repeats(app, config=None) -> None:
    for name in ("html_static_path", "templates_path"):
        values = getattr(app.config, name)
        values[:] = list(dict.fromkeys(values))


def setup(app) -> None:
    app.connect("config-inited", _drop_repeats, priority=900)
    app.connect("builder-inited", _drop_repeats, priority=900)
