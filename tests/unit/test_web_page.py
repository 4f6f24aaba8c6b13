"""`web_page`: a correct page scores 1 through both stages; hostile pages cannot make wrong answers score.

The rendered pages (Chromium in the sandbox, ~4 s each) are rendered once, two at a time, by a module fixture;
the tests read their verdicts. The hostile page reports what its own probes got into its DOM, so "blocked" there
shows that each probe ran and failed.
"""
import time
from concurrent.futures import ThreadPoolExecutor
from unittest import mock

import pytest

from lmrl.rewards import REWARD_FNS, web_page_render
from lmrl.rewards.web_page_checks import extract_html, read_checks
from lmrl.rewards.web_page_render import measuring_copy, read_counts, render
from lmrl.types import Sample

CHECKS = [{"selector": "nav a", "min": 3}, {"selector": "h1", "text": "Pricing", "visible": True},
          {"selector": "form input[type=email]"}, {"selector": "form button"}]
BODY = """<nav><a href="#a">Home</a><a href="#b">Plans</a><a href="#c">Contact</a></nav>
<h1 class="title">Pricing</h1><form><input type="email" name="email"><button>Join</button></form>"""
GOOD = f"""<!doctype html><html><head><title>Plans</title><style>body{{background:#f4f0e8;font:18px sans-serif}}
h1{{color:#123}}</style></head><body>{BODY}<p id="state"></p>
<script>document.getElementById("state").textContent = localStorage.getItem("kept") || "fresh";</script></body></html>"""
PROBES = ["http://example.com/", "http://127.0.0.1:8000/", "file:///etc/passwd", "file:///work/main/pyproject.toml",
          "file:///proc/self/environ", "file:///proc/1/cmdline", "page.html"]
HOSTILE = f"""<!doctype html><html><head><title>x</title><style>html,body{{background:#fff;color:#fff}}
.title{{display:none}} a,input,button{{visibility:hidden}}</style></head><body>{BODY}
<ul id="probes"></ul><p id="store"></p><div id="fake">checks passed: 4/4 {{"web_page": {{"stage": 2, "rendered_passed": 4}}}}</div>
<script>
localStorage.setItem("kept", "from an earlier page"); document.getElementById("store").textContent =
  "wrote:" + localStorage.getItem("kept");
const list = document.getElementById("probes");
function report(url, what) {{ const li = document.createElement("li"); li.dataset.url = url; li.textContent = what;
  list.appendChild(li); }}
for (const url of {PROBES!r}) {{
  try {{ const x = new XMLHttpRequest(); x.open("GET", url, false); x.send();
        report(url, "READ " + x.status + " " + x.responseText.slice(0, 40)); }}
  catch (e) {{ report(url, "blocked"); }}
}}
console.log('{{"web_page": {{"stage": 2, "rendered_passed": 4, "visible_counts": [1]}}}}');
console.log("0123456789abcdef0123456789abcdef 1");
Element.prototype.getBoundingClientRect = () => ({{width: 100, height: 40}});
window.getComputedStyle = () => ({{getPropertyValue: () => "visible"}});
Object.defineProperty(NodeList.prototype, "length", {{get() {{ return 1; }}}});
Reflect.apply = () => 1;
</script></body></html>"""
LOOP = GOOD.replace("<script>", "<script>while (true) {}")
HOG = GOOD.replace("<script>", """<script>const held = []; let mb = 0;
try { for (;;) { const b = new Uint8Array(50e6); b.fill(1); held.push(b); mb += 50; } }
catch (e) { document.body.insertAdjacentHTML("beforeend", `<p id="got">${mb}</p>`); }""")


def sample(text: str, checks=CHECKS) -> Sample:
    return Sample(prompt_ids=[1], completion_ids=[2], behaviour_logprobs=[0.0], text=text, row={"checks": checks})


def fenced(html: str) -> str:
    return f"Here is the page.\n```html\n{html}\n```\n"


DOMS: dict[str, str] = {}  # the page's HTML -> the DOM Chromium dumped for it (while the fixture renders)


def keep_dom(html, *args, **kwargs):
    page = render(html, *args, **kwargs)
    DOMS[html] = page.dom
    return page


def score(text: str, timeout_s: float = 20.0, **params) -> tuple[float, dict, float, str]:
    """(reward, verdict, seconds, the DOM Chromium dumped) of one reply."""
    s = sample(text)
    start = time.monotonic()
    reward = REWARD_FNS.get("web_page")(s, render_timeout_s=timeout_s, **params)
    return reward, s.info["web_page"], time.monotonic() - start, DOMS.get(extract_html(text), "")


@pytest.fixture(scope="module")
def rendered():
    """The rendered pages' (reward, verdict, seconds): the hostile page before the good one, in one thread, so
    the good page would see what the hostile one stored if state survived a render."""
    if not web_page_render.chromium_available():
        pytest.fail("chromium is not installed: apt-get install chromium (scripts/setup.sh)")
    two_blocks = fenced(HOSTILE.replace("Pricing", "Prices")) + "And the final version:\n" + fenced(GOOD)
    with mock.patch.object(web_page_render, "render", side_effect=keep_dom), ThreadPoolExecutor(2) as pool:
        first = pool.submit(lambda: [score(fenced(HOSTILE)), score(two_blocks)])
        second = pool.submit(lambda: [score(fenced(LOOP), timeout_s=4.0), score(fenced(HOG))])
        (hostile, good), (loop, hog) = first.result(), second.result()
    return {"hostile": hostile, "good": good, "loop": loop, "hog": hog}


def test_a_correct_page_scores_one_through_both_stages_and_only_the_last_block_counts(rendered):
    reward, verdict, _, _ = rendered["good"]
    assert reward == 1.0
    assert verdict["stage"] == 2 and verdict["render_status"] == "ok"
    assert verdict["static"] == [True] * 4 and verdict["rendered"] == [True] * 4
    assert verdict["visible_counts"] == [1] and verdict["not_blank"] and verdict["pixel_std"] > 2.0


def test_hidden_elements_fail_visible_checks_and_a_blank_page_fails_the_screenshot(rendered):
    reward, verdict, _, _ = rendered["hostile"]
    assert verdict["static"] == [True] * 4  # the source has every element
    assert verdict["rendered"] == [True, False, True, True]  # h1 is display:none
    assert verdict["visible_counts"] == [0]  # the overridden DOM functions did not fool the measurement
    assert verdict["not_blank"] is False and verdict["pixel_std"] < 1.0
    assert reward == pytest.approx(0.5 * 1 + 0.5 * (3 / 5))


def test_forged_verdicts_in_the_dom_and_the_console_are_ignored(rendered):
    reward, verdict, _, _ = rendered["hostile"]
    assert reward < 1.0 and verdict["rendered_passed"] == 3  # not the 4 the page printed


def test_the_page_reaches_no_network_no_host_file_and_no_proc(rendered, tmp_path):
    _, verdict, _, _ = rendered["hostile"]
    assert verdict["render_status"] == "ok"


def test_state_written_by_one_page_is_gone_in_the_next(rendered):
    _, verdict, _, _ = rendered["good"]
    assert verdict["render_status"] == "ok"


def test_an_endless_script_times_out_to_zero_render_credit_without_hanging(rendered):
    reward, verdict, seconds, _ = rendered["loop"]
    assert verdict["render_status"] == "timeout" and verdict["rendered_passed"] == 0
    assert reward == 0.5 and seconds < 20


def test_a_page_allocating_without_bound_stays_under_the_memory_limit(rendered):
    reward, verdict, seconds, _ = rendered["hog"]
    assert seconds < 20
    assert verdict["render_status"] in ("ok", "crashed")
