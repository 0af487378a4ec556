"""The course website, as a learner sees it: build it as `make site` does, serve build/site on localhost and open every
page in headless Chromium (Debian's `chromium`), driven through the DevTools protocol.

Checked in the browser: every page loads with no console error or failed request, every image decodes to a non-zero
size, every internal link (page and anchor) resolves, each lesson's Colab links open that lesson and its reference
solution is linked, the lessons are chained by next-links, the glossary's own links resolve and every lesson links it,
search finds a lesson offline, and at a laptop's width (1280 px) no output, code cell, table or image of any page is
wider than the text column (docs/site/static/course.css wraps long lines; what is still too wide is also written to
build/site-overflow.json). A screenshot of one lesson goes to build/site-screenshot.png. Without Chromium the tests
fail and name the install command.
"""
from __future__ import annotations

import base64
import functools
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import tomllib
import urllib.request
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import urldefrag, urlparse

import pytest
import websocket

REPO = Path(__file__).resolve().parents[1]
SITE = REPO / "build" / "site"
BUILD_COMMAND = [sys.executable, "-m", "scripts.build_site"]  # the Makefile's `site` recipe (checked below)
SCREENSHOT = REPO / "build" / "site-screenshot.png"
OVERFLOW_REPORT = REPO / "build" / "site-overflow.json"
SCREENSHOT_LESSON = "01_pytorch_baseline"
INSTALL = "apt-get install -y chromium"  # Debian's package, as .ci/run installs it
VIEWPORT = {"width": 1280, "height": 900}  # a laptop's browser window: the "normal width" outputs must fit
TIMEOUT_S = 60  # one browser step (start, page load, search) on a busy 2-core machine
LESSONS = sorted(p.stem for p in (REPO / "notebooks").glob("[0-9][0-9]_*.ipynb"))
OWNER_NAME = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["urls"]["Repository"].removeprefix(
    "https://github.com/")

# Run in each page after its load event: images forced to load and decoded, then what the page shows, as JSON.
PAGE_PROBE = """(async () => {
  const images = [];
  for (const img of document.images) {
    img.loading = 'eager';
    let error = null;
    try { await img.decode(); } catch (e) { error = String(e); }
    images.push({src: img.currentSrc || img.src, width: img.naturalWidth, height: img.naturalHeight, error});
  }
  // What is wider than the text column: a block that scrolls (its content wider than its box) or reaches past the
  // column's right edge; each named by where it sits (a cell's output, a code cell, other text)
  const column = document.querySelector('article.bd-article');
  const edge = column ? column.getBoundingClientRect().right : window.innerWidth;
  const blocks = 'article pre, article table, article img, .pst-scrollable-table-container, .cell_output > *';
  const wide = [...document.querySelectorAll(blocks)]
    .filter(el => el.scrollWidth > el.clientWidth + 1 || el.getBoundingClientRect().right > edge + 1)
    .map(el => ({in: el.closest('.cell_output') ? 'output' : el.closest('.cell_input') ? 'code' : 'text',
                 tag: el.tagName, width: Math.max(el.scrollWidth, Math.round(el.getBoundingClientRect().right)),
                 box: el.clientWidth, text: el.innerText.slice(0, 80)}));
  return JSON.stringify({
    title: document.title, images, wide,
    links: [...document.querySelectorAll('a[href]')].map(a => a.href),
    ids: [...document.querySelectorAll('[id]')].map(el => el.id),
    next: (document.querySelector('a.right-next') || {}).href || null,
    // results tables as rendered in outputs, and any output paragraph that still shows a markdown separator row
    output_tables: document.querySelectorAll('.cell_output table').length,
    markdown_as_text: [...document.querySelectorAll('.cell_output p')].map(p => p.innerText)
      .filter(text => /\\|\\s*[-\\u2013\\u2014:]+\\s*\\|/.test(text)),
  });
})()"""


def find_chromium() -> str:
    """Path of the chromium executable; a missing browser fails the test with the command that installs it."""
    found = shutil.which("chromium")
    if found is None:
        pytest.fail(f"the website's browser test needs Chromium, and `chromium` is not on the PATH: run `{INSTALL}` "
                    "(Debian; .ci/run does it when it is missing)")
    return found


class Browser:
    """One headless Chromium page, driven by the DevTools protocol over its websocket."""

    def __init__(self, executable: str):
        self.profile = tempfile.mkdtemp(prefix="course-chromium-")
        sandbox = ["--no-sandbox"] if os.geteuid() == 0 else []  # Chromium's sandbox refuses to run as root (CI)
        # Every host but localhost resolves to nothing: a page that loads anything from the web (a CDN's script or
        # font) fails here as it would for a reader offline, whatever this machine's network
        offline = "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1"
        self.process = subprocess.Popen(
            [executable, "--headless", "--disable-gpu", "--no-first-run", "--remote-debugging-port=0", offline,
             f"--user-data-dir={self.profile}", *sandbox, "about:blank"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            self.connect(executable)
        except BaseException:
            self.close()
            raise

    def connect(self, executable: str) -> None:
        """Attach to the browser's page over its DevTools websocket and enable the domains the checks read."""
        port_file = Path(self.profile) / "DevToolsActivePort"
        deadline = time.monotonic() + TIMEOUT_S
        while not port_file.exists() or not port_file.read_text().strip():
            if self.process.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"{executable} did not start its DevTools endpoint within {TIMEOUT_S} s")
            time.sleep(0.1)
        port = port_file.read_text().split()[0]
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=TIMEOUT_S) as response:
            page = next(t for t in json.load(response) if t["type"] == "page")
        self.socket = websocket.create_connection(page["webSocketDebuggerUrl"], timeout=TIMEOUT_S,
                                                  suppress_origin=True)
        self.next_id, self.events = 0, []
        for domain in ("Page", "Runtime", "Log", "Network"):
            self.call(f"{domain}.enable")
        self.call("Emulation.setDeviceMetricsOverride", **VIEWPORT, deviceScaleFactor=1, mobile=False)

    def call(self, method: str, **params) -> dict:
        """Send one command and return its result; events that arrive meanwhile are kept in self.events."""
        self.next_id += 1
        self.socket.send(json.dumps({"id": self.next_id, "method": method, "params": params}))
        while True:
            message = json.loads(self.socket.recv())
            if message.get("id") == self.next_id:
                if "error" in message:
                    raise RuntimeError(f"{method}: {message['error']}")
                return message["result"]
            self.events.append(message)

    def wait_for(self, event: str) -> None:
        """Read messages until the named event arrives."""
        while not any(m.get("method") == event for m in self.events):
            self.events.append(json.loads(self.socket.recv()))

    def visit(self, url: str) -> dict:
        """Load a page and probe it: what PAGE_PROBE returns, plus the errors the page raised while loading."""
        origin = "{0.scheme}://{0.netloc}".format(urlparse(url))
        # Each page as a first visit sees it: no mode, sidebar position or search state kept from the pages before
        self.call("Storage.clearDataForOrigin", origin=origin, storageTypes="local_storage,session_storage")
        self.events = []
        self.call("Page.navigate", url=url)
        self.wait_for("Page.loadEventFired")
        probe = self.call("Runtime.evaluate", expression=PAGE_PROBE, awaitPromise=True, returnByValue=True)
        result = json.loads(probe["result"]["value"])
        result["errors"] = page_errors(self.events)
        return result

    def screenshot(self, path: Path) -> None:
        """Save the current viewport as a PNG."""
        path.write_bytes(base64.b64decode(self.call("Page.captureScreenshot", format="png")["data"]))

    def close(self) -> None:
        """Stop the browser and remove its profile."""
        if hasattr(self, "socket"):
            self.socket.close()
        self.process.terminate()
        self.process.wait(timeout=TIMEOUT_S)
        shutil.rmtree(self.profile, ignore_errors=True)


def page_errors(events: list[dict]) -> list[str]:
    """Console errors, uncaught exceptions, error log entries, failed requests and HTTP errors among DevTools events."""
    errors = []
    for event in events:
        method, params = event.get("method"), event.get("params", {})
        if method == "Runtime.consoleAPICalled" and params["type"] in ("error", "assert"):
            errors.append("console: " + " ".join(str(a.get("value", a.get("description"))) for a in params["args"]))
        elif method == "Runtime.exceptionThrown":
            errors.append(f"exception: {params['exceptionDetails'].get('exception', {}).get('description')}")
        elif method == "Log.entryAdded" and params["entry"]["level"] == "error":
            errors.append(f"log: {params['entry']['text']} {params['entry'].get('url', '')}")
        elif method == "Network.loadingFailed":
            errors.append(f"request failed: {params['errorText']}")
        elif method == "Network.responseReceived" and params["response"]["status"] >= 400:
            errors.append(f"HTTP {params['response']['status']}: {params['response']['url']}")
    return errors


@pytest.fixture(scope="module")
def site() -> Path:
    """build/site, built afresh by the command `make site` runs."""
    started = time.monotonic()
    build = subprocess.run(BUILD_COMMAND, cwd=REPO, capture_output=True, text=True)
    assert build.returncode == 0, f"make site failed:\n{build.stdout[-3000:]}\n{build.stderr[-6000:]}"
    print(f"site built in {time.monotonic() - started:.0f} s")
    return SITE


@pytest.fixture(scope="module")
def crawl(site):
    """{page path relative to build/site: probe} for every HTML page, each opened in Chromium over localhost."""
    executable = find_chromium()
    handler = functools.partial(QuietHandler, directory=str(site))
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{server.server_address[1]}/"
    browser = Browser(executable)
    try:
        pages = sorted(str(p.relative_to(site)) for p in site.rglob("*.html") if p.parts[len(site.parts)] != "_static")
        results = {page: browser.visit(base + page) for page in pages}
        browser.visit(f"{base}notebooks/{SCREENSHOT_LESSON}.html")
        browser.screenshot(SCREENSHOT)
        browser.visit(f"{base}search.html?q=DataModule")
        results["search"] = search_results(browser)
    finally:
        browser.close()
        server.shutdown()
    OVERFLOW_REPORT.write_text(json.dumps({p: r["wide"] for p, r in results.items() if r.get("wide")}, indent=1))
    yield base, results


class QuietHandler(SimpleHTTPRequestHandler):
    """Serves build/site without logging every request to stderr."""

    def log_message(self, *args) -> None:
        """Silence the per-request log."""


def search_results(browser: Browser) -> dict:
    """The search page's result links once Sphinx's search script has filled them in (it runs after load)."""
    deadline = time.monotonic() + TIMEOUT_S
    expression = "[...document.querySelectorAll('#search-results li a')].map(a => a.href)"
    while time.monotonic() < deadline:
        found = browser.call("Runtime.evaluate", expression=expression, returnByValue=True)["result"]["value"]
        if found:
            return {"links": found, "errors": page_errors(browser.events)}
        time.sleep(0.2)
    return {"links": [], "errors": page_errors(browser.events)}


def test_make_site_and_the_pages_workflow_run_the_command_this_test_builds_with():
    """`make site` runs `python -m scripts.build_site` with the venv's Python (this test runs it with its own
    interpreter), and the Pages workflow publishes exactly what `make site` builds."""
    makefile = (REPO / "Makefile").read_text()
    recipe = re.search(r"^site: .*\n((?:\t.*\n)+)", makefile, re.M)
    assert recipe and recipe.group(1).strip() == "$(BIN)/python " + " ".join(BUILD_COMMAND[1:]), recipe
    workflow = (REPO / ".github" / "workflows" / "pages.yml").read_text()
    assert re.search(r"^\s+(- )?run: make site$", workflow, re.M) and "path: build/site" in workflow


def test_a_missing_chromium_fails_naming_the_install_command(monkeypatch, tmp_path):
    """With no chromium on the PATH the browser test fails (never skips) and says how to install it."""
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(pytest.fail.Exception, match=re.escape(INSTALL)):
        find_chromium()


def test_the_site_holds_every_lesson_solution_and_results_page(site):
    """One page per lesson, per reference solution and per docs/results/*.md, plus the landing page and search."""
    expected = {"index.html", "search.html"} | {f"notebooks/{stem}.html" for stem in LESSONS}
    expected |= {f"notebooks/solutions/{p.stem}.html" for p in (REPO / "notebooks" / "solutions").glob("*.py")}
    expected |= {f"docs/results/{p.stem}.html" for p in (REPO / "docs" / "results").glob("*.md")}
    expected |= {"docs/glossary.html"}
    assert expected <= {str(p.relative_to(site)) for p in site.rglob("*.html")}


def test_every_page_loads_without_console_errors(crawl):
    """No console error, uncaught exception, failed request or HTTP error on any page."""
    _, results = crawl
    assert {page: r["errors"] for page, r in results.items() if r["errors"]} == {}


def test_every_image_is_decoded_with_a_size(crawl):
    """Every <img> (the lessons' plots among them) decodes, with a non-zero natural size; the lessons have plots."""
    _, results = crawl
    images = [(page, image) for page, r in results.items() for image in r.get("images", [])]
    assert sum(page.startswith("notebooks/") for page, _ in images) >= len(LESSONS)
    assert [(page, i) for page, i in images if i["error"] or not (i["width"] > 0 and i["height"] > 0)] == []


def test_every_internal_link_resolves(crawl):
    """Each same-site link opens a page that was loaded (or a file the server has), at an anchor that page holds."""
    base, results = crawl
    pages = {page: r for page, r in results.items() if page != "search"}
    broken = []
    for page, r in pages.items():
        for link in r["links"]:
            url, anchor = urldefrag(link)
            if not url.startswith(base):
                continue
            target = urlparse(url).path.lstrip("/") or "index.html"
            target = target + "index.html" if target.endswith("/") else target
            if target not in pages and not (SITE / target).is_file():
                broken.append((page, link, "no such page"))
            elif anchor and target in pages and anchor not in pages[target]["ids"]:
                broken.append((page, link, "no such anchor"))
    assert sum(len(r["links"]) for r in pages.values()) > 10 * len(pages)  # the crawl saw the pages' links
    assert broken == []


def test_each_lesson_opens_itself_in_colab_and_links_its_solution(crawl):
    """Every Colab link on a lesson's page opens that lesson's notebook; each lesson with a reference solution links
    it; lesson N's next-link leads to lesson N+1."""
    base, results = crawl
    for number, stem in enumerate(LESSONS):
        links = results[f"notebooks/{stem}.html"]["links"]
        colab = {link for link in links if link.startswith("https://colab.research.google.com/")}
        assert colab == {f"https://colab.research.google.com/github/{OWNER_NAME}/blob/main/notebooks/{stem}.ipynb"}
        if (REPO / "notebooks" / "solutions" / f"{stem}.py").exists():
            assert f"{base}notebooks/solutions/{stem}.html" in links, stem
        if number + 1 < len(LESSONS):
            assert results[f"notebooks/{stem}.html"]["next"] == f"{base}notebooks/{LESSONS[number + 1]}.html"


def test_each_lesson_links_the_glossary_at_its_terms(crawl):
    """Every lesson links the glossary page under its title, and at the entry of each term its markdown links
    (tests/test_lesson_text.py checks that each term's first use is linked), each entry an anchor on that page."""
    base, results = crawl
    glossary = f"{base}docs/glossary.html"
    ids = set(results["docs/glossary.html"]["ids"])
    for stem in LESSONS:
        cells = json.loads((REPO / "notebooks" / f"{stem}.ipynb").read_text())["cells"]
        linked = set(re.findall(r"\]\(\.\./docs/glossary\.md#([\w-]+)\)",
                                "".join("".join(c["source"]) for c in cells if c["cell_type"] == "markdown")))
        anchors = {urldefrag(link)[1] for link in results[f"notebooks/{stem}.html"]["links"]
                   if urldefrag(link)[0] == glossary}
        assert "" in anchors, f"{stem}: no link to the glossary"
        # one anchor on the page per linked term (Sphinx writes "McNemar's test" as mcnemar-s-test, not the slug)
        assert len(anchors - {""}) == len(linked) and anchors <= ids | {""}, (stem, linked, anchors - ids)


def test_nothing_is_wider_than_the_text_column(crawl):
    """At 1280 px no lesson output, code cell, table or image, and no block of any other page, reaches past the text
    column or hides behind a scroll bar: long lines wrap (docs/site/static/course.css), results tables render as
    tables (bench.Table's text/markdown, read as GitHub markdown)."""
    _, results = crawl
    assert sum(1 for r in results.values() for w in r.get("wide", ())) == 0, json.dumps(
        {page: r["wide"] for page, r in results.items() if r.get("wide")}, indent=1)[:6000]


def test_results_tables_render_as_tables(crawl):
    """A lesson that shows a results table (a text/markdown output, bench.Table) gets an HTML table in its output on
    the page, and no output shows a markdown table's separator row ('|---|') as text."""
    _, results = crawl
    for stem in LESSONS:
        outputs = [o for c in json.loads((REPO / "notebooks" / f"{stem}.ipynb").read_text())["cells"]
                   for o in c.get("outputs", ())]
        tables = sum("|---|" in "".join(o.get("data", {}).get("text/markdown", "")) for o in outputs)
        probe = results[f"notebooks/{stem}.html"]
        assert probe["output_tables"] >= tables, (stem, probe["output_tables"], tables)
        assert probe["markdown_as_text"] == [], stem


def test_the_glossary_links_resolve_and_every_lesson_links_it(crawl):
    """The glossary page loads with no error; each of its cross-references between terms (docs/glossary.md's
    '](#term)' links) lands on an anchor of the page, and its other site links open pages that were loaded; every
    lesson page links it."""
    base, results = crawl
    page = f"{base}docs/glossary.html"
    glossary = results["docs/glossary.html"]
    assert glossary["errors"] == []
    written = re.findall(r"\]\(#([\w-]+)\)", (REPO / "docs" / "glossary.md").read_text())
    anchors = [urldefrag(link)[1] for link in glossary["links"] if urldefrag(link)[0] == page]
    assert set(written) <= set(anchors), sorted(set(written) - set(anchors))  # each cross-reference is a link
    assert [a for a in anchors if a and a not in glossary["ids"]] == []
    other = {urlparse(urldefrag(link)[0]).path.lstrip("/") for link in glossary["links"] if link.startswith(base)}
    assert [p for p in other if p and p not in results and not (SITE / p).is_file()] == []
    for stem in LESSONS:
        assert page in {urldefrag(link)[0] for link in results[f"notebooks/{stem}.html"]["links"]}, stem


def test_search_finds_a_lesson_offline(crawl):
    """The search page, run in the browser with no network, lists lesson 02 for 'DataModule', with no error."""
    base, results = crawl
    assert f"{base}notebooks/02_lightning.html" in {urldefrag(link)[0] for link in results["search"]["links"]}
    assert results["search"]["errors"] == []


def test_a_lesson_screenshot_is_saved(crawl):
    """build/site-screenshot.png is a PNG of the viewport's size (PNG header: width and height at bytes 16-24)."""
    data = SCREENSHOT.read_bytes()
    assert data.startswith(b"\x89PNG") and len(data) > 20_000
    assert (int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")) == tuple(VIEWPORT.values())
