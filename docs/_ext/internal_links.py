"""Check the internal links and images of a built HTML site, without any network.

Usage: ``python docs/_ext/internal_links.py _build/html`` — prints each broken link with the page
it is on and exits 1 if there is any. External links (``http(s)://``, ``mailto:``) are not
followed.
"""

from __future__ import annotations

import sys
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urldefrag, urlparse


class _Collector(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.links: list[str] = []
        self.ids: set[str] = set()

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        attributes = dict(attrs)
        if attributes.get("id"):
            self.ids.add(attributes["id"])
        if tag == "a" and attributes.get("name"):
            self.ids.add(attributes["name"])
        for key in ("href", "src"):
            value = attributes.get(key)
            if value and not (
                tag == "link" and attributes.get("rel") in ("preconnect", "dns-prefetch")
            ):
                self.links.append(value)


def _parse(path: Path) -> _Collector:
    collector = _Collector()
    collector.feed(path.read_text(errors="replace"))
    return collector


def broken_links(html_dir: Path) -> list[str]:
    """Return ``"page: link (reason)"`` for every internal link or image that does not resolve."""
    html_dir = Path(html_dir)
    pages = {
        p: _parse(p)
        for p in html_dir.rglob("*.html")
        if "_static" not in p.relative_to(html_dir).parts
    }
    problems: list[str] = []
    for page, collector in pages.items():
        for link in collector.links:
            parsed = urlparse(link)
            if parsed.scheme or link.startswith("//") or link.startswith("javascript:"):
                continue
            target, fragment = parsed.path, urldefrag(link)[1]
            target_path = (page.parent / unquote(target)).resolve() if target else page
            if target_path.is_dir():
                target_path = target_path / "index.html"
            rel = page.relative_to(html_dir)
            if not target_path.exists():
                problems.append(f"{rel}: {link} (no such file)")
                continue
            if fragment and target_path.suffix == ".html":
                ids = pages[target_path].ids if target_path in pages else _parse(target_path).ids
                if unquote(fragment) not in ids:
                    problems.append(f"{rel}: {link} (no anchor #{fragment})")
    return sorted(problems)


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__)
        return 2
    problems = broken_links(Path(argv[1]))
    for problem in problems:
        print(problem)
    print(f"{len(problems)} broken internal link(s)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
