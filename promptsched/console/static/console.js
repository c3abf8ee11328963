// promptsched console: confirmation dialogs, relative times kept current, a run's live
// progress, and the live preview of the schedule form. Every page works without this file; it only adds comfort.
// Text from the server is only ever set with textContent, never parsed as HTML.
"use strict";
(function () {
  // A confirmed form says so; without this script the server asks on a page instead.
  document.addEventListener("submit", function (event) {
    var form = event.target;
    if (!(form instanceof HTMLFormElement)) return;
    var question = form.getAttribute("data-confirm");
    if (!question) return;
    if (!window.confirm(question)) {
      event.preventDefault();
      return;
    }
    if (!form.querySelector('input[name="confirmed"]')) {
      var input = document.createElement("input");
      input.type = "hidden";
      input.name = "confirmed";
      input.value = "1";
      form.appendChild(input);
    }
  });

  // Relative times ("in 3 h"), measured against the server's clock, not this machine's.
  var serverNow = Date.parse(document.body.getAttribute("data-now") || "");
  var offset = isNaN(serverNow) ? 0 : serverNow - Date.now();

  function relative(ms) {
    var past = ms < 0;
    var s = Math.abs(ms) / 1000;
    if (s < 1) return "just now";
    var units = [[86400, "d"], [3600, "h"], [60, "min"], [1, "s"]];
    for (var i = 0; i < units.length; i++) {
      if (s >= units[i][0]) {
        var text = Math.floor(s / units[i][0]) + " " + units[i][1];
        return past ? text + " ago" : "in " + text;
      }
    }
    return "just now";
  }

  function refreshRelative() {
    var now = Date.now() + offset;
    document.querySelectorAll("[data-rel]").forEach(function (el) {
      var at = Date.parse(el.getAttribute("data-rel"));
      if (!isNaN(at)) el.textContent = relative(at - now);
    });
  }
  setInterval(refreshRelative, 10000);

  // A running run's page: its steps as they happen, from the run's event stream; once the
  // run is final the page reloads to show the output and the transcript.
  var live = document.getElementById("live");
  if (live && window.EventSource) {
    var steps = document.getElementById("live-steps");
    var state = document.getElementById("live-state");
    var source = new EventSource(live.getAttribute("data-events"));
    var seen = 0;
    // Steps the page was rendered with: an event for one of them is not shown twice.
    var shown = {};
    steps.querySelectorAll("li[data-key]").forEach(function (li) {
      var key = li.getAttribute("data-key");
      shown[key] = (shown[key] || 0) + 1;
    });
    source.addEventListener("progress", function (event) {
      var data = JSON.parse(event.data);
      var key = data.attempt + ":" + data.step + ":" + data.kind;
      if (shown[key]) {
        shown[key] -= 1;
        return;
      }
      var item = document.createElement("li");
      item.setAttribute("data-key", key);
      item.className = "live-step";
      var kind = document.createElement("span");
      kind.className = "badge kind";
      kind.textContent = data.kind || "step";
      var where = document.createElement("span");
      where.className = "muted";
      var of = data.max_steps ? "/" + data.max_steps : "";
      where.textContent = " step " + data.step + of +
        (data.tokens ? " · " + data.tokens + " tokens" : "");
      var said = document.createElement("div");
      said.className = "step-text";
      said.textContent = data.text || "";
      item.appendChild(kind);
      item.appendChild(where);
      item.appendChild(said);
      steps.appendChild(item);
      seen += 1;
      state.textContent = seen + (seen === 1 ? " step" : " steps") + " so far, live.";
      live.setAttribute("data-steps", String(seen));
    });
    source.addEventListener("open", function () { window.__liveOpen = true; });
    source.addEventListener("gap", function () {
      var item = document.createElement("li");
      item.className = "muted";
      item.textContent = "(the stream reconnected: some steps may be missing here; the " +
        "transcript keeps them all)";
      steps.appendChild(item);
    });
    source.addEventListener("done", function (event) {
      source.close();
      var data = JSON.parse(event.data);
      state.textContent = "The run is " + data.status + "; loading its result…";
      live.setAttribute("data-done", data.status);
      setTimeout(function () { window.location.reload(); }, 1000);
    });
  }

  // The schedule form: the next fire times as you type, from the server's own code path.
  var form = document.getElementById("schedule-form");
  if (!form) return;
  var words = document.getElementById("preview-words");
  var list = document.getElementById("preview-list");
  var error = document.getElementById("preview-error");
  var timer = null;
  var latest = 0;

  function showError(text) {
    error.textContent = text;
    error.hidden = false;
  }

  function render(data) {
    list.textContent = "";
    if (data.error) {
      words.textContent = "";
      showError(data.error.field + ": " + data.error.message);
      return;
    }
    error.hidden = true;
    words.textContent = data.description;
    data.fire_times.forEach(function (t) {
      var item = document.createElement("li");
      var time = document.createElement("time");
      time.setAttribute("datetime", t.iso);
      time.title = t.utc;
      time.textContent = t.local;
      var rel = document.createElement("span");
      rel.className = "rel";
      rel.setAttribute("data-rel", t.iso);
      rel.textContent = t.relative;
      item.appendChild(time);
      item.appendChild(document.createTextNode(" "));
      item.appendChild(rel);
      list.appendChild(item);
    });
    if (!data.fire_times.length) showError("It never fires after now.");
  }

  function update() {
    var expression = form.elements.namedItem("expression").value;
    if (!expression.trim()) {
      list.textContent = "";
      words.textContent = "Type a schedule to see its next fire times.";
      error.hidden = true;
      return;
    }
    var query = new URLSearchParams({
      expression: expression,
      timezone: form.elements.namedItem("timezone").value || "UTC",
      kind: form.elements.namedItem("kind").value,
    });
    var mine = ++latest;
    fetch("/preview?" + query.toString(), {
      credentials: "same-origin",
      headers: { Accept: "application/json" },
    })
      .then(function (response) { return response.json(); })
      .then(function (data) { if (mine === latest) render(data); })
      .catch(function () { if (mine === latest) showError("preview unavailable"); });
  }

  function later() {
    clearTimeout(timer);
    timer = setTimeout(update, 250);
  }

  ["expression", "timezone", "kind"].forEach(function (name) {
    var field = form.elements.namedItem(name);
    field.addEventListener("input", later);
    field.addEventListener("change", later);
  });
  form.setAttribute("data-live-preview", "on");

  // The output schema and the notify condition, checked as you type by the save-time checks.
  var schema = form.elements.namedItem("output_schema");
  var check = document.getElementById("schema-check");
  if (!schema || !check) return;
  var checkTimer = null;
  var checkLatest = 0;

  function showCheck(data) {
    check.hidden = false;
    check.textContent = data.ok ? data.message : data.field + ": " + data.message;
    check.className = "schema-check " + (data.ok ? "ok" : "bad");
  }

  function runCheck() {
    var body = new URLSearchParams({
      csrf: form.elements.namedItem("csrf").value,
      output_schema: schema.value,
      notify_when: form.elements.namedItem("notify_when").value,
    });
    var mine = ++checkLatest;
    fetch("/schema-check", {
      method: "POST",
      credentials: "same-origin",
      headers: { Accept: "application/json" },
      body: body,
    })
      .then(function (response) { return response.json(); })
      .then(function (data) { if (mine === checkLatest) showCheck(data); })
      .catch(function () { if (mine === checkLatest) check.hidden = true; });
  }

  function checkLater() {
    clearTimeout(checkTimer);
    checkTimer = setTimeout(runCheck, 250);
  }

  [schema, form.elements.namedItem("notify_when")].forEach(function (field) {
    field.addEventListener("input", checkLater);
    field.addEventListener("change", checkLater);
  });
  form.setAttribute("data-live-schema", "on");
  if (schema.value.trim()) runCheck();
})();
