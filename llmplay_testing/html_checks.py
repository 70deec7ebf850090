"""Checks on rendered HTML pages (report and compare): their structure, and that they are self-contained."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import tempfile
from html import unescape
from html.parser import HTMLParser
from pathlib import Path
from typing import Any


class PageStructure(HTMLParser):
    """Tags, URL-valued attributes and ids of a page, to check structure without a browser."""

    def __init__(self) -> None:
        super().__init__()
        self.tags: list[str] = []
        self.urls: list[str] = []
        self.ids: set[str] = set()

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append(tag)
        for name, value in attrs:
            if name in ("src", "href", "xlink:href", "action", "poster", "data") and value:
                self.urls.append(value)
            if name == "id" and value:
                self.ids.add(value)


def parse_page(html: str) -> PageStructure:
    parser = PageStructure()
    parser.feed(html)
    return parser


def assert_self_contained(html: str) -> None:
    """No script, frame, stylesheet link or image; only in-page links; nothing left unrendered by the template."""
    parsed = parse_page(html)
    assert "script" not in parsed.tags and "<script" not in html.lower()
    assert "iframe" not in parsed.tags and "link" not in parsed.tags and "img" not in parsed.tags
    assert all(u.startswith("#") for u in parsed.urls), [u for u in parsed.urls if not u.startswith("#")]
    assert not re.search(r"url\(\s*['\"]?(https?:)?//", html) and "@import" not in html
    assert "{{" not in html and "{%" not in html and "Undefined" not in html


# Measures, in the browser, what a reader at that width sees: the page and each table of the class asked for.
_LAYOUT_PROBE = """<script>
(function () {
  var root = document.documentElement, tables = [];
  document.querySelectorAll(%(selector)s).forEach(function (t) {
    var box = t.getBoundingClientRect(), parent = t.parentElement.getBoundingClientRect();
    tables.push({right: box.right, parent_right: parent.right, scroll: t.scrollWidth, client: t.clientWidth});
  });
  var out = document.createElement("pre");
  out.id = "layout-probe";
  out.textContent = JSON.stringify({viewport: root.clientWidth, page: root.scrollWidth, tables: tables});
  document.body.appendChild(out);
})();
</script>"""


def chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


def _headless(browser: str, profile: Path, *flags: str) -> list[str]:
    """Headless Chromium on its own profile with the network unreachable: a page that needed it would show it."""
    return [
        browser,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--host-resolver-rules=MAP * ~NOTFOUND",
        f"--user-data-dir={profile}",
        *flags,
    ]


def dom_in_chromium(page: Path, width: int | None = None) -> str:
    """The DOM headless Chromium builds from `page` (in a window `width` pixels wide when given)."""
    browser = chromium()
    assert browser is not None, "chromium is not installed"
    size = [f"--window-size={width},900"] if width is not None else []
    with tempfile.TemporaryDirectory() as tmp:
        done = subprocess.run(
            _headless(browser, Path(tmp) / "profile", *size, "--dump-dom", page.as_uri()),
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def layout_in_chromium(page: Path, width: int, selector: str = "table") -> dict[str, Any]:
    """How `page` lays out in headless Chromium `width` pixels wide, the network unreachable: the viewport's and the
    page's width, and for each element matching `selector` its right edge, its container's, and whether its content
    is wider than its box. A copy of the page carries the measuring script (the report itself has none)."""
    with tempfile.TemporaryDirectory() as tmp:
        probe = Path(tmp) / page.name
        script = _LAYOUT_PROBE % {"selector": json.dumps(selector)}
        probe.write_text(page.read_text(encoding="utf-8").replace("</body>", script + "</body>"), encoding="utf-8")
        dom = dom_in_chromium(probe, width)
    found = re.search(r'<pre id="layout-probe">(.*?)</pre>', dom, re.S)
    assert found is not None, dom[-2000:]
    return json.loads(unescape(found.group(1)))


def screenshot_in_chromium(page: Path, out: Path, width: int, height: int) -> Path:
    """A PNG of `page` as a `width` x `height` window shows it, for a person to look at."""
    browser = chromium()
    assert browser is not None, "chromium is not installed"
    with tempfile.TemporaryDirectory() as tmp:
        flags = ("--hide-scrollbars", f"--window-size={width},{height}", f"--screenshot={out}", page.as_uri())
        subprocess.run(_headless(browser, Path(tmp) / "profile", *flags), capture_output=True, timeout=120, check=True)
    return out
