"""Reading aids on the pages: what each code block needs, what it prints, and the page as a
notebook.

Read from the page's own MyST source, next to the ```` ```python ```` block they describe:

``% skip: next if(<condition>, reason="...")``
    Sybil's skip (a MyST comment, so invisible). The block gets a visible badge with the reason,
    "needs CUDA" for a GPU-only block; Sybil still reads the comment.
``% needs: <what to run first>``
    A block that does not run when copied alone says which earlier block to run first. The
    comment becomes a visible line above the block: "Run first: <what>". A MyST link in it,
    ``[the set-up block](#lr-setup)``, becomes a link to the label ``(lr-setup)=`` written above
    the block it names (a missing label fails the ``-W`` build). The checker in :mod:`audit`
    (``python docs/_ext/audit.py --alone``) finds the blocks that need one.

What a block prints is shown beneath it, as "Output": ``docs/_data/outputs/<page>.json`` (committed)
holds the standard output of each code block that prints, by a hash of the block's code, as
recorded on CPU by ``TRAINOPT_RECORD_OUTPUTS=1 pytest tests/docs/test_notebooks.py``. That test
runs each page as a notebook and fails when a printing block has no recorded output for its
current code, or prints something else (numbers aside); so every build shows it, ``make html``
from a clean clone included.

Each guide, performance, concepts and troubleshooting page gets a "Download as a notebook"
button under its title; the notebook (:mod:`notebooks`) is written next to the page's HTML. Under
it, the install command its examples need: the front matter's ``extras`` (checked against the
page's imports by ``tests/docs/test_install_notes.py``).
"""

from __future__ import annotations

import html
import json
import re
from pathlib import Path
from typing import Any

from audit import blocks, needs_of
from docutils import nodes
from notebooks import NOTEBOOK_PAGES, notebook_for
from sphinx import addnodes
from sphinx.application import Sphinx

OUTPUTS = "_data/outputs"


def code_sha1(code: str) -> str:
    """Identifies a block's code: a recorded output is shown only under the code that printed it."""
    import hashlib

    return hashlib.sha1(code.strip().encode()).hexdigest()


def skip_reason(skip: str | None) -> str | None:
    if not skip:
        return None
    match = re.search(r"reason\s*=\s*(['\"])(?P<reason>.+)\1", skip)
    return match.group("reason") if match else None


def _python_literals(doctree: nodes.document) -> list[nodes.literal_block]:
    return [
        n
        for n in doctree.findall(nodes.literal_block)
        if n.get("language") == "python" and "trainopt-source" not in n["classes"]
    ]


LINK = re.compile(r"\[(?P<text>[^\]]+)\]\(#(?P<label>[\w-]+)\)")


def _note(text: str, classes: list[str], label: str) -> nodes.paragraph:
    para = nodes.paragraph("", "", classes=["trainopt-block-note", *classes])
    para += nodes.inline(
        "", label, classes=["sd-sphinx-override", "sd-badge", "trainopt-block-badge"]
    )
    if text:
        para += nodes.Text(" ")
    position = 0
    for link in LINK.finditer(text):  # [the set-up block](#label): a link to the labelled block
        para += nodes.Text(text[position : link.start()])
        xref = addnodes.pending_xref(
            "", refdomain="std", reftype="ref", reftarget=link["label"], refexplicit=True
        )
        xref["refwarn"] = True
        xref += nodes.inline("", link["text"], classes=["std", "std-ref"])
        para += xref
        position = link.end()
    para += nodes.Text(text[position:])
    return para


def annotate_blocks(app: Sphinx, doctree: nodes.document) -> None:
    """Badges for skipped blocks, "Run first" lines, and recorded outputs, next to each block."""
    docname = app.env.docname
    path = Path(app.env.doc2path(docname))
    if not path.exists():
        return
    fenced = [b for b in blocks(path) if b.info.split()[:1] == ["python"]]
    literals = _python_literals(doctree)
    if len(fenced) != len(literals):
        return  # not a page whose blocks are ours to annotate (generated reference pages)
    needs = needs_of(path)
    outputs_file = Path(app.srcdir) / OUTPUTS / f"{docname}.json"
    outputs = {}
    if outputs_file.exists():
        app.env.note_dependency(str(outputs_file))
        outputs = json.loads(outputs_file.read_text())
    for block, literal in zip(fenced, literals):
        before: list[nodes.Node] = []
        after: list[nodes.Node] = []
        if block.line in needs:
            literal["classes"].append("trainopt-needs-first")
            note = _note(needs[block.line], ["trainopt-needs"], "Run first")
            for xref in note.findall(addnodes.pending_xref):
                xref["refdoc"] = docname
            before.append(note)
        reason = skip_reason(block.skipped_by)
        if reason:
            literal["classes"].append("trainopt-skipped-block")
            label = "needs CUDA" if re.search(r"\bcuda\b", reason, re.I) else reason
            text = (
                "skipped where there is no CUDA device"
                if label == "needs CUDA"
                else "skipped elsewhere"
            )
            before.append(
                _note(
                    text,
                    ["trainopt-needs-cuda" if label == "needs CUDA" else "trainopt-skips"],
                    label,
                )
            )
        printed = outputs.get(code_sha1(block.body), {}).get("stdout")
        if printed and "print(" in block.body:
            after += _output_nodes(printed)
        parent = literal.parent
        anchor = literal
        # a literal block may sit inside a container (caption); annotate around the outermost one
        while (
            parent is not None
            and isinstance(parent, nodes.container)
            and "literal-block-wrapper" in parent["classes"]
        ):
            anchor, parent = parent, parent.parent
        index = parent.index(anchor)
        for node in reversed(before):
            parent.insert(index, node)
        index = parent.index(anchor)
        for offset, node in enumerate(after, start=1):
            parent.insert(index + offset, node)


WIDE = 88  # characters of code that fit the content column at 1280 px


def _output_nodes(printed: str) -> list[nodes.Node]:
    """What a block printed, under an "Output" title. Long lines of prose wrap; a table wider than
    the column (a profiler's) keeps its columns in a folded box that scrolls sideways."""
    lines = printed.splitlines()
    table = any(re.fullmatch(r"[-=]{3,}[-= ]*", line.strip()) for line in lines)
    if table and max(map(len, lines)) > WIDE:
        return [
            nodes.raw(
                "",
                '<details class="trainopt-output-wide"><summary>Output: a table '
                f"{max(map(len, lines))} characters wide</summary>"
                '<div class="highlight-text notranslate trainopt-output">'
                '<div class="highlight"><pre>'
                f"{html.escape(printed)}</pre></div></div></details>",
                format="html",
            )
        ]
    title = nodes.rubric("", "Output", classes=["trainopt-output-title"])
    return [
        title,
        nodes.literal_block(printed, printed, language="text", classes=["trainopt-output"]),
    ]


def add_notebook_button(app: Sphinx, doctree: nodes.document) -> None:
    docname = app.env.docname
    if docname not in NOTEBOOK_PAGES(app.srcdir):
        return
    section = next(iter(doctree.findall(nodes.section)), None)
    if section is None:
        return
    name = Path(docname).name + ".ipynb"
    html = (
        '<p class="trainopt-notebook">'
        f'<a class="sd-btn sd-btn-outline-primary sd-btn-sm" href="{name}" '
        f'download="{name}">Download as a notebook</a> <span class="trainopt-notebook-note">'
        "every code block of this page, in order; it runs top to bottom in a fresh kernel"
        "</span></p>"
    )
    section.insert(1, nodes.raw("", html, format="html"))
    section.insert(
        2,
        nodes.raw("", install_note(app.env.metadata.get(docname, {}).get("extras")), format="html"),
    )


def install_note(extras: object) -> str:
    """What the page's examples need installed: the library, with the extras its front matter names.

    >>> install_note(["hpo"])  # doctest: +ELLIPSIS
    '<p class="trainopt-install">Runs with: <code>python -m pip install ".[hpo]"</code> ...'
    """
    if isinstance(extras, str):  # MyST hands list fields over as written
        extras = [e.strip().strip("'\"") for e in extras.strip("[]").split(",") if e.strip()]
    target = f'".[{",".join(extras)}]"' if extras else "."
    what = "the library with these extras" if extras else "the library alone, no extra"
    return (
        '<p class="trainopt-install">Runs with: '
        f"<code>python -m pip install {html.escape(target)}</code> "
        f"in the folder of your clone ({what}; see <em>Use trainopt in your project</em> on the "
        "landing page).</p>"
    )


def write_notebooks(app: Sphinx, exception: Exception | None) -> None:
    if exception is not None or app.builder.format != "html":
        return
    for docname in NOTEBOOK_PAGES(app.srcdir):
        target = Path(app.outdir) / f"{docname}.ipynb"
        target.parent.mkdir(parents=True, exist_ok=True)
        text = json.dumps(notebook_for(Path(app.srcdir) / f"{docname}.md"), indent=1) + "\n"
        if not target.exists() or target.read_text() != text:
            target.write_text(text)


def setup(app: Sphinx) -> dict[str, Any]:
    app.connect("doctree-read", annotate_blocks)
    app.connect("doctree-read", add_notebook_button)
    app.connect("build-finished", write_notebooks)
    return {"version": "1.0", "parallel_read_safe": True, "parallel_write_safe": True}
