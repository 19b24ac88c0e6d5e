// relayd's console without a full reload: every refresh interval, fetch the
// page's main element and put it in place; nothing while the tab is hidden.
// Without JavaScript the page refreshes itself by its meta tag.
(function () {
  "use strict";
  var main = document.getElementById("console");
  var every = main && Number(main.dataset.refresh);
  if (!every) {
    return;
  }
  var timer = null;
  function schedule() {
    clearTimeout(timer);
    timer = setTimeout(refresh, every * 1000);
  }
  function refresh() {
    if (document.hidden) {
      return;
    }
    fetch(location.pathname + "?part=main", { cache: "no-store" })
      .then(function (r) {
        if (!r.ok) {
          throw new Error("HTTP " + r.status);
        }
        return r.text();
      })
      .then(function (html) {
        var doc = new DOMParser().parseFromString(html, "text/html");
        var fresh = doc.getElementById("console");
        var now = document.getElementById("console");
        if (fresh && now) {
          // Keep what the reader opened.
          var open = now.querySelector("details[open]") !== null;
          now.replaceWith(fresh);
          if (open) {
            var d = fresh.querySelector("details");
            if (d) {
              d.open = true;
            }
          }
        }
      })
      .catch(function (e) {
        var g = document.getElementById("generated");
        if (g) {
          g.className = "stale";
          g.textContent = "Could not refresh (" + e.message + "): the figures below are stale.";
        }
      })
      .then(schedule);
  }
  document.addEventListener("visibilitychange", function () {
    if (!document.hidden) {
      refresh();
    }
  });
  schedule();
})();
