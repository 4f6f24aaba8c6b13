"""`web_page`: a web page scored against the row's checks by a cascade, cheap static checks first, a render after.

A reconstruction of WebGen-R1's cascaded reward for single HTML pages.
confidence: low — reconstructed from the abstract (and a secondary summary; the weights and thresholds are lmrl's).
The reply's HTML is its last ```html block (else the reply itself when it starts with `<!doctype` or `<html`;
`lmrl.rewards.web_page_checks`).

    stage 1 (the parent, nothing runs): s1 = checks passed on the static DOM / checks
    stage 2 (only when s1 >= render_threshold): the page rendered once in sandboxed Chromium with JavaScript on;
             s2 = (checks passed on the DOM after scripts + [screenshot grey-level std > min_pixel_std]) / (checks + 1),
             a `visible` check counting only elements laid out with a non-zero box, visibility visible, opacity > 0
    reward = static_weight * s1 + (1 - static_weight) * s2      (s2 = 0 when stage 2 is not reached)
    reward = s1                                                 (render: false)

No HTML, or a reply over `max_bytes` (measured before anything is extracted or parsed), scores 0. A render that
times out or crashes leaves s2 = 0. The verdict goes to `sample.info["web_page"]`: the stage reached, the checks
passed in each stage, the render's status and the screenshot's std. Everything the page produces (its DOM, its
console, its screenshot) is data the parent measures; the verdict is formed here. Threat model:
docs/rewards/web_page.md.
"""
from __future__ import annotations

from lmrl.rewards.functions import REWARD_FNS
from lmrl.rewards.web_page_checks import Check, check_passes, extract_html, parse, read_checks, within
from lmrl.rewards import web_page_render
from lmrl.types import Sample


def _window(value: object) -> tuple[int, int]:
    if not (isinstance(value, (list, tuple)) and len(value) == 2 and all(isinstance(v, int) and 64 <= v <= 4096
                                                                         for v in value)):
        raise ValueError(f"web_page: window_size is [width, height] in pixels (64..4096), not {value!r}")
    return int(value[0]), int(value[1])


def _rendered_passes(dom, check: Check, counts: list[int] | None, index: dict[int, int], i: int) -> bool:
    if not check_passes(dom, check):
        return False
    if not check.visible:
        return True
    return counts is not None and within(check, counts[index[i]])


def score_page(html: str, checks: list[Check], *, render_page: bool = True, render_threshold: float = 1.0,
               static_weight: float = 0.5, min_pixel_std: float = 2.0, window_size=(1280, 800),
               settle_ms: int = 1000, render_timeout_s: float = 20.0, memory_mb: int = 1024) -> tuple[float, dict]:
    """(reward, verdict) for one page's HTML under the cascade of the module docstring."""
    static = [check_passes(parse(html), c) for c in checks]
    s1 = sum(static) / len(checks)
    verdict: dict = {"stage": 1, "static_passed": sum(static), "static_total": len(checks), "static": static}
    if not render_page:
        return s1, verdict
    if s1 < render_threshold:
        return static_weight * s1, verdict
    visible = [c for c in checks if c.visible]
    index = {i: k for k, i in enumerate(i for i, c in enumerate(checks) if c.visible)}
    page = web_page_render.render(html, visible, _window(window_size), settle_ms, render_timeout_s, memory_mb)
    verdict.update(stage=2, render_status=page.status, render_reason=page.reason, pixel_std=page.pixel_std,
                   visible_counts=page.visible_counts, render_s=round(page.wall_s, 2))
    if page.status != "ok":
        verdict.update(rendered=[False] * len(checks), rendered_passed=0, not_blank=False)
        return static_weight * s1, verdict
    dom = parse(page.dom)
    rendered = [_rendered_passes(dom, c, page.visible_counts, index, i) for i, c in enumerate(checks)]
    not_blank = page.pixel_std is not None and page.pixel_std > min_pixel_std
    s2 = (sum(rendered) + not_blank) / (len(checks) + 1)
    verdict.update(rendered=rendered, rendered_passed=sum(rendered), not_blank=not_blank)
    return static_weight * s1 + (1 - static_weight) * s2, verdict


@REWARD_FNS.register("web_page", "a reply's HTML page against the row's CSS checks: static DOM first, then rendered "
                                 "in sandboxed Chromium (DOM after scripts, visible boxes, non-blank screenshot)")
def web_page_reward(sample: Sample, render: bool = True, render_threshold: float = 1.0, static_weight: float = 0.5,
                    min_pixel_std: float = 2.0, window_size=(1280, 800), settle_ms: int = 1000,
                    render_timeout_s: float = 20.0, memory_mb: int = 1024, max_bytes: int = 200_000, **_) -> float:
    """The cascade's reward (module docstring); the verdict in info["web_page"]. The row needs `checks`."""
    if not 0.0 <= static_weight <= 1.0 or not 0.0 <= render_threshold <= 1.0:
        raise ValueError("web_page: static_weight and render_threshold are in [0, 1]")
    if sample.row.get("checks") is None:
        raise ValueError('web_page needs rows with `checks`, e.g. [{"selector": "h1", "text": "Pricing"}] '
                         "(recipe web_page ships such rows)")
    checks = read_checks(sample.row["checks"])
    if render:
        web_page_render.require_chromium()
    size = len(sample.text.encode("utf-8", "surrogatepass"))
    if size > max_bytes:
        sample.info["web_page"] = {"stage": 0, "reason": f"reply of {size} bytes over max_bytes={max_bytes}"}
        return 0.0
    html = extract_html(sample.text)
    if html is None or not html.strip():
        sample.info["web_page"] = {"stage": 0, "reason": "no ```html block and the reply is not an HTML document"}
        return 0.0
    reward, verdict = score_page(html, checks, render_page=render, render_threshold=render_threshold,
                                 static_weight=static_weight, min_pixel_std=min_pixel_std, window_size=window_size,
                                 settle_ms=settle_ms, render_timeout_s=render_timeout_s, memory_mb=memory_mb)
    sample.info["web_page"] = verdict
    return reward
