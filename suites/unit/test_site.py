"""The documentation site as a reader gets it. Built once (`mkdocs build --strict`), served on
127.0.0.1, and every page opened in headless Chromium with the network closed: no list may
have collapsed into a paragraph (Python-Markdown joins a list that directly follows a
paragraph line into it, which GitHub does not), no image may be broken, no internal link or
anchor may be dead, nothing may be loaded from the network, and no script may fail.

The site is built once for all of this (one test), to keep the suite's time small."""
from __future__ import annotations

import functools
import http.server
import importlib.util
import re
import subprocess
import sys
import threading
from pathlib import Path
from urllib.parse import unquote, urldefrag, urlparse

import pytest

from testbed import cli
from testbed.cli import exits
from testbed.errors import ExitStatus

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
#: a line that opens a list item, in Markdown source outside code
LIST_ITEM = re.compile(r"^ *(?:[-*+]|\d+[.)]) +\S")
FENCE = re.compile(r"^ *(```+|~~~+)")


def _hook(name: str):
    spec = importlib.util.spec_from_file_location(f"docs_hook_{name}", ROOT / "docs" / "hooks" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)                         # type: ignore[union-attr]
    return mod


def list_items(markdown: str) -> int:
    """How many list items the Markdown source has, outside fenced code."""
    n, fence = 0, None
    for line in markdown.splitlines():
        if (m := FENCE.match(line)) and (fence is None or m.group(1).startswith(fence)):
            fence = None if fence else m.group(1)
            continue
        if fence is None and LIST_ITEM.match(line):
            n += 1
    return n


def page_sources() -> dict[str, str]:
    """Each page's URL path (as the site serves it) -> the Markdown it is built from."""
    sources, reference = _hook("sources"), _hook("reference")
    config = {"repo_url": "https://example.org/repo", "site_url": ""}
    out = {"" if f.stem == "index" else f"{f.relative_to(ROOT / 'docs').with_suffix('').as_posix()}/":
           f.read_text() for f in (ROOT / "docs").rglob("*.md")}
    for src, page in sources.TOP_PAGES.items():
        if (ROOT / src).is_file():
            text = sources.license_page() if src == "LICENSE" else (ROOT / src).read_text()
            out["" if page == "index.md" else page.removesuffix(".md") + "/"] = text
    for folder in sources.examples():
        out[f"examples/{folder.name}/"] = sources.example_page(folder, config)
    out["reference/cli/"] = reference.cli_markdown()
    return out


def test_list_items_are_counted_as_markdown_sees_them():
    md = "text\n- one\n- two\n\n```yaml\n- not: an item\n```\n\n1. three\n  * four\nplain - text\n"
    assert list_items(md) == 4


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args) -> None:                # noqa: ANN002
        pass


#: what a page reports about itself, read in the browser
PAGE_FACTS = """(() => {
  const main = document.querySelector('[role="main"]') || document.body;
  return {
    items: main.querySelectorAll('li').length,
    collapsed: Array.from(main.querySelectorAll('p')).map(p => p.textContent)
                    .filter(t => /\\n\\s*([-*+]|\\d+[.)])\\s+\\S/.test(t)).map(t => t.slice(0, 160)),
    broken: Array.from(document.images).filter(i => !(i.complete && i.naturalWidth > 0)).map(i => i.src),
    links: Array.from(document.querySelectorAll('a[href]')).map(a => a.href),
    ids: Array.from(document.querySelectorAll('[id]')).map(e => e.id),
  };
})()"""


def test_the_site_builds_and_every_page_renders_in_a_browser(tmp_path, chromium_local):
    if importlib.util.find_spec("mkdocs") is None:
        pytest.skip("mkdocs is not installed (the `docs` extra)")
    site = tmp_path / "site"
    p = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(ROOT / "mkdocs.yml"),
                        "-d", str(site)], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert p.returncode == 0, p.stderr[-3000:]

    # the generated reference: every command, with its description and exit statuses, no escapes
    cli_page = (site / "reference" / "cli" / "index.html").read_text()
    for name in cli.parser()._subparsers._group_actions[0].choices:          # type: ignore[union-attr]
        assert f"testbed {name}</code>" in cli_page, name
    assert "%%" not in cli_page and cli_page.count("Exit statuses") >= 16
    assert "Nightly gate (sequential design" in cli_page          # option groups are shown
    # the one table of exit statuses, in Troubleshooting, from the code's constants
    trouble = (site / "troubleshooting" / "index.html").read_text()
    for s in ExitStatus:
        assert f"<td>{int(s)}</td>" in trouble, s

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(_Quiet, directory=str(site)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{server.server_address[1]}/"
    try:
        sources = page_sources()
        pages = sorted(f.parent.relative_to(site).as_posix().removeprefix(".") + "/"
                       for f in site.rglob("index.html"))
        pages = [x.removeprefix("/") for x in pages]
        assert set(sources) <= set(pages), set(sources) - set(pages)
        facts, problems = {}, []
        for path in pages:
            tab = chromium_local.open(base + path)
            f = facts[path] = tab.js(PAGE_FACTS)
            here = f"/{path}"
            problems += [f"{here}: list collapsed into a paragraph: {t!r}" for t in f["collapsed"]]
            problems += [f"{here}: broken image {u}" for u in f["broken"]]
            problems += [f"{here}: loaded from the network: {u}" for u in tab.requests
                         if not u.startswith((base, "data:", "blob:", "about:"))]
            problems += [f"{here}: script error: {e}" for e in tab.errors]
            if path in sources and (want := list_items(sources[path])) != f["items"]:
                problems.append(f"{here}: {want} list items in the Markdown, {f['items']} rendered")
            tab.close()
        for path, f in facts.items():
            for link in f["links"]:
                url, frag = urldefrag(link)
                if not url.startswith(base):
                    continue
                target = unquote(urlparse(url).path).lstrip("/")
                if target in facts:
                    if frag and unquote(frag) not in facts[target]["ids"]:
                        problems.append(f"/{path}: dead anchor {link}")
                elif not (site / target).is_file() and not (site / target / "index.html").is_file():
                    problems.append(f"/{path}: dead link {link}")
        assert not problems, "\n".join(problems)
    finally:
        server.shutdown()
        server.server_close()


def test_exit_table_is_made_from_the_code():
    table = exits.markdown_table()
    assert [int(r.split("|")[1]) for r in table.splitlines()[2:]] == [int(s) for s in ExitStatus]
    assert "`run`" in table.splitlines()[2 + list(ExitStatus).index(ExitStatus.UNDECIDED)]
