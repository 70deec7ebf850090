"""Checks on rendered HTML pages (report and compare): their structure, and that they are self-contained."""

from __future__ import annotations

import re
from html.parser import HTMLParser


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
