"""Every jobbers admin page, found from the admin's own URL patterns (so a page someone adds
is checked without anyone listing it), and what the browser tests check on each: it fits
the window beside Django's open sidebar (no sideways scroll of the page), every action
button can be seen (not off-screen, not clipped by a scrolling box), and axe-core finds no
serious or critical violation."""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import ROOT

#: axe-core's browser build: scripts/test installs it (scripts/_axe.sh) and says where.
AXE_JS = Path(os.environ.get("JOBBERS_AXE_JS")
              or ROOT / ".cache" / "axe" / "node_modules" / "axe-core" / "axe.min.js")
#: What no page may have: axe's two worst impacts.
BLOCKING = ("serious", "critical")
#: What a visible button is: a button, a submit, a link drawn as a button, an object tool.
BUTTONS = ("button, input[type=submit], input[type=button], a.button, .object-tools a, "
           "a[role=button]")


@dataclass(frozen=True)
class Page:
    name: str  # the URL's name, without ``admin:``
    path: str


def axe_source() -> str:
    if not AXE_JS.is_file():
        pytest.fail(f"axe-core not found at {AXE_JS}: scripts/test installs it (npm install "
                    "--prefix .cache/axe axe-core@4, see scripts/_axe.sh); set JOBBERS_AXE_JS "
                    "to another copy", pytrace=False)
    return AXE_JS.read_text()


def _patterns(resolvers: Any, prefix: str = "") -> Iterator[tuple[str, Any]]:
    from django.urls import URLResolver

    for entry in resolvers:
        if isinstance(entry, URLResolver):
            yield from _patterns(entry.url_patterns, prefix + str(entry.pattern))
        else:
            yield prefix + str(entry.pattern), entry


def jobbers_pages(values: dict[str, Callable[[str], str | None]]) -> tuple[list[Page], list[str]]:
    """Every page of the jobbers admin (the app's index too) with its arguments filled in
    from ``values`` (by the argument's name; called with the URL's name). Returns the pages
    and, for any URL whose argument has no value, a line saying so (the test fails on it:
    a new page needs its object in the fixtures)."""
    from django.contrib import admin
    from django.urls import reverse

    pages = [Page("app_list", reverse("admin:app_list", args=["jobbers"]))]
    missing = []
    for route, pattern in _patterns(admin.site.get_urls()):
        name = pattern.name or ""
        if not name.startswith("jobbers_"):
            continue
        kwargs = {}
        for arg in pattern.pattern.converters:
            value = values[arg](name) if arg in values else None
            if value is None:
                missing.append(f"{name} ({route}): no value for <{arg}>")
                break
            kwargs[arg] = value
        else:
            pages.append(Page(name, reverse(f"admin:{name}", kwargs=kwargs)))
    return pages, missing


# --------------------------------------------------------------------- in the browser
FITS_JS = """
var doc = document.documentElement, out = [];
if (doc.scrollWidth > doc.clientWidth) {
  out.push('the page scrolls sideways: scrollWidth ' + doc.scrollWidth + ' > clientWidth '
           + doc.clientWidth);
}
function clipped(el, r) {
  for (var p = el.parentElement; p && p !== doc; p = p.parentElement) {
    var s = getComputedStyle(p);
    if (s.overflowX === 'visible' && s.overflowY === 'visible') continue;
    var b = p.getBoundingClientRect();
    if (r.left < b.left - 1 || r.right > b.right + 1) return p;
  }
  return null;
}
document.querySelectorAll(arguments[0]).forEach(function (el) {
  var s = getComputedStyle(el), r = el.getBoundingClientRect();
  if (s.display === 'none' || s.visibility === 'hidden' || el.closest('[hidden]')
      || r.width === 0 || r.height === 0) return;  // not shown on purpose (a closed menu)
  var what = (el.innerText || el.value || el.getAttribute('aria-label') || el.id
              || el.outerHTML.slice(0, 60)).trim().replace(/\\s+/g, ' ').slice(0, 40);
  if (r.left < 0 || r.right > doc.clientWidth + 1) {
    out.push('button "' + what + '" is off-screen (' + Math.round(r.left) + '..'
             + Math.round(r.right) + ' of ' + doc.clientWidth + ')');
    return;
  }
  var box = clipped(el, r);
  if (box) {
    out.push('button "' + what + '" is hidden in a scrolling box ('
             + (box.id || box.className || box.tagName) + ')');
  }
});
return out;
"""

AXE_JS_RUN = """
var done = arguments[arguments.length - 1];
axe.run(document, {resultTypes: ['violations']}).then(function (r) {
  done(r.violations.map(function (v) {
    return {id: v.id, impact: v.impact, help: v.help, nodes: v.nodes.length,
            targets: v.nodes.slice(0, 3).map(function (n) { return n.target.join(' '); })};
  }));
}, function (e) { done([{id: 'axe-error', impact: 'critical', help: String(e), nodes: 0,
                         targets: []}]); });
"""


#: A time in any format but the one (core/timefmt.py: ``2026-11-27 21:33:05 UTC``): Django's
#: DATETIME_FORMAT (``Nov. 27, 2026, 9:33 p.m.``), a clock without its zone, an offset.
OTHER_TIME = re.compile(r"\b(?:Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec)[a-z]*\.? \d{1,2}, "
                        r"\d{4}|\b[ap]\.m\.|\bmidnight\b|\bnoon\b"
                        r"|(?<![\d:])\d\d:\d\d:\d\d(?![\d.]|[ \u00a0]UTC)")


def other_time_formats(driver: Any) -> list[str]:
    """Times on the page (its content, not Django's header) in another format than the one."""
    text = str(driver.execute_script(
        "var c = document.getElementById('content'); return c ? c.innerText : ''"))
    return sorted({m.group(0) for m in OTHER_TIME.finditer(text)})


def fit_problems(driver: Any) -> list[str]:
    return list(driver.execute_script(FITS_JS, BUTTONS))


def axe_violations(driver: Any, source: str) -> list[dict[str, Any]]:
    if not driver.execute_script("return typeof axe !== 'undefined'"):
        driver.execute_script(source)
    driver.set_script_timeout(300)
    return list(driver.execute_async_script(AXE_JS_RUN))


def sidebar_open(driver: Any) -> bool:
    """Django's navigation sidebar is there and open (the pages without one: the index)."""
    return bool(driver.execute_script(
        "var s = document.getElementById('nav-sidebar');"
        "return !s || (s.offsetWidth > 0 && document.getElementById('main')"
        ".classList.contains('shifted'))"))


def write_report(path: Path, report: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=2, sort_keys=True))
