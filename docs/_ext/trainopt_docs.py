"""Sphinx directives that keep every code block, figure and table of the site tied to ``src/``.

Directives (all usable from MyST as ```` ```{name} ````):

``trainopt-source``
    Shows the source of a ``trainopt`` object by dotted name, without its docstrings, preceded by
    exactly the imports it needs, so that the copied block runs in a fresh interpreter with
    ``trainopt`` installed; folded in a closed dropdown titled with the dotted name.
``trainopt-figure``
    Calls a ``trainopt`` function that returns a matplotlib Figure, saves it as PNG at build time
    (with its smallest text height in pixels as PNG metadata, ``trainopt_min_text_px``) and shows
    it, linked to the full-size PNG. Options: ``:alt:`` and ``:caption:`` (both required),
    ``:kwargs:`` (JSON), ``:data:`` (a path under ``docs/`` passed as the first argument),
    ``:width:``.
``trainopt-render``
    Calls a ``trainopt`` function that returns MyST Markdown (a table, say) and parses it in
    place. Options: ``:data:`` and ``:kwargs:`` as above.
``trainopt-cards``
    A sphinx-design grid whose cards are built from the linked pages' own front matter (title,
    ``summary``/``description``, ``icon``, ``difficulty``), so a card can't disagree with its page.

Events: the ``description`` front-matter key becomes ``<meta name="description">``, and the
``difficulty`` key becomes a badge under the page title.
"""

from __future__ import annotations

import ast
import hashlib
import importlib
import inspect
import json
import os
import textwrap
from pathlib import Path
from typing import Any

import yaml
from docutils import nodes
from docutils.parsers.rst import directives
from docutils.statemachine import StringList
from sphinx.application import Sphinx
from sphinx.util.docutils import SphinxDirective

DIFFICULTY_COLOURS = {"beginner": "success", "intermediate": "info", "advanced": "warning"}


# --------------------------------------------------------------------------------------------
# Source with imports
# --------------------------------------------------------------------------------------------


def resolve(dotted: str) -> tuple[Any, str, str]:
    """Import ``pkg.module.obj`` and return ``(obj, module_name, qualname)``."""
    module_name, _, attr = dotted.rpartition(".")
    if not module_name:
        raise ValueError(f"expected a dotted name like 'trainopt.module.object', got {dotted!r}")
    module = importlib.import_module(module_name)
    if not hasattr(module, attr):
        raise ValueError(f"{module_name} has no attribute {attr!r}")
    return getattr(module, attr), module_name, attr


def _module_bindings(tree: ast.Module, module_name: str) -> dict[str, str]:
    """Map each name bound at module level to the statement that provides it in a fresh file."""
    bindings: dict[str, str] = {}
    for node in tree.body:
        if isinstance(node, ast.Import):
            for alias in node.names:
                bound = alias.asname or alias.name.split(".")[0]
                text = f"import {alias.name}" + (f" as {alias.asname}" if alias.asname else "")
                bindings[bound] = text
        elif isinstance(node, ast.ImportFrom):
            if node.module == "__future__":
                continue
            base = "." * node.level + (node.module or "")
            if node.level:
                package = module_name.rsplit(".", node.level)[0]
                base = package + ("." + node.module if node.module else "")
            for alias in node.names:
                bound = alias.asname or alias.name
                name = alias.name + (f" as {alias.asname}" if alias.asname else "")
                bindings[bound] = f"from {base} import {name}"
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            bindings[node.name] = f"from {module_name} import {node.name}"
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                for sub in ast.walk(target):
                    if isinstance(sub, ast.Name):
                        bindings[sub.id] = f"from {module_name} import {sub.id}"
    return bindings


def _find_node(tree: ast.Module, name: str) -> ast.AST:
    for node in tree.body:
        if (
            isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
            and node.name == name
        ):
            return node
    raise ValueError(f"no top-level function or class named {name!r}")


def source_with_imports(dotted: str, docstrings: bool = False) -> str:
    """Return the source of a top-level ``trainopt`` object with the imports it needs first.

    The result runs as a script in a fresh interpreter where ``trainopt`` is installed: names the
    object uses that its module imports are imported the same way, and names the module defines
    itself (helpers, constants) are imported from the module. Unless ``docstrings`` is true, the
    docstrings of the object and of everything defined inside it are left out: on a page, the
    prose around the block is the docstring.
    """
    _, module_name, attr = resolve(dotted)
    module = importlib.import_module(module_name)
    path = Path(inspect.getsourcefile(module))
    source = path.read_text()
    tree = ast.parse(source)
    node = _find_node(tree, attr)
    bindings = _module_bindings(tree, module_name)
    used = {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}
    # Names in string annotations and decorators count too.
    for n in ast.walk(node):
        if isinstance(n, ast.Constant) and isinstance(n.value, str) and n.value.isidentifier():
            used.add(n.value)
    used.discard(attr)
    imports: list[str] = []
    own: list[str] = []
    for name in sorted(used):
        stmt = bindings.get(name)
        if stmt is None:
            continue
        (own if stmt.startswith(f"from {module_name} import") else imports).append(stmt)
    future = any(isinstance(n, ast.ImportFrom) and n.module == "__future__" for n in tree.body)
    lines = source.splitlines()
    if not docstrings:
        lines = _without_docstrings(lines, node)
    first = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])])
    kept = [line for line in lines[first - 1 : node.end_lineno] if line != _GONE]
    body = textwrap.dedent("\n".join(kept))
    header = (["from __future__ import annotations", ""] if future else []) + sorted(
        set(imports), key=_import_sort_key
    )
    if own:
        header += sorted(set(own))
    return ("\n".join(header) + "\n\n\n" if header else "") + body + "\n"


_DEFS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
_GONE = "\x00"  # marks a removed line, so that line numbers stay valid until the end


def _without_docstrings(lines: list[str], node: ast.AST) -> list[str]:
    """``lines`` with the docstrings of ``node`` and of every definition inside it blanked out.

    A removed line becomes a marker that the caller drops; a body that held only its docstring
    gets ``...`` so the code still parses.
    """
    lines = list(lines)
    for sub in ast.walk(node):
        if not isinstance(sub, _DEFS) or not sub.body:
            continue
        first = sub.body[0]
        if not (
            isinstance(first, ast.Expr)
            and isinstance(first.value, ast.Constant)
            and isinstance(first.value.value, str)
        ):
            continue
        start, end = first.lineno, first.end_lineno
        indent = lines[start - 1][: len(lines[start - 1]) - len(lines[start - 1].lstrip())]
        for i in range(start - 1, end):
            lines[i] = _GONE
        if len(sub.body) == 1:
            lines[start - 1] = indent + "..."
        # a blank line right after a removed docstring would open the body with a gap
        elif end < len(lines) and not lines[end].strip():
            lines[end] = _GONE
    return lines


def _import_sort_key(stmt: str) -> tuple[int, str]:
    return (0 if stmt.startswith("import ") else 1, stmt)


class TrainoptSource(SphinxDirective):
    """Show a ``trainopt`` object's source without its docstrings, with the imports it needs.

    The block sits in a sphinx-design dropdown, closed by default and titled with the object's
    dotted path: a reader who came for the call sees the usage; one who wants the code opens it.
    """

    required_arguments = 1
    option_spec = {"name": directives.unchanged}

    def run(self) -> list[nodes.Node]:
        from sphinx_design.shared import create_component

        dotted = self.arguments[0]
        try:
            code = source_with_imports(dotted)
            _, module_name, _ = resolve(dotted)
        except Exception as exc:  # noqa: BLE001 - reported as a build error with its location
            raise self.error(f"trainopt-source {dotted}: {exc}") from exc
        module = importlib.import_module(module_name)
        src_file = Path(inspect.getsourcefile(module))
        self.env.note_dependency(str(src_file))
        literal = nodes.literal_block(code, code, language="python")
        literal["classes"].append("trainopt-source")
        self.set_source_info(literal)
        # The same component the {dropdown} directive builds, so the theme styles it alike.
        dropdown = create_component(
            "dropdown",
            opened=False,
            type="dropdown",
            has_title=True,
            icon="code",
            chevron=None,
            container_classes=["sd-mb-3", "trainopt-source-dropdown"],
            title_classes=[],
            body_classes=[],
        )
        self.set_source_info(dropdown)
        # A long path may wrap on a phone: only after a dot, never inside a name.
        path = nodes.literal(dotted, "")
        for i, part in enumerate(dotted.split(".")):
            if i:
                path += nodes.Text(".")
                path += nodes.raw("", "<wbr>", format="html")
            path += nodes.Text(part)
        title = nodes.rubric(dotted, "", path)
        dropdown += title
        dropdown += literal
        self.add_name(title)
        return [dropdown]


# --------------------------------------------------------------------------------------------
# Build-time figures and rendered tables
# --------------------------------------------------------------------------------------------


def _call(directive: SphinxDirective) -> Any:
    dotted = directive.arguments[0]
    func, module_name, _ = resolve(dotted)
    module = importlib.import_module(module_name)
    directive.env.note_dependency(inspect.getsourcefile(module))
    kwargs = json.loads(directive.options.get("kwargs", "{}"))
    args: list[Any] = []
    if "data" in directive.options:
        data = Path(directive.env.srcdir) / directive.options["data"]
        if data.exists():
            directive.env.note_dependency(str(data))
        else:
            # A results file not recorded yet (a GPU run, say). Sphinx re-reads a page with a
            # missing dependency on every build; instead, remember it and re-read the page once
            # the file appears (``reread_when_data_appears``).
            _missing_data(directive.env).setdefault(directive.env.docname, set()).add(str(data))
        args.append(data)
    return func(*args, **kwargs)


MIN_TEXT_KEY = "trainopt_min_text_px"
"""PNG tEXt key under which a generated figure records its smallest text height, in pixels."""

FIGURE_DPI = 220
"""Figures are drawn at 110 dots per CSS inch and saved at twice that: crisp on high-density
screens. The page shows each at half its pixel width (``DISPLAY_SCALE``), so text keeps its
size."""
DISPLAY_SCALE = 2


def min_text_px(fig: Any, dpi: float = FIGURE_DPI) -> float:
    """Height in pixels of the smallest visible text of ``fig`` when saved at ``dpi``.

    Every visible, non-empty ``Text`` artist counts: titles, labels, tick labels, legends and
    annotations (font size in points × dpi / 72).
    """
    from matplotlib.text import Text

    fig.canvas.draw()  # tick labels exist only once drawn
    sizes = [
        t.get_fontsize() for t in fig.findobj(Text) if t.get_visible() and t.get_text().strip()
    ]
    if not sizes:
        return float("inf")
    return round(min(sizes) * dpi / 72, 2)


def save_figure(fig: Any, target: Path) -> bool:
    """Save ``fig`` as PNG at ``target`` with its smallest text height in the PNG's metadata.

    The file is replaced only if its bytes change, so a rebuild that draws the same figure leaves
    it (and its modification time) alone. Returns whether the file was written.
    """
    import io

    buffer = io.BytesIO()
    smallest = min_text_px(fig)
    fig.savefig(
        buffer,
        dpi=FIGURE_DPI,
        bbox_inches="tight",
        format="png",
        metadata={MIN_TEXT_KEY: f"{smallest:g}", "Software": None},
    )
    data = buffer.getvalue()
    if target.exists() and target.read_bytes() == data:
        return False
    # Write then rename: two builds at once (tests, livehtml) never see a half-written PNG.
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, target)
    return True


def png_size(path: Path) -> tuple[int, int]:
    """``(width, height)`` in pixels, from the PNG's header."""
    import struct

    with open(path, "rb") as png:
        header = png.read(24)
    return struct.unpack(">II", header[16:24])


def _missing_data(env: Any) -> dict[str, set[str]]:
    if not hasattr(env, "trainopt_missing_data"):
        env.trainopt_missing_data = {}
    return env.trainopt_missing_data


def reread_when_data_appears(
    app: Sphinx, env: Any, added: set[str], changed: set[str], removed: set[str]
) -> list[str]:
    """Pages that rendered a results file that was missing then and exists now."""
    return [
        doc
        for doc, paths in _missing_data(env).items()
        if doc not in removed and any(Path(p).exists() for p in paths)
    ]


def forget_missing_data(app: Sphinx, env: Any, docname: str) -> None:
    _missing_data(env).pop(docname, None)


def merge_missing_data(app: Sphinx, env: Any, docnames: set[str], other: Any) -> None:
    for doc, paths in _missing_data(other).items():
        if doc in docnames:
            _missing_data(env)[doc] = set(paths)


class TrainoptFigure(SphinxDirective):
    """Render a figure returned by a ``trainopt`` function at build time.

    ``:alt:`` and ``:caption:`` are required: the caption says in one sentence what to look at.
    The image links to its full-size PNG.
    """

    required_arguments = 1
    option_spec = {
        "alt": directives.unchanged_required,
        "kwargs": directives.unchanged,
        "data": directives.unchanged,
        "width": directives.unchanged,
        "caption": directives.unchanged_required,
    }
    has_content = False

    def run(self) -> list[nodes.Node]:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        where = self.env.doc2path(self.env.docname)
        for option in ("alt", "caption"):
            if not self.options.get(option, "").strip():
                raise self.error(
                    f"{where}: trainopt-figure {self.arguments[0]} needs a :{option}: text"
                )
        try:
            fig = _call(self)
        except Exception as exc:  # noqa: BLE001
            raise self.error(f"trainopt-figure {self.arguments[0]}: {exc!r}") from exc
        key = json.dumps([self.arguments[0], self.options.get("kwargs"), self.options.get("data")])
        digest = hashlib.sha1(key.encode()).hexdigest()[:10]
        name = f"{self.arguments[0].rsplit('.', 1)[-1]}-{digest}.png"
        out_dir = Path(self.env.srcdir) / "_generated"
        out_dir.mkdir(exist_ok=True)
        try:
            save_figure(fig, out_dir / name)
        finally:
            plt.close(fig)
        image = nodes.image(uri=f"/_generated/{name}", alt=self.options["alt"])
        if "width" in self.options:
            image["width"] = self.options["width"]
        else:
            image["width"] = f"{round(png_size(out_dir / name)[0] / DISPLAY_SCALE)}px"
        image["classes"].append("no-scaled-link")  # we link it ourselves, with or without :width:
        figure = nodes.figure("", image, classes=["trainopt-figure"])
        caption = self.options["caption"]
        textnodes, messages = self.state.inline_text(caption, self.lineno)
        figure += nodes.caption(caption, "", *textnodes)
        self.set_source_info(figure)
        return [figure, *messages]


def link_figures_to_full_size(app: Sphinx, doctree: nodes.document, docname: str) -> None:
    """Wrap each trainopt figure's image in a link to the PNG the builder copies to ``_images``."""
    if app.builder.format != "html":
        return
    from sphinx.util.osutil import relative_uri

    for figure in doctree.findall(nodes.figure):
        if "trainopt-figure" not in figure["classes"]:
            continue
        for image in list(figure.findall(nodes.image)):
            if isinstance(image.parent, nodes.reference):
                continue
            target = relative_uri(
                app.builder.get_target_uri(docname),
                f"{app.builder.imagedir}/{Path(image['uri']).name}",
            )
            reference = nodes.reference(
                "", "", refuri=target, internal=True, classes=["trainopt-figure-link"]
            )
            image.replace_self(reference)
            reference += image


class TrainoptRender(SphinxDirective):
    """Parse the MyST Markdown that a ``trainopt`` function returns (tables of results)."""

    required_arguments = 1
    option_spec = {"kwargs": directives.unchanged, "data": directives.unchanged}

    def run(self) -> list[nodes.Node]:
        try:
            text = _call(self)
        except Exception as exc:  # noqa: BLE001
            raise self.error(f"trainopt-render {self.arguments[0]}: {exc!r}") from exc
        container = nodes.container(classes=["trainopt-rendered"])
        self.state.nested_parse(
            StringList(text.splitlines(), source=self.get_source_info()[0]),
            self.content_offset,
            container,
        )
        return container.children


# --------------------------------------------------------------------------------------------
# Front matter: cards, badges, meta description
# --------------------------------------------------------------------------------------------


def read_front_matter(path: Path) -> tuple[dict[str, Any], str]:
    """Return ``(front_matter, title)`` of a MyST page."""
    text = path.read_text()
    meta: dict[str, Any] = {}
    if text.startswith("---\n"):
        end = text.index("\n---", 4)
        meta = yaml.safe_load(text[4:end]) or {}
        text = text[end + 4 :]
    title = next(
        (line[2:].strip() for line in text.splitlines() if line.startswith("# ")), path.stem
    )
    return meta, title


def difficulty_badge(difficulty: str) -> str:
    colour = DIFFICULTY_COLOURS.get(difficulty.lower())
    if colour is None:
        raise ValueError(
            f"difficulty must be one of {sorted(DIFFICULTY_COLOURS)}, got {difficulty!r}"
        )
    return f"{{bdg-{colour}}}`{difficulty.capitalize()}`"


class TrainoptCards(SphinxDirective):
    """A grid of cards, one per linked page, filled from each page's front matter."""

    has_content = True
    option_spec = {"columns": directives.unchanged}

    def run(self) -> list[nodes.Node]:
        columns = self.options.get("columns", "1 2 2 2")
        here = Path(self.env.doc2path(self.env.docname)).parent
        lines = [f"::::{{grid}} {columns}", ":gutter: 2", ""]
        for target in (line.strip() for line in self.content if line.strip()):
            path = (here / f"{target}.md").resolve()
            if not path.exists():
                raise self.error(f"trainopt-cards: no page {target!r} next to {self.env.docname}")
            self.env.note_dependency(str(path))
            meta, title = read_front_matter(path)
            summary = meta.get("summary") or meta.get("description")
            if not summary:
                raise self.error(f"trainopt-cards: {path.name} has no 'summary' or 'description'")
            icon = meta.get("icon", "book")
            lines += [
                f":::{{grid-item-card}} {{octicon}}`{icon};1.5em;sd-mr-1` {title}",
                f":link: {target}",
                ":link-type: doc",
                ":class-card: trainopt-card",
            ]
            if meta.get("difficulty"):
                lines.append(f":footer: {difficulty_badge(str(meta['difficulty']))}")
            lines += ["", str(summary), ":::", ""]
        lines.append("::::")
        container = nodes.container()
        self.state.nested_parse(
            StringList(lines, source=self.get_source_info()[0]), self.content_offset, container
        )
        return container.children


def add_difficulty_badge(app: Sphinx, doctree: nodes.document) -> None:
    """Put the page's difficulty (front matter) under its title as a badge."""
    meta = app.env.metadata.get(app.env.docname, {})
    difficulty = meta.get("difficulty")
    if not difficulty:
        return
    section = next(iter(doctree.findall(nodes.section)), None)
    if section is None:
        return
    colour = DIFFICULTY_COLOURS.get(str(difficulty).lower(), "secondary")
    badge = nodes.inline(
        "",
        str(difficulty).capitalize(),
        classes=["sd-sphinx-override", "sd-badge", f"sd-bg-{colour}", f"sd-bg-text-{colour}"],
    )
    para = nodes.paragraph("", "", classes=["trainopt-difficulty"])
    para += nodes.inline("", "Difficulty: ")
    para += badge
    section.insert(1, para)


def add_meta_description(
    app: Sphinx, pagename: str, templatename: str, context: dict, doctree: nodes.document | None
) -> None:
    meta = app.env.metadata.get(pagename, {})
    description = meta.get("description")
    if description:
        escaped = str(description).replace("&", "&amp;").replace('"', "&quot;").replace("<", "&lt;")
        context["metatags"] = context.get("metatags", "") + (
            f'\n    <meta name="description" content="{escaped}" />'
        )


def setup(app: Sphinx) -> dict[str, Any]:
    app.add_directive("trainopt-source", TrainoptSource)
    app.add_directive("trainopt-figure", TrainoptFigure)
    app.add_directive("trainopt-render", TrainoptRender)
    app.add_directive("trainopt-cards", TrainoptCards)
    app.connect("doctree-read", add_difficulty_badge)
    app.connect("doctree-resolved", link_figures_to_full_size)
    app.connect("env-get-outdated", reread_when_data_appears)
    app.connect("env-purge-doc", forget_missing_data)
    app.connect("env-merge-info", merge_missing_data)
    app.connect("html-page-context", add_meta_description)
    return {"version": "1.0", "parallel_read_safe": True, "parallel_write_safe": True}
