// senddock dashboard: keeps the progress of campaigns in flight up to date without reloading.
// Optional: without JavaScript the pages refresh themselves (<noscript> meta refresh).
"use strict";
(function () {
  var INTERVAL = 2000;

  function update(root, data) {
    root.querySelectorAll("[data-field]").forEach(function (el) {
      var key = el.getAttribute("data-field");
      if (key === "bar") {
        el.max = Math.max(data.total, 1);
        el.value = data.done;
        el.textContent = data.percent + "%";
      } else if (Object.prototype.hasOwnProperty.call(data, key) && data[key] !== null) {
        el.textContent = String(data[key]);
      }
    });
  }

  // The page's other live parts (charts, bounces, pacing, in doubt): drawn again from the page
  // itself every few refreshes, each replaced whole by its fresh copy.
  var SECTIONS_EVERY = 10;  // 20 s: the page's queries read the whole broadcast's attempts
  function refreshSections() {
    fetch(window.location.href, { credentials: "same-origin" })
      .then(function (answer) { return answer.ok ? answer.text() : null; })
      .then(function (html) {
        if (!html) { return; }
        var fresh = new DOMParser().parseFromString(html, "text/html");
        document.querySelectorAll("[data-live]").forEach(function (old) {
          var replacement = fresh.getElementById(old.id);
          if (!replacement) { return; }
          var opened = Array.prototype.map.call(old.querySelectorAll("details"), function (d) { return d.open; });
          replacement = document.importNode(replacement, true);
          replacement.querySelectorAll("details").forEach(function (d, i) { d.open = !!opened[i]; });
          old.replaceWith(replacement);
        });
      })
      .catch(function () { /* next time */ });
  }

  function follow(root) {
    var url = root.getAttribute("data-progress-url");
    var shown = root.getAttribute("data-status");
    var timer = null;
    if (["finished", "cancelled", "draft"].indexOf(shown) >= 0) { return; }  // nothing moves any more
    var ticks = 0;
    function tick() {
      ticks += 1;
      if (root.id === "progress" && ticks % SECTIONS_EVERY === 0) { refreshSections(); }
      fetch(url, { credentials: "same-origin", headers: { Accept: "application/json" } })
        .then(function (answer) {
          if (answer.status === 401) { window.location.reload(); return null; }  // logged out: the login page
          return answer.ok ? answer.json() : null;
        })
        .then(function (data) {
          if (!data) { return; }
          update(root, data);
          var badge = document.getElementById("status");
          if (badge && root.id === "progress") { badge.textContent = data.status; }
          // A new status changes the page's buttons and notices: draw it again, whole.
          if (data.status !== shown) { window.clearInterval(timer); window.location.reload(); }
        })
        .catch(function () { /* the server is restarting: try again next time */ });
    }
    timer = window.setInterval(tick, INTERVAL);
  }

  document.addEventListener("DOMContentLoaded", function () {
    document.querySelectorAll("[data-progress-url]").forEach(follow);
  });
})();
