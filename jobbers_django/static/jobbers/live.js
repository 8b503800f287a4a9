// The live page refreshes itself: every few seconds it fetches the same page and swaps
// in its content (no full reload: the scroll position stays, the checkbox pauses it, and a
// hidden tab does not poll). Without JavaScript the page is simply static.
(function () {
  "use strict";
  function start() {
    var main = document.getElementById("content-main");
    var box = document.getElementById("jobbers-refresh-on");
    if (!main || !box) { return; }
    var seconds = parseInt(main.getAttribute("data-refresh-seconds"), 10) || 5;
    var busy = false;
    function refresh() {
      if (busy || !box.checked || document.hidden) { return; }
      busy = true;
      fetch(window.location.href, {credentials: "same-origin", headers: {"X-Requested-With": "fetch"}})
        .then(function (response) { return response.ok ? response.text() : null; })
        .then(function (html) {
          if (!html) { return; }
          var fresh = new DOMParser().parseFromString(html, "text/html").getElementById("jobbers-live");
          var live = document.getElementById("jobbers-live");
          if (fresh && live) {
            live.replaceWith(fresh);
            document.body.setAttribute("data-refreshed-at", String(Date.now()));
          }
        })
        .catch(function () { /* keep the last content; try again next time */ })
        .then(function () { busy = false; });
    }
    window.setInterval(refresh, seconds * 1000);
  }
  if (document.readyState === "loading") {
    document.addEventListener("DOMContentLoaded", start);
  } else {
    start();
  }
}());
