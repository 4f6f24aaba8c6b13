"""The `web_page` reward's cheap half: find the reply's HTML, read the row's checks, count what a DOM satisfies.

Nothing here runs the page. `extract_html` takes the last ```html fenced block (else the whole reply when it
starts with `<!doctype` or `<html`); `read_checks` validates the row's `checks`, each
`{"selector": CSS, "min": n, "max": n, "text": substring, "visible": bool}`; `check_passes` evaluates one
check on a parsed DOM (BeautifulSoup with Python's html.parser, CSS selectors by soupsieve). The same checks
run on the static DOM (stage 1) and on the DOM Chromium dumps after the page's scripts ran (stage 2,
`lmrl.rewards.web_page`). Rules and threat model: docs/rewards/web_page.md.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

import soupsieve
from bs4 import BeautifulSoup

from lmrl.rewards.code import FENCE
from lmrl.rewards.functions import row_list

HTML_START = re.compile(r"\s*<(?:!doctype\s+html|html)[\s>]", re.IGNORECASE)
CHECK_KEYS = {"selector", "min", "max", "text", "visible"}


@dataclass(frozen=True)
class Check:
    """At least `min` (and at most `max`) elements match `selector`, counting only those whose text contains
    `text` (case-insensitive, whitespace collapsed) when given; `visible`: stage 2 counts only elements the
    browser lays out with a non-zero box."""

    selector: str
    min: int = 1
    max: int | None = None
    text: str | None = None
    visible: bool = False

    def as_json(self) -> dict:
        return {"selector": self.selector, "min": self.min, "max": self.max, "text": self.text,
                "visible": self.visible}


def extract_html(text: str) -> str | None:
    """The reply's last ```html block (an unclosed one runs to the end), else the reply itself when it starts
    as an HTML document, else None."""
    blocks = [body for lang, body in FENCE.findall(text) if lang.lower() == "html"]
    if blocks:
        return blocks[-1]
    return text if HTML_START.match(text) else None


def normalise(text: str) -> str:
    return " ".join(text.split()).casefold()


def _read_check(i: int, raw: object) -> Check:
    if not isinstance(raw, dict) or not isinstance(raw.get("selector"), str) or not raw["selector"].strip():
        raise ValueError(f'web_page: check {i} must be an object with a CSS "selector", not {raw!r:.80}')
    unknown = set(raw) - CHECK_KEYS
    if unknown:
        raise ValueError(f"web_page: check {i} has unknown keys {sorted(unknown)}; allowed: {sorted(CHECK_KEYS)}")
    low, high = raw.get("min", 1), raw.get("max")
    if not isinstance(low, int) or low < 0 or (high is not None and (not isinstance(high, int) or high < low)):
        raise ValueError(f'web_page: check {i} needs integers 0 <= "min" <= "max", got min={low!r} max={high!r}')
    text = raw.get("text")
    if text is not None and (not isinstance(text, str) or not text.strip()):
        raise ValueError(f'web_page: check {i}\'s "text" must be a non-empty string')
    try:
        soupsieve.compile(raw["selector"])
    except soupsieve.SelectorSyntaxError as err:
        raise ValueError(f"web_page: check {i}'s selector {raw['selector']!r} is not valid CSS ({err})") from None
    return Check(raw["selector"], low, high, normalise(text) if text else None, bool(raw.get("visible", False)))


def read_checks(value: object) -> list[Check]:
    """The row's `checks` (a list, or its JSON text) as `Check`s; a malformed one raises with the fix."""
    value = row_list(value, "web_page", "checks",
                     '[{"selector": "h1", "text": "Pricing"}, {"selector": "nav a", "min": 3}]')
    return [_read_check(i, raw) for i, raw in enumerate(value)]


def parse(html: str) -> BeautifulSoup:
    """The DOM of `html` (html.parser never refuses a document: malformed markup is repaired, as a browser does)."""
    return BeautifulSoup(html, "html.parser")


def matching_count(dom: BeautifulSoup, check: Check) -> int:
    found = dom.select(check.selector)
    if check.text is not None:
        found = [el for el in found if check.text in normalise(el.get_text(" "))]
    return len(found)


def within(check: Check, count: int) -> bool:
    return count >= check.min and (check.max is None or count <= check.max)


def check_passes(dom: BeautifulSoup, check: Check) -> bool:
    """The check on this DOM's source order and text (no layout: `visible` is the renderer's part)."""
    return within(check, matching_count(dom, check))
