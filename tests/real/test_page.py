"""The chat page at `/` (edgespec/web) in a real headless Chromium, on a real server with the default model.

Playwright drives the distribution's Chromium (`apt-get install chromium`, which `make install` does where it
can). Where no Chromium or no playwright is installed the test skips, saying why, but under CI (CI=true) it fails:
a CI run that cannot show the page works does not pass. The page's answers are
compared with the API's own for the same requests; screenshots go to $EDGESPEC_ARTIFACTS.
"""

import asyncio
import json
import os
import re
import shutil
import socket
import threading
import time
from pathlib import Path

import pytest
from conftest import ON_CI

httpx = pytest.importorskip("httpx")
uvicorn = pytest.importorskip("uvicorn")
pytest.importorskip("fastapi")
try:
    from playwright import sync_api as playwright
except ImportError:
    playwright = None
CHROMIUM = next(filter(None, map(shutil.which, ("chromium", "chromium-browser", "google-chrome", "chrome"))), None)
LACKING = ("playwright is not installed (pip install 'edgespec[dev]')" if playwright is None else
           "no Chromium on this machine (apt-get install chromium)" if CHROMIUM is None else None)
if LACKING and not ON_CI:
    pytest.skip(LACKING, allow_module_level=True)


def test_the_browser_is_here():
    """Under CI a missing browser is a failure, not a skip (the page tests after it then fail too)."""
    assert LACKING is None, LACKING

import edgespec  # noqa: E402
from edgespec.server import create_app, loading_thread  # noqa: E402

KEY = "page-key"
N = 24  # tokens per answer: enough to compare, quick on two cores
FIRST = "Repeat this sentence twice: the quick brown fox jumps over the lazy dog."  # prompt lookup drafts the copy
SECOND = "Once\nmore, please."  # typed with Shift+Enter
# greedy, and a fixed draft length (the controller's choice follows measured timings): which text the draft
# proposed is then the same on every run, and the page's green runs can be compared with the API's
SAMPLING = {"temperature": 0, "max_tokens": N, "draft_max": 4}
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync"]
FINAL = re.compile(r"accepted (\d+)/\d+ drafts \(\d+%\) · \d+ tokens · [\d.]+ tok/s · finish: \w+")


@pytest.fixture(scope="module")
def server(default_gguf):
    """The app on the default model with prompt lookup, requiring KEY, served by uvicorn on a loopback port in
    this process (one llama.cpp thread: the cores are shared with the browser)."""
    executor = loading_thread()
    engine = executor.submit(edgespec.load, default_gguf, "ngram", n_ctx=1024, threads=1).result()
    app = create_app(engine, api_key=KEY, executor=executor)
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", timeout_graceful_shutdown=1))
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    thread = threading.Thread(target=lambda: asyncio.run(server.serve(sockets=[sock])), daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert time.monotonic() < deadline, "the server did not start"
        time.sleep(0.05)
    yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    server.should_exit = True
    thread.join(timeout=30)
    sock.close()
    engine.close()
    executor.shutdown()


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    with playwright.sync_playwright() as p:
        context = p.chromium.launch_persistent_context(
            str(tmp_path_factory.mktemp("chromium-profile")), executable_path=CHROMIUM, headless=True, args=FLAGS,
            viewport={"width": 900, "height": 760})
        yield context
        context.close()


@pytest.fixture
def page(browser, server):
    """The page freshly loaded (its own tab: sessionStorage starts empty), every request it makes recorded."""
    tab = browser.new_page()
    tab.set_default_timeout(20_000)
    requested = []
    tab.on("request", lambda r: requested.append(r.url))
    tab.goto(server)
    tab.requested = requested
    yield tab
    tab.close()


def api_runs(url: str, messages: list[dict]) -> list[list]:
    """The API's streamed answer to `messages` (SAMPLING) as runs [from_draft, text], consecutive pieces of one
    kind joined, as the page shows them."""
    runs = []
    with httpx.stream("POST", f"{url}/v1/chat/completions", headers={"Authorization": f"Bearer {KEY}"},
                      json={"messages": messages, "stream": True, **SAMPLING}, timeout=120) as r:
        assert r.status_code == 200, r.read()
        for line in r.iter_lines():
            if not line.startswith("data: {"):
                continue
            chunk = json.loads(line[6:])
            piece = chunk["choices"][0]["delta"].get("content")
            if piece:
                from_draft = chunk["edgespec"]["from_draft"]
                if runs and runs[-1][0] == from_draft:
                    runs[-1][1] += piece
                else:
                    runs.append([from_draft, piece])
    return runs


def page_runs(page) -> list[list]:
    """The last answer on the page as runs [green, text]."""
    return page.locator(".msg.assistant").last.evaluate(
        "el => [...el.children].map(run => [run.classList.contains('draft'), run.textContent])")


def artifacts(tmp_path: Path) -> Path:
    folder = Path(os.environ.get("EDGESPEC_ARTIFACTS") or tmp_path)
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def use_key(page, key: str) -> None:
    page.fill("#key", key)
    page.click("#key-save")


def answered(page, timeout: float = 60.0) -> str:
    """The last answer's text, once its stream has ended."""
    playwright.expect(page.locator(".msg.streaming")).to_have_count(0, timeout=timeout * 1000)
    return page.locator(".msg.assistant").last.text_content()


def test_a_bad_key_shows_an_error_and_the_right_one_clears_it(page, server):
    expect = playwright.expect
    r = httpx.get(server)  # the page itself needs no key, and may load nothing from elsewhere
    assert r.status_code == 200 and "default-src 'self'" in r.headers["content-security-policy"]
    assert httpx.get(f"{server}/page/app.js").status_code == 200 and httpx.get(f"{server}/page/x").status_code == 404
    expect(page.locator("#key")).to_be_visible()  # the server needs a key: the page asks before anything else
    expect(page.locator("#error")).to_be_hidden()
    use_key(page, "wrong")
    expect(page.locator("#error")).to_be_visible()
    expect(page.locator("#error")).to_contain_text("refused the API key")
    use_key(page, KEY)
    expect(page.locator("#error")).to_be_hidden()
    expect(page.locator("#key-form")).to_be_hidden()


def test_streamed_answers_equal_the_api_and_show_the_speed(page, server, tmp_path):
    expect = playwright.expect
    use_key(page, KEY)
    expect(page.locator("#key-form")).to_be_hidden()
    health = httpx.get(f"{server}/health").json()
    expect(page.locator("#model")).to_have_text(f"{health['model']} · draft: {health['draft']}")
    page.click("#settings summary")
    for name, value in SAMPLING.items():
        page.fill(f"#{name}", str(value))

    page.fill("#prompt", FIRST)
    page.press("#prompt", "Enter")
    first = answered(page)
    expected = api_runs(server, [{"role": "user", "content": FIRST}])
    assert first.strip() and first == "".join(text for _, text in expected)
    # green where the target accepted the draft's text, as in the desktop app, and where the API says so
    assert page_runs(page) == expected and any(green for green, _ in expected)
    status = page.locator("#status").text_content()
    assert FINAL.fullmatch(status) and not status.startswith("accepted 0/"), status

    page.fill("#prompt", "Once")
    page.press("#prompt", "Shift+Enter")  # a new line, not a send
    page.type("#prompt", "more, please.")
    assert page.locator(".msg.assistant").count() == 1
    page.press("#prompt", "Enter")
    second = answered(page)
    history = [{"role": "user", "content": FIRST}, {"role": "assistant", "content": first},
               {"role": "user", "content": SECOND}]
    assert page_runs(page) == api_runs(server, history)  # the page sends the conversation so far
    assert second.strip()
    assert page.locator(".msg.user").last.text_content() == SECOND
    assert FINAL.fullmatch(page.locator("#status").text_content())
    assert all(url.startswith(server) or url.startswith("data:") for url in page.requested), page.requested

    folder = artifacts(tmp_path)
    page.screenshot(path=str(folder / "chat-page.png"))
    page.click("#settings summary")  # closed, as a phone's user would keep them
    page.set_viewport_size({"width": 390, "height": 760})  # a phone's width: nothing sticks out sideways
    assert page.evaluate("document.documentElement.scrollWidth <= document.documentElement.clientWidth")
    page.screenshot(path=str(folder / "chat-page-phone.png"))
    assert (folder / "chat-page.png").stat().st_size > 10_000


def test_stop_keeps_the_partial_answer(page):
    expect = playwright.expect
    use_key(page, KEY)
    page.click("#settings summary")
    page.fill("#max_tokens", "256")
    page.fill("#prompt", "Write a long story about a dragon.")
    page.click("#send")
    expect(page.locator("#stop")).to_be_enabled()
    expect(page.locator(".msg.assistant span")).not_to_have_count(0, timeout=60_000)  # the first token came
    page.click("#stop")
    answered(page)
    expect(page.locator("#status")).to_contain_text("· stopped")
    expect(page.locator("#send")).to_be_enabled()
    assert page.locator(".msg.assistant").last.text_content().strip()
