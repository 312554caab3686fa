"""MkDocs hooks of the documentation site (mkdocs.yml: ``hooks``).

* **Links to repository files.** A page may link a file of the repository outside ``docs/``
  (``../examples/quickstart.py``, a benchmark's JSON results). MkDocs only knows the files under
  ``docs/`` and, with ``--strict``, fails on such a link. When the target exists in the checkout
  and is not a Markdown page, the file is published with the site under ``_repo/`` and the link is
  pointed there; a target that does not exist is left alone, so MkDocs still reports it. A link to
  a Markdown file outside ``docs/`` (the README) is left alone too: link the site's page instead.
* **Sphinx roles in docstrings.** The library's docstrings use Sphinx roles
  (``:class:`~sqla_outbox.Relay```), which mkdocstrings renders as the role's name followed by
  code. Each becomes the code alone, linked to the API reference when the name is documented
  there (an optional cross-reference: no warning when it is not).
"""

from __future__ import annotations

import html
import posixpath
import re
from pathlib import Path
from typing import Any

from mkdocs.structure.files import File, Files

PUBLISHED_UNDER = "_repo"

# An inline link's target: ``](target)`` or ``](target#anchor)``, no spaces, not a URL.
_LINK = re.compile(r"(\]\()(?P<target>[^)\s#:]+)(?P<anchor>#[^)\s]*)?(\))")
_ROLE = re.compile(r":(?:class|func|meth|mod|attr|data|exc|obj|const):<code>(?P<text>[^<]*)</code>")

_links: dict[str, dict[str, str]] = {}  # page src_uri -> {link target -> site path}


def _repo_target(docs_dir: Path, repo: Path, page_uri: str, target: str) -> str | None:
    """The repository path of ``target`` linked from ``page_uri`` when it leaves ``docs/`` and
    names an existing non-Markdown file of the repository, else ``None``."""
    resolved = (docs_dir / posixpath.dirname(page_uri) / target).resolve()
    if resolved.is_relative_to(docs_dir) or not resolved.is_relative_to(repo):
        return None
    if not resolved.is_file() or resolved.suffix == ".md":
        return None
    return resolved.relative_to(repo).as_posix()


def on_files(files: Files, config: Any) -> Files:
    docs_dir = Path(config["docs_dir"]).resolve()
    repo = Path(config["config_file_path"]).resolve().parent
    published: set[str] = set()
    _links.clear()
    for page in [file for file in files if file.src_uri.endswith(".md")]:
        text = Path(page.abs_src_path).read_text(encoding="utf-8")
        for match in _LINK.finditer(text):
            target = match.group("target")
            path = _repo_target(docs_dir, repo, page.src_uri, target)
            if path is None:
                continue
            uri = f"{PUBLISHED_UNDER}/{path}"
            link = posixpath.relpath(uri, posixpath.dirname(page.src_uri) or ".")
            _links.setdefault(page.src_uri, {})[target] = link
            if uri not in published:
                published.add(uri)
                files.append(File.generated(config, uri, abs_src_path=str(repo / path)))
    return files


def on_page_markdown(markdown: str, page: Any, config: Any, files: Files) -> str:
    links = _links.get(page.file.src_uri)
    if not links:
        return markdown

    def point(match: re.Match[str]) -> str:
        target = links.get(match.group("target"))
        if target is None:
            return match.group(0)
        return f"{match.group(1)}{target}{match.group('anchor') or ''}{match.group(4)}"

    return _LINK.sub(point, markdown)


def on_page_content(content: str, page: Any, config: Any, files: Files) -> str:
    def code(match: re.Match[str]) -> str:
        text = html.unescape(match.group("text"))
        titled = re.fullmatch(r"(?P<title>.+?)\s*<(?P<target>[^>]+)>", text)
        if titled:
            title, target = titled.group("title"), titled.group("target")
        else:
            target = text.lstrip("~")
            title = target.rsplit(".", 1)[-1] if text.startswith("~") else target
        target = target.rstrip("()")
        shown = f"<code>{html.escape(title)}</code>"
        if not target.startswith(("sqla_outbox", "alembic_ext")):
            return shown
        return f'<autoref identifier="{html.escape(target)}" optional>{shown}</autoref>'

    return _ROLE.sub(code, content)
