"""`web_page`: a correct page scores 1 through both stages; hostile pages cannot make wrong answers score.

The rendered pages (Chromium in the sandbox, ~4 s each) are rendered once, two at a time, by a module fixture;
the tests read their verdicts. The hostile page reports what its own probes got into its DOM, so "blocked" there
shows that each probe ran and failed.
"""
import json
import re
import time
from concurrent.futures import ThreadPoolExecutor
from unittest import mock

import pytest

from lmrl.envs.tasks import load_task
from lmrl.loading import load_recipe
from lmrl.recipe_files import SHIPPED_DATA
from lmrl.rewards import REWARD_FNS, web_page_render
from lmrl.rewards.sandbox_program import run_program
from lmrl.rewards.web_page_checks import check_passes, extract_html, parse, read_checks
from lmrl.rewards.web_page_render import CHROMIUM, FLAGS, FONTS, measuring_copy, read_counts, render
from lmrl.types import Sample

CHECKS = [{"selector": "nav a", "min": 3}, {"selector": "h1", "text": "Pricing", "visible": True},
          {"selector": "form input[type=email]"}, {"selector": "form button"}]
BODY = """<nav><a href="#a">Home</a><a href="#b">Plans</a><a href="#c">Contact</a></nav>
<h1 class="title">Pricing</h1><form><input type="email" name="email"><button>Join</button></form>"""
GOOD = f"""<!doctype html><html><head><title>Plans</title><style>body{{background:#f4f0e8;font:18px sans-serif}}
h1{{color:#123}}</style></head><body>{BODY}<p id="state"></p><script>
document.getElementById("state").textContent = localStorage.getItem("kept") || "fresh";</script></body></html>"""
PROBES = ["http://example.com/", "http://127.0.0.1:8000/", "file:///etc/passwd", "file:///work/main/pyproject.toml",
          "file:///proc/self/environ", "file:///proc/1/cmdline", "page.html"]
HOSTILE = f"""<!doctype html><html><head><title>x</title><style>html,body{{background:#fff;color:#fff}}
.title{{display:none}} a,input,button{{visibility:hidden}}</style></head><body>{BODY}
<ul id="probes"></ul><p id="store"></p>
<div id="fake">checks passed: 4/4 {{"web_page": {{"stage": 2, "rendered_passed": 4}}}}</div>
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
  fetch(url).then(r => r.text()).then(t => report("fetch " + url, "READ " + t.slice(0, 40)),
                                      () => report("fetch " + url, "blocked"));
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
    seconds = time.monotonic() - start
    verdict = s.info["web_page"]
    return reward, verdict, seconds, DOMS.get(extract_html(text), "") if verdict["stage"] == 2 else ""


@pytest.fixture(scope="module")
def rendered():
    """The rendered pages' (reward, verdict, seconds): the hostile page before the good one, in one thread, so
    the good page would see what the hostile one stored if state survived a render."""
    if not web_page_render.chromium_available():
        pytest.fail("chromium is not installed: apt-get install chromium (scripts/setup.sh)")
    two_blocks = fenced(HOSTILE.replace("Pricing", "Prices")) + "And the final version:\n" + fenced(GOOD)
    with mock.patch.object(web_page_render, "render", side_effect=keep_dom), ThreadPoolExecutor(2) as pool:
        first = pool.submit(lambda: [score(fenced(HOSTILE)), score(two_blocks)])
        second = pool.submit(lambda: [score(fenced(LOOP), timeout_s=4.0), score(fenced(HOG)), root_listing()])
        (hostile, good), (loop, hog, listing) = first.result(), second.result()
    return {"hostile": hostile, "good": good, "loop": loop, "hog": hog, "root_listing": listing}


def root_listing() -> set[str]:
    """The names Chromium's listing of file:/// shows inside the render sandbox."""
    argv = [CHROMIUM, *FLAGS, "--virtual-time-budget=500", "--dump-dom", "file:///"]
    result = run_program(argv, (CHROMIUM, *FONTS), timeout_s=20, memory_mb=1024, memory_limit="data",
                         max_processes=256, max_open_files=1024)
    return set(re.findall(r'addRow\("([^"]+)"', result.stdout))


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


def test_the_page_reaches_no_network_no_host_file_and_no_proc(rendered):
    probes = {li["data-url"]: li.get_text() for li in parse(rendered["hostile"][3]).select("#probes li")}
    assert set(probes) == {*PROBES, *(f"fetch {url}" for url in PROBES)}  # every XHR and fetch ran
    assert set(probes.values()) == {"blocked"}


def test_the_render_root_holds_no_host_directory(rendered):
    names = rendered["root_listing"]
    assert {"usr", "sandbox", "proc"} <= names
    assert not names & {"work", "root", "home", "opt", "var"}


def test_state_written_by_one_page_is_gone_in_the_next(rendered):
    assert parse(rendered["hostile"][3]).select_one("#store").get_text() == "wrote:from an earlier page"
    assert parse(rendered["good"][3]).select_one("#state").get_text() == "fresh"  # rendered after it


def test_an_endless_script_times_out_to_zero_render_credit_without_hanging(rendered):
    reward, verdict, seconds, _ = rendered["loop"]
    assert verdict["render_status"] == "timeout" and verdict["rendered_passed"] == 0
    assert reward == 0.5 and seconds < 20


def test_a_page_allocating_without_bound_stays_under_the_memory_limit(rendered):
    reward, verdict, seconds, dom = rendered["hog"]
    assert seconds < 20 and verdict["render_status"] == "ok"
    held_mb = int(parse(dom).select_one("#got").get_text())
    assert 0 < held_mb < 1024  # the data-segment limit (memory_mb=1024) stopped it
    assert reward == 1.0  # the page itself is correct once its allocation fails


def test_a_reply_over_the_size_cap_scores_zero_before_anything_is_parsed():
    huge = fenced(GOOD.replace("<p id=\"state\">", "<p>" + "x" * (50 << 20) + "</p><p id=\"state\">"))
    reward, verdict, seconds, _ = score(huge)
    assert reward == 0.0 and verdict["stage"] == 0 and "max_bytes" in verdict["reason"]
    assert seconds < 2.0


def test_text_drawn_only_as_an_image_fails_the_text_check_and_is_never_rendered():
    pixel = ("data:image/png;base64,"
             "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg==")
    page = GOOD.replace('<h1 class="title">Pricing</h1>', f'<h1><img src="{pixel}" alt=""></h1>')
    with mock.patch.object(web_page_render, "render", side_effect=AssertionError("rendered")):
        reward, verdict, _, _ = score(fenced(page))
    assert verdict["stage"] == 1 and verdict["static"] == [True, False, True, True]
    assert reward == pytest.approx(0.5 * 3 / 4)


def test_render_false_is_the_static_stage_alone_and_needs_no_chromium(monkeypatch):
    monkeypatch.setattr(web_page_render, "CHROMIUM", "/nonexistent/chromium")
    with pytest.raises(RuntimeError, match="apt-get install chromium"):
        score(fenced(GOOD))
    assert score(fenced(GOOD), render=False)[0] == 1.0
    assert score(fenced(GOOD.replace("<nav>", "<nav><!--").replace("</nav>", "--></nav>")), render=False)[0] == 0.75


def test_the_last_html_block_counts_and_a_bare_document_is_taken_whole():
    assert extract_html("```html\n<p>one</p>\n```\ntext\n```html\n<p>two</p>\n```") == "<p>two</p>\n"
    assert extract_html("```python\nprint()\n```") is None
    assert extract_html("  <!DOCTYPE html><html></html>").startswith("  <!DOCTYPE")
    assert extract_html("I would write <html> here") is None
    reward, verdict, _, _ = score("No page today.")
    assert reward == 0.0 and verdict["stage"] == 0


def test_malformed_checks_raise_with_the_fix():
    for bad, message in [([], "non-empty list"), ([{"min": 2}], "selector"), ([{"selector": "a", "min": -1}], "min"),
                         ([{"selector": "a[", "min": 1}], "not valid CSS"),
                         ([{"selector": "a", "colour": 1}], "unknown"),
                         ("not json", "not JSON")]:
        with pytest.raises(ValueError, match=message):
            read_checks(bad)
    assert read_checks('[{"selector": "h1", "text": "  Big   Sale "}]')[0].text == "big sale"


def test_only_one_console_line_with_the_nonce_and_the_right_count_is_read():
    nonce = "ab" * 16
    line = '[1:1:0/0:INFO:CONSOLE:3] "{} {}", source: file:///sandbox/page.html (3)'
    assert read_counts(line.format(nonce, "2,0"), nonce, 2) == [2, 0]
    assert read_counts(line.format("cd" * 16, "2,0"), nonce, 2) is None  # a page's guess of the nonce
    assert read_counts(line.format(nonce, "2,0") + "\n" + line.format(nonce, "5,5"), nonce, 2) is None
    assert read_counts(line.format(nonce, "2"), nonce, 2) is None
    assert read_counts('"{} 2,0"'.format(nonce), nonce, 2) is None  # not a console line of Chromium's


def test_the_measuring_script_goes_first_after_the_doctype_and_escapes_selectors():
    checks = read_checks([{"selector": "h1", "text": "</script><b>", "visible": True}])
    copy = measuring_copy("<!DOCTYPE html><html><body><script>page()</script></body></html>", checks, "n0nce")
    assert copy.startswith("<!DOCTYPE html><script>(function")
    assert copy.index("n0nce") < copy.index("page()") and copy.count("</script>") == 2


def test_every_shipped_reference_page_passes_its_static_checks_and_an_empty_reply_scores_zero():
    rows = [json.loads(line) for line in (SHIPPED_DATA / "web_pages.jsonl").read_text().splitlines()]
    assert len(rows) == 12
    fn = REWARD_FNS.get("web_page")
    for row in rows:
        read_checks(row["checks"])
        reference = Sample(prompt_ids=[1], completion_ids=[2], behaviour_logprobs=[0.0],
                           text=f"```html\n{row['reference']}```", row=row)
        assert fn(reference, render=False) == 1.0, row["id"]
        assert fn(Sample(prompt_ids=[1], completion_ids=[2], behaviour_logprobs=[0.0], text="```html\n```",
                         row=row), render=False) == 0.0


def test_the_recipe_loads_its_shipped_task_by_name():
    cfg = load_recipe("web_page")
    data = load_task(cfg.task)
    assert (len(data.train), len(data.eval)) == (8, 4)
    assert all(row.get("checks") for row in data.train + data.eval)
    assert [c.name for c in cfg.reward.components] == ["web_page"] and cfg.reward.accuracy_component == "web_page"


def test_text_inside_scripts_comments_styles_and_templates_does_not_count():
    hidden_words = ('<h1><script>var a = "Pricing"</script><!-- Pricing --><style>/* Pricing */</style>'
                    '<template>Pricing</template></h1>')
    check = read_checks([{"selector": "h1", "text": "Pricing"}])[0]
    assert not check_passes(parse(hidden_words), check)
    assert check_passes(parse("<h1>Our <b>pricing</b></h1>"), check)
