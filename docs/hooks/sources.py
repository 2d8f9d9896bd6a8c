"""MkDocs hook: pages made from the repository's own files at build time, so the site never
holds a copy that drifts from them.

- the home page is README.md, the changelog page CHANGELOG.md, and CONTRIBUTING.md and
  LICENSE have a page each;
- each folder under examples/ is a page: its README and every file in it, so a reader of the
  site (offline too) sees the whole example;
- links are rewritten for where a page lands: `docs/X.md` in the README becomes `X.md`, a
  link to examples/NAME/FILE goes to that file on the example's page, a link to the site
  (site_url) stays inside the site, and a link to any other file of the repository goes to
  it on repo_url (without one, the file is named, not linked);
- code is highlighted by Pygments at build time (codehilite) with its stylesheet generated
  here: nothing is loaded from the network.
"""
from __future__ import annotations

import posixpath
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
#: top-level files shown as pages: source -> page
TOP_PAGES = {"README.md": "index.md", "CHANGELOG.md": "changelog.md",
             "CONTRIBUTING.md": "contributing.md", "LICENSE": "license.md"}
CSS = "css/highlight.css"
LANG = {".sh": "bash", ".py": "python", ".yaml": "yaml", ".yml": "yaml", ".toml": "toml",
        ".j2": "jinja", ".ini": "ini", ".md": "markdown"}
LINK = re.compile(r"(!?\[[^\]]*\]\()([^)\s]+)(\))")


def examples() -> list[Path]:
    return sorted(p for p in (ROOT / "examples").iterdir() if p.is_dir())


def example_files(folder: Path) -> list[Path]:
    return sorted(f for f in folder.rglob("*") if f.is_file() and f.name != "README.md"
                  and "__pycache__" not in f.parts and f.suffix != ".pyc")


def anchor(text: str) -> str:
    from markdown.extensions.toc import slugify
    return slugify(text, "-")


def _target(path: str, fragment: str, config) -> str | None:
    """Where a link to repository path ``path`` (relative to the top) goes on the site: a docs
    path (relative to docs/), or an absolute URL; None to leave the link alone."""
    if path.startswith("docs/"):
        return path.removeprefix("docs/") + fragment
    if path in TOP_PAGES:
        return TOP_PAGES[path] + fragment
    parts = path.rstrip("/").split("/")
    if parts[0] == "examples":
        if len(parts) == 1 or parts[1] == "README.md":
            return "examples.md" + fragment
        page = f"examples/{parts[1]}.md"
        rest = "/".join(parts[2:])
        if rest and rest != "README.md":
            return f"{page}#{anchor(rest)}"
        return page + fragment
    repo = (config.get("repo_url") or "").rstrip("/")
    if not repo or not (ROOT / path).exists():
        return None
    kind = "tree" if (ROOT / path).is_dir() else "blob"
    return f"{repo}/{kind}/main/{path}{fragment}"


def rewrite(markdown: str, source: str, page: str, config) -> str:
    """Links of ``markdown``, written from repository file ``source``, made right for docs
    page ``page``."""
    site = (config.get("site_url") or "").rstrip("/") + "/"
    here = posixpath.dirname(source)

    def one(m: re.Match) -> str:
        url = m.group(2)
        if site != "/" and url.startswith(site):
            # a link to the published site, written so on GitHub: stay inside the site
            rel = url[len(site):].split("#", 1)
            path = rel[0].rstrip("/")
            url = "docs/" + (path + ".md" if path else "index.md") + (f"#{rel[1]}" if len(rel) > 1 else "")
            here_ = ""
        elif re.match(r"[a-z]+:|#|/", url):
            return m.group(0)
        else:
            here_ = here
        path, _, frag = url.partition("#")
        full = posixpath.normpath(posixpath.join(here_, path))
        if full.startswith("../"):
            return m.group(0)
        to = _target(full, f"#{frag}" if frag else "", config)
        if to is None and not config.get("repo_url") and (ROOT / full).exists() \
                and not m.group(1).startswith("!"):
            # a repository file that is no page, and no published repository to link to:
            # named, not linked (the built site points at nothing outside itself)
            return f"{m.group(1)[1:-2]} (`{full}` in the repository)"
        if to is None:
            return m.group(0)
        if not re.match(r"[a-z]+:", to):
            to = posixpath.relpath(to.split("#")[0], posixpath.dirname(page) or ".") + (
                "#" + to.split("#", 1)[1] if "#" in to else "")
        return f"{m.group(1)}{to}{m.group(3)}"
    # not inside code: a link that starts in a fenced block or an inline code span keeps its
    # text (code inside a link's own text is fine)
    code = [m.span() for m in re.finditer(r"```.*?```|`[^`\n]*`", markdown, flags=re.S)]
    return LINK.sub(lambda m: m.group(0) if any(a <= m.start() < b for a, b in code) else one(m), markdown)


def _fence(text: str) -> str:
    longest = max((len(m) for m in re.findall(r"`{3,}", text)), default=2)
    return "`" * max(3, longest + 1)


def example_page(folder: Path, config) -> str:
    name = folder.name
    readme = folder / "README.md"
    text = readme.read_text() if readme.is_file() else f"# examples/{name}\n"
    repo = (config.get("repo_url") or "").rstrip("/")
    out = [rewrite(text, f"examples/{name}/README.md", f"examples/{name}.md", config).rstrip(), "",
           "## The files", "",
           f"Everything in `examples/{name}/`, as it is in this version"
           + (f" ([the folder in the repository]({repo}/tree/main/examples/{name}))." if repo else "."), ""]
    for f in example_files(folder):
        rel = f.relative_to(folder).as_posix()
        body = f.read_text(errors="replace")
        fence = _fence(body)
        out += [f"### {rel}", "", f"{fence}{LANG.get(f.suffix, 'text')}", body.rstrip("\n"), fence, ""]
    return "\n".join(out)


def license_page() -> str:
    text = (ROOT / "LICENSE").read_text()
    return f"# License\n\nThe testbed is licensed under the Apache License, Version 2.0:\n\n```text\n{text.rstrip()}\n```\n"


def on_files(files, config):                               # noqa: ANN001 (MkDocs' hook signature)
    from mkdocs.structure.files import File
    from pygments.formatters import HtmlFormatter
    for src, page in TOP_PAGES.items():
        if not (ROOT / src).is_file():
            continue
        if files.get_file_from_path(page) is not None:
            raise ValueError(f"docs/{page} exists: that page is made from {src}; remove the copy")
        content = license_page() if src == "LICENSE" else (ROOT / src).read_text()
        files.append(File.generated(config, page, content=content))
    for folder in examples():
        files.append(File.generated(config, f"examples/{folder.name}.md",
                                    content=example_page(folder, config)))
    files.append(File.generated(config, CSS, content=HtmlFormatter(style="friendly").get_style_defs(".codehilite")))
    return files


def on_page_markdown(markdown, page, config, files):       # noqa: ANN001
    src = page.file.src_uri
    source = next((s for s, p in TOP_PAGES.items() if p == src), None)
    if source is not None:
        return rewrite(markdown, source, src, config)
    if src.startswith("examples/"):
        return markdown                                    # made with its links already right
    return rewrite(markdown, f"docs/{src}", src, config)
