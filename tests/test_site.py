"""The rendered course (`make site`): a Jupyter Book of the executed lessons, with no solution in it.

The book is built from this pytest run's execution of each solution notebook (``conftest.executed_solutions``,
saved in build/executed/ and shared with tests/test_notebooks.py, so no lesson runs twice in one run; run
alone, these tests execute what they need). Jupyter Book renders those files: it executes nothing
(book/_config.yml).
"""

from __future__ import annotations

import hashlib
import re
import sys
import time
from html import unescape
from html.parser import HTMLParser
from pathlib import Path

import nbformat
import pytest

from browser import chrome, screenshot_on_failure
from conftest import (AUTOGRADERS, COURSE, EXECUTED, ROOT, SOLUTIONS, NotebookFailed, executed_solutions,
                      notebooks, read)
from test_release import MARKERS, _hidden_lines, _lines

sys.path.insert(0, str(ROOT / "book"))
import make_book  # noqa: E402

pytestmark = pytest.mark.slow  # builds the Jupyter Book from every executed lesson: `make test`, not `make test-fast`

LESSONS = make_book.lessons()


def _title(rel: Path) -> str:
    nb = read(COURSE / rel)
    return next(line[2:].strip() for c in nb.cells if c.cell_type == "markdown"
                for line in c.source.splitlines() if line.startswith("# "))


# Sphinx's smartquotes (on by default) shows a title's ' and " as typographic quotes: compare without them.
_PLAIN_QUOTES = str.maketrans({"\u2018": "'", "\u2019": "'", "\u201c": '"', "\u201d": '"'})


def _plain(text: str) -> str:
    return text.translate(_PLAIN_QUOTES)


@pytest.fixture(scope="module")
def html(tmp_path_factory) -> Path:
    try:  # the lessons no other worker is running first, so that this one never idles while one is left
        runs = executed_solutions([SOLUTIONS / rel for rel in LESSONS])
    except NotebookFailed as failure:
        pytest.fail(f"the book needs every lesson executed: {failure}", pytrace=False)
    for rel, executed in zip(LESSONS, runs):
        stale = make_book.stale_cells(read(COURSE / rel), executed)
        assert not stale, f"{rel}: cells {stale} of the release differ from the solution run (run `make release`)"
    site = tmp_path_factory.mktemp("site")
    started = time.perf_counter()
    make_book.assemble(EXECUTED, site)
    out = make_book.build_html(site, quiet=True)
    size = sum(p.stat().st_size for p in out.rglob("*") if p.is_file())
    print(f"\nbuilt the book in {time.perf_counter() - started:.1f} s: {size / 1e6:.1f} MB in {out}")
    return out


def test_lessons_are_the_released_notebooks():
    assert LESSONS == [p.relative_to(COURSE) for p in notebooks(COURSE)]
    assert [p.relative_to(SOLUTIONS) for p in notebooks(SOLUTIONS)] == LESSONS


def test_redaction_keeps_the_release_and_only_non_exercise_outputs():
    """On a toy pair: the solution's source never survives; exercise and check cells get no output."""
    def cell(source, meta=None, outputs=()):
        c = nbformat.v4.new_code_cell(source, metadata={"nbgrader": meta} if meta else {})
        c.outputs, c.execution_count = [nbformat.v4.new_output("stream", text=o) for o in outputs], 1
        return c

    released = nbformat.v4.new_notebook(cells=[
        cell("print(1)"), cell("# YOUR CODE HERE\nraise NotImplementedError()", {"solution": True}),
        cell('check("x")', {"grade": True}), cell("f()"), nbformat.v4.new_markdown_cell("YOUR ANSWER HERE")])
    for c in released.cells[:4]:
        c.outputs, c.execution_count = [], None
    run = nbformat.v4.new_notebook(cells=[
        cell("print(1)", outputs=["1\n"]), cell("def f(): return 42", {"solution": True}, ["secret\n"]),
        cell('check("x")', {"grade": True}, ["✓ x\n"]), cell("f()", outputs=["42\n"]),
        nbformat.v4.new_markdown_cell("the model answer")])
    book = make_book.redact(released, run)
    assert [c.source for c in book.cells] == [c.source for c in released.cells]
    assert [len(c.get("outputs", [])) for c in book.cells[:4]] == [1, 0, 0, 1]
    assert book.cells[1].execution_count is None
    assert make_book.stale_cells(released, run) == []
    run.cells[3].source = "f()  # edited after the run"
    assert make_book.stale_cells(released, run) == [3] and not make_book.redact(released, run).cells[3].outputs
    with pytest.raises(ValueError):
        make_book.redact(released, nbformat.v4.new_notebook(cells=run.cells[:3]))


def _page(html: Path, rel: Path) -> str:
    page = html / rel.with_suffix(".html")
    assert page.is_file(), f"no page for {rel}"
    return page.read_text()


def _figures(nb) -> int:
    return sum(1 for c in nb.cells for o in c.get("outputs", [])
               if any(k.startswith("image/") for k in o.get("data", {})))


def test_every_lesson_has_a_page_with_outputs_and_figures(html):
    assert (html / "index.html").is_file()
    figures = 0
    for rel in LESSONS:
        page = _page(html, rel)
        assert _plain(_title(rel)) in _plain(unescape(page)), f"{rel}: the page does not carry the lesson's title"
        assert "cell_output" in page, f"{rel}: no executed output on the page"
        assert "YOUR CODE HERE" in page or "YOUR ANSWER HERE" in page, f"{rel}: exercise stubs are missing"
        images = re.findall(r'<img[^>]+src="([^"]*_images/[^"]+)"', page)
        for src in images:
            assert (html / rel.parent / src).resolve().is_file(), f"{rel}: image {src} is missing"
        shown = _figures(read(html.parent.parent / rel))  # the book's copy of the lesson
        assert len(images) == shown, f"{rel}: {shown} figures in the run's outputs, {len(images)} on the page"
        figures += len(images)
    setup = _page(html, LESSONS[0])
    assert "device:" in setup, "the setup cell's output (versions, device, smoke run) is not on the page"
    assert figures, "no rendered figure in any lesson"
    assert re.search(r'<img[^>]+src="[^"]*_images/[^"]+\.png"', _page(html, LESSONS[0])), \
        "lesson 1's plots are not on its page"


class _Text(HTMLParser):
    """The text a reader sees, with the line breaks of code blocks kept."""

    def __init__(self):
        super().__init__()
        self.parts, self._skip = [], 0

    def handle_starttag(self, tag, attrs):
        if tag in ("script", "style"):
            self._skip += 1

    def handle_endtag(self, tag):
        if tag in ("script", "style") and self._skip:
            self._skip -= 1

    def handle_data(self, data):
        if not self._skip:
            self.parts.append(data)


def _site_text(path: Path) -> str | None:
    if path.suffix == ".html":
        parser = _Text()
        parser.feed(path.read_text(errors="replace"))
        return "".join(parser.parts) + "\n" + path.read_text(errors="replace")
    if path.suffix == ".ipynb":
        nb = nbformat.read(path, as_version=4)
        outputs = [o.get("text", "") or str(o.get("data", {}).get("text/plain", ""))
                   for c in nb.cells for o in c.get("outputs", [])]
        return "\n".join([c.source for c in nb.cells] + outputs)
    if path.suffix in (".js", ".txt", ".md", ".json", ".py", ".yml", ".css", ".svg", ".xml"):
        return path.read_text(errors="replace")
    return None


def _packaged_assets() -> set[bytes]:
    """Digests of the script and style files that installed packages ship (the book's theme and its
    extensions). A site file byte-equal to one of them came from a package, not from this course, so it
    cannot carry a hidden line; a hidden helper's name that happens to be a word in it is no leak."""
    import sysconfig
    site = Path(sysconfig.get_paths()["purelib"])
    return {hashlib.sha256(f.read_bytes()).digest() for suffix in ("*.js", "*.css")
            for f in site.rglob(suffix) if f.is_file()}


def test_no_solution_hidden_test_or_answer_in_the_site(html):
    # A lesson's files are checked against its own hidden lines (as in test_release), the rest of the
    # site (home page, search index, theme) against every lesson's, less lines shown openly anywhere.
    hidden = {source.parent.name: _hidden_lines(read(source)) for source in notebooks(SOLUTIONS)}
    assert all(hidden.values()), "the leak check found nothing to look for"
    shown = set().union(*(_lines("\n".join(c.source for c in read(p).cells)) for p in notebooks(COURSE)))
    anywhere = set().union(*hidden.values()) - shown
    names = [n for f in (AUTOGRADERS / "checks").rglob("*.py") for n in re.findall(r"^def (\w+)", f.read_text(), re.M)]
    assert names, "no hidden checks found"
    named = re.compile(r"\b(%s)\b" % "|".join(map(re.escape, names)))
    packaged = _packaged_assets()
    assert packaged, "no installed theme files found to tell the theme's files from the course's"
    checked = 0
    for path in sorted(p for p in html.rglob("*") if p.is_file()):
        text = _site_text(path)
        if text is None:
            continue
        checked += 1
        where = path.relative_to(html)
        from_a_package = path.suffix in (".js", ".css") and hashlib.sha256(path.read_bytes()).digest() in packaged
        for marker in MARKERS:
            assert marker not in text, f"{where}: {marker!r}"
        lesson = next((part for part in where.parts if part in hidden), None)
        leaked = sorted((hidden[lesson] if lesson else anywhere) & _lines(text))
        assert not leaked, f"{where} shows solution or hidden lines: {leaked[:5]}"
        assert from_a_package or not (found := named.search(text)), f"{where} names a hidden check: {found.group(1)}"
        assert "autograders" not in text, f"{where} mentions autograders/"
    assert checked > len(LESSONS)


def test_the_site_opens_in_a_browser_and_navigates_to_a_lesson(html):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    with chrome() as driver, screenshot_on_failure(driver, "site"):
        driver.get((html / "index.html").as_uri())
        WebDriverWait(driver, 30).until(lambda d: d.find_elements(By.CSS_SELECTOR, "nav.bd-docs-nav a"))
        listed = [_plain(a.get_attribute("textContent").strip())
                  for a in driver.find_elements(By.CSS_SELECTOR, "nav.bd-docs-nav a")]
        for rel in LESSONS:
            assert _plain(_title(rel)) in listed, f"the lesson list does not show {_title(rel)!r}: {listed}"
        first = next(a for a in driver.find_elements(By.CSS_SELECTOR, "nav.bd-docs-nav a")
                     if _plain(a.get_attribute("textContent").strip()) == _plain(_title(LESSONS[0])))
        driver.execute_script("arguments[0].click();", first)
        target = LESSONS[0].with_suffix(".html").as_posix()
        WebDriverWait(driver, 30).until(lambda d: d.current_url.endswith(target))
        heading = driver.find_element(By.CSS_SELECTOR, "article h1")
        assert _plain(_title(LESSONS[0])) in _plain(heading.text)
        figure = driver.find_element(By.CSS_SELECTOR, ".cell_output img")
        driver.execute_script("arguments[0].scrollIntoView();", figure)
        WebDriverWait(driver, 30).until(lambda d: d.execute_script(
            "return arguments[0].complete && arguments[0].naturalWidth > 0;", figure))
