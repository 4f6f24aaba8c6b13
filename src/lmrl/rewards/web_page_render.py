"""Render one untrusted web page in headless Chromium inside the sandbox: its DOM after scripts, a screenshot, and
the layout of the elements that `visible` checks name.

`render(html, visible_checks, ...) -> Rendering` runs Chromium once, in a fresh bubblewrap root of its own
(`lmrl.rewards.sandbox_program.run_program`): the shared libraries, Chromium's directory and the fonts,
read-only; private tmpfs for `/sandbox`, `/tmp` (the profile directory, new each render) and `/dev/shm`; no
network (a namespace with loopback only); the user `nobody`; rlimits on CPU, data segment, file size, open files
and threads; the page itself bound read-only. `--no-sandbox` turns off Chromium's own sandbox, which needs
privileges bubblewrap has already dropped: the bubblewrap root is the boundary.

Layout. When checks ask for visible elements, the page Chromium loads is a copy with one script put first (before
any of the page's): it keeps its own references to the DOM functions it calls (the page's scripts run later and
cannot replace them), removes itself from the document, and after the load event prints
`<nonce> <count>,<count>…` to the console, which Chromium writes to its stderr. The nonce is drawn per render and
exists only in that script's closure (file:// fetches are refused, so the page cannot read its own file), so the
page's own console lines cannot pass for it; anything else the page prints is ignored. The parent reads the
counts as integers, one per visible check, and only from exactly one such line.
"""
from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import stat
import tempfile
from dataclasses import dataclass

from PIL import Image, ImageStat

from lmrl.rewards.sandbox_program import OUTPUT_DIR, run_program
from lmrl.rewards.web_page_checks import Check

CHROMIUM = "/usr/lib/chromium/chromium"  # the binary (/usr/bin/chromium is a shell script: no shell in the root)
FONTS = ("/etc/fonts", "/usr/share/fonts")
PAGE = "page.html"
SHOT = "shot.png"
FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--no-zygote", "--no-first-run", "--disable-extensions",
         "--disable-background-networking", "--disable-sync", "--disable-component-update", "--mute-audio",
         "--disable-dev-shm-usage", "--password-store=basic", "--use-mock-keychain", "--hide-scrollbars",
         "--user-data-dir=/tmp/profile", "--enable-logging=stderr", "--v=0")
DOCTYPE = re.compile(r"\s*<!doctype[^>]*>", re.IGNORECASE)

# Every call goes through a reference taken before the page's scripts exist: Reflect.apply, the getters of
# NodeList.length, DOMRect width/height, innerText, and primitive string operations only (no regexes, no array
# writes: a page can put setters on Array.prototype or replace RegExp methods).
MEASURE_JS = r"""(function () {
"use strict";
const apply = Reflect.apply, getter = (proto, name) => Object.getOwnPropertyDescriptor(proto, name).get;
const me = document.currentScript, win = window, doc = document, con = console, log = console.log;
const isTop = win.top === win, onLoad = EventTarget.prototype.addEventListener, later = win.setTimeout;
const select = Document.prototype.querySelectorAll, length = getter(NodeList.prototype, "length");
const item = NodeList.prototype.item, box = Element.prototype.getBoundingClientRect;
const width = getter(DOMRectReadOnly.prototype, "width"), height = getter(DOMRectReadOnly.prototype, "height");
const style = win.getComputedStyle, property = CSSStyleDeclaration.prototype.getPropertyValue;
const innerText = getter(HTMLElement.prototype, "innerText"), lower = String.prototype.toLowerCase;
const contains = String.prototype.includes, NONCE = "__NONCE__", CHECKS = __CHECKS__;
apply(Element.prototype.remove, me, []);
function squash(text) {
  let out = "", gap = false;
  for (let i = 0; i < text.length; i++) {
    const c = text[i];
    if (c === " " || c === "\n" || c === "\t" || c === "\r" || c === "\f" || c === "\u00a0") { gap = out !== ""; }
    else { if (gap) { out = out + " "; } out = out + c; gap = false; }
  }
  return apply(lower, out, []);
}
function shown(el) {
  const r = apply(box, el, []), s = apply(style, win, [el]);
  return apply(width, r, []) > 0 && apply(height, r, []) > 0 && apply(property, s, ["visibility"]) === "visible"
    && apply(property, s, ["opacity"]) !== "0";
}
function measure() {
  let line = NONCE + " ";
  for (let c = 0; c < CHECKS.length; c++) {
    const found = apply(select, doc, [CHECKS[c].selector]);
    let n = 0;
    for (let i = 0; i < apply(length, found, []); i++) {
      const el = apply(item, found, [i]);
      if (shown(el) && (CHECKS[c].text === null || apply(contains, squash("" + apply(innerText, el, [])),
                                                          [CHECKS[c].text]))) { n = n + 1; }
    }
    line = line + (c ? "," : "") + n;
  }
  apply(log, con, [line]);
}
if (isTop) { apply(onLoad, win, ["load", function () { apply(later, win, [measure, 200]); }]); }
})();"""


@dataclass
class Rendering:
    """What one render gave: `status` ok | timeout | crashed (`reason`); `dom` the page's DOM after its
    scripts (Chromium's --dump-dom, untrusted text); `pixel_std` the screenshot's grey-level standard
    deviation (0-255; None without a screenshot); `visible_counts` one count per visible check (None
    when no valid measurement line came back)."""

    status: str
    reason: str
    dom: str
    pixel_std: float | None
    visible_counts: list[int] | None
    wall_s: float


def chromium_available() -> bool:
    return os.access(CHROMIUM, os.X_OK)


def require_chromium() -> None:
    if not chromium_available():
        raise RuntimeError(f"web_page: rendering needs Chromium ({CHROMIUM}): apt-get install chromium "
                           "(scripts/setup.sh does as root), or set the reward's `render: false` for the static "
                           "checks alone")


def measuring_copy(html: str, visible_checks: list[Check], nonce: str) -> str:
    """`html` with the measuring script first (after a leading doctype, so the page keeps its mode)."""
    checks = [{"selector": c.selector, "text": c.text} for c in visible_checks]
    script = MEASURE_JS.replace("__NONCE__", nonce).replace("__CHECKS__", json.dumps(checks).replace("<", "\\u003c"))
    doctype = DOCTYPE.match(html)
    at = doctype.end() if doctype else 0
    return f"{html[:at]}<script>{script}</script>{html[at:]}"


def read_counts(stderr: str, nonce: str, expected: int) -> list[int] | None:
    """The counts of the one console line carrying `nonce`, else None (none, several, or not `expected` integers)."""
    lines = set(re.findall(rf'INFO:CONSOLE[^\]]*\] "{nonce} ([0-9,]*)"', stderr))
    if len(lines) != 1:
        return None
    fields = next(iter(lines)).split(",") if expected else []
    if len(fields) != expected or not all(f.isdigit() and len(f) < 9 for f in fields):
        return None
    return [int(f) for f in fields]


def screenshot_std(path: str, window: tuple[int, int], max_bytes: int = 16 << 20) -> float | None:
    """The grey-level standard deviation of the PNG Chromium wrote, or None when it is missing, not a regular
    file, too large or not a PNG of the window's size."""
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return None
    if not stat.S_ISREG(info.st_mode) or info.st_size > max_bytes:
        return None
    try:
        with Image.open(path) as image:
            if image.format != "PNG" or image.size != window:
                return None
            return float(ImageStat.Stat(image.convert("L")).stddev[0])
    except (OSError, ValueError, Image.DecompressionBombError):
        return None


def render(html: str, visible_checks: list[Check], window: tuple[int, int] = (1280, 800), settle_ms: int = 1000,
           timeout_s: float = 20.0, memory_mb: int = 1024, max_output_bytes: int = 2_000_000) -> Rendering:
    """Load `html` once in a fresh sandboxed Chromium with JavaScript on: DOM, screenshot, visible counts."""
    require_chromium()
    nonce = secrets.token_hex(16)
    page = measuring_copy(html, visible_checks, nonce) if visible_checks else html
    work = tempfile.mkdtemp(prefix="lmrl-web-")
    try:
        source = os.path.join(work, PAGE)
        with open(source, "w", encoding="utf-8", errors="surrogatepass") as f:
            f.write(page)
        os.chmod(source, 0o644)
        out_dir = os.path.join(work, os.path.basename(OUTPUT_DIR))
        os.mkdir(out_dir)
        argv = [CHROMIUM, *FLAGS, f"--window-size={window[0]},{window[1]}", f"--virtual-time-budget={settle_ms}",
                f"--js-flags=--max-old-space-size={memory_mb // 2}", "--dump-dom",
                f"--screenshot={OUTPUT_DIR}/{SHOT}", f"file:///sandbox/{PAGE}"]
        result = run_program(argv, (CHROMIUM, *FONTS), files={source: PAGE}, output_dir=out_dir,
                             timeout_s=timeout_s, memory_mb=memory_mb, memory_limit="data", file_size_mb=64,
                             max_processes=256, max_open_files=1024, max_output_bytes=max_output_bytes)
        if result.status == "timeout" or (result.status == "killed" and result.reason == "output limit"):
            return Rendering("timeout" if result.status == "timeout" else "crashed", result.reason, "", None, None,
                             result.wall_s)
        status = "ok" if result.status == "ok" and result.stdout.strip() else "crashed"
        counts = read_counts(result.stderr, nonce, len(visible_checks)) if visible_checks else []
        return Rendering(status, result.reason or ("" if status == "ok" else "no DOM"), result.stdout,
                         screenshot_std(os.path.join(out_dir, SHOT), window), counts, result.wall_s)
    finally:
        shutil.rmtree(work, ignore_errors=True)
