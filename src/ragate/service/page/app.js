// The page of `ragate serve` (docs/service.md, "The web page"). Plain JavaScript, no library, no build step.
// Every text that comes from the service (questions, answers, passages, file names, messages) is shown through
// textContent or as a text node: nothing it sends is ever parsed as HTML.
"use strict";

(() => {
  const $ = (id) => document.getElementById(id);
  const SVG = "http://www.w3.org/2000/svg";
  const BUDGET_POLL_MS = 2000;
  let served = null; // what /healthz says
  let budgetTimer = null;
  let budgetOff = false;

  // -- small helpers ------------------------------------------------------------------------------------------
  // Bidirectional controls in untrusted text (an answer, a passage, a title) would reorder what follows them on the
  // page (a right-to-left override reverses the rest of the line): each is shown as its name instead.
  const BIDI = /[\u202A-\u202E\u2066-\u2069\u200E\u200F\u061C]/g;
  const BIDI_NAMES = {
    "\u202A": "LRE", "\u202B": "RLE", "\u202C": "PDF", "\u202D": "LRO", "\u202E": "RLO", "\u2066": "LRI",
    "\u2067": "RLI", "\u2068": "FSI", "\u2069": "PDI", "\u200E": "LRM", "\u200F": "RLM", "\u061C": "ALM",
  };
  const visible = (text) => text.replace(BIDI, (c) => `⟨${BIDI_NAMES[c]}⟩`);

  function el(tag, cls, ...children) {
    const node = document.createElement(tag);
    if (cls) node.className = cls;
    for (const child of children) {
      if (child === null || child === undefined) continue;
      node.append(typeof child === "string" ? visible(child) : child); // a string becomes a text node
    }
    return node;
  }

  function svg(tag, attrs) {
    const node = document.createElementNS(SVG, tag);
    for (const [name, value] of Object.entries(attrs)) node.setAttribute(name, String(value));
    return node;
  }

  function num(value, digits = 4) {
    if (typeof value !== "number" || !Number.isFinite(value)) return "–";
    return Number(value.toPrecision(digits)).toString();
  }

  class ApiError extends Error {
    constructor(status, type, message) {
      super(message);
      this.status = status;
      this.type = type;
    }
    toString() {
      return this.status ? `${this.status} ${this.type}: ${this.message}` : this.message;
    }
  }

  function headers(json) {
    const out = {};
    if (json) out["Content-Type"] = "application/json";
    const key = $("key").value.trim();
    if (key) out["Authorization"] = `Bearer ${key}`;
    return out;
  }

  // One call to the service (paths are relative: the page works behind a path prefix too).
  async function api(path, body) {
    let response;
    try {
      response = await fetch(path, {
        method: body === undefined ? "GET" : "POST",
        headers: headers(body !== undefined),
        body: body === undefined ? undefined : JSON.stringify(body),
        cache: "no-store",
        credentials: "omit",
      });
    } catch (err) {
      throw new ApiError(0, "network", `the service could not be reached (${err.message})`);
    }
    let data = null;
    try {
      data = await response.json();
    } catch (_) {
      data = null;
    }
    if (!response.ok) {
      const error = data && data.error ? data.error : { type: "error", message: response.statusText };
      const retry = response.headers.get("Retry-After");
      const message = retry ? `${error.message} (Retry-After: ${retry} s)` : error.message;
      throw new ApiError(response.status, error.type || "error", message || "the service refused the request");
    }
    return data;
  }

  function showError(err) {
    const box = $("error");
    box.textContent = err ? visible(String(err)) : "";
    box.hidden = !err;
  }

  // -- what is served, and which methods ----------------------------------------------------------------------
  async function loadServed() {
    try {
      const response = await fetch("healthz", { headers: headers(false), cache: "no-store", credentials: "omit" });
      served = await response.json();
      const parts = [
        `method ${served.method}` + (typeof served.threshold === "number" ? `, τ ${num(served.threshold)}` : ""),
        `model ${served.model} (${served.engine})`,
        `index ${served.index} (${served.passages} passages)`,
        `ragate ${served.version}`,
      ];
      if (served.status !== "ok") parts.push(`status ${served.status}`);
      $("served").textContent = visible(parts.join(" · "));
      if (served.method_description) $("served").append(el("br"), `${served.method}: ${served.method_description}`);
      if (served.fallback) $("served").append(el("br"), served.fallback);
    } catch (err) {
      $("served").textContent = `the service did not answer /healthz (${err.message})`;
    }
  }

  function shortLine(text) {
    return text.length > 70 ? `${text.slice(0, 69)}…` : text;
  }

  function fillSelect(select, groups, first) {
    const keep = select.value;
    select.replaceChildren();
    if (first) select.append(first);
    for (const group of groups) {
      const box = el("optgroup");
      box.label = group.group;
      for (const m of group.methods) {
        const option = el("option", null, m.description ? `${m.name} — ${shortLine(m.description)}` : m.name);
        option.value = m.name;
        option.title = m.description || m.name;
        box.append(option);
      }
      if (box.children.length) select.append(box);
    }
    if ([...select.options].some((o) => o.value === keep)) select.value = keep;
  }

  async function loadMethods() {
    const servedName = served ? served.method : "";
    const defaultOption = el("option", null, servedName ? `${servedName} (served)` : "(the server's method)");
    defaultOption.value = "";
    let groups = [];
    try {
      groups = (await api("v1/methods")).groups;
    } catch (err) {
      if (err.status === 401) {
        $("status").textContent = "This server needs an API key: enter it to list its methods and ask.";
      } else {
        showError(err);
      }
    }
    const others = groups.map((g) => ({ ...g, methods: g.methods.filter((m) => m.name !== servedName) }));
    fillSelect($("method"), others, defaultOption);
    const none = el("option", null, "(nothing)");
    none.value = "";
    fillSelect($("compare"), servedName && !servedName.includes(":") ? groups : others, none);
  }

  // -- one answer ---------------------------------------------------------------------------------------------
  function decisionText(data) {
    if (data.retrieved) return "Retrieved: the gate sent the question to the index before answering.";
    return "Answered without retrieval: the gate kept the draft.";
  }

  function scoreBar(gate) {
    const score = gate.score;
    const tau = gate.threshold;
    const finite = [score, tau].filter((v) => typeof v === "number" && Number.isFinite(v));
    const low = Math.min(0, ...finite);
    let high = Math.max(1, ...finite.map((v) => v + Math.abs(v) * 0.1));
    if (high <= low) high = low + 1;
    const at = (v) => `${(Math.min(1, Math.max(0, (v - low) / (high - low))) * 100).toFixed(2)}%`;
    const bar = el("div", "bar");
    const fill = el("div", `fill ${gate.retrieve ? "retrieve" : "skip"}`);
    fill.style.width = typeof score === "number" ? at(score) : "100%";
    bar.append(fill);
    if (typeof tau === "number") {
      const mark = el("div", "tau-mark");
      mark.style.left = at(tau);
      mark.title = `τ = ${tau}`;
      bar.append(mark);
    }
    bar.title = `score ${score} against τ ${tau} (scale ${num(low)} to ${num(high)})`;
    const scoreValue = el("strong", "score-value", num(score));
    scoreValue.dataset.value = String(score);
    const tauValue = el("strong", "tau-value", num(tau));
    tauValue.dataset.value = String(tau);
    const sign = gate.retrieve ? ">" : "≤";
    const numbers = el("p", "gate-numbers", "score ", scoreValue, ` ${sign} τ `, tauValue);
    return el("div", "gate", bar, numbers);
  }

  function shownToken(text) {
    return text.replace(/\n/g, "↵");
  }

  function tokens(draft) {
    if (!draft) return el("p", "muted", "This method's gate read no draft before deciding.");
    if (!draft.tokens.length) return el("p", "muted", "The backend returned no per-token output for the draft.");
    const values = draft.tokens.map((t) => (typeof t.u === "number" ? t.u : 0));
    const scale = typeof draft.scale === "number" && draft.scale > 0 ? draft.scale : Math.max(1e-9, ...values);
    const row = el("p", "tokens");
    draft.tokens.forEach((t, i) => {
      const cell = el("span", i < draft.scored ? "tok" : "tok unscored", shownToken(t.text));
      const f = Math.min(1, Math.max(0, (typeof t.u === "number" ? t.u : 0) / scale));
      cell.style.backgroundColor = `hsl(${Math.round(120 * (1 - f))}, 70%, ${Math.round(86 - 16 * f)}%)`;
      cell.dataset.u = String(t.u);
      const lines = [
        `${draft.measure} = ${num(t.u)}`,
        `log p = ${num(t.logprob)} (p = ${num(Math.exp(t.logprob), 3)})`,
      ];
      if (t.runner_up) lines.push(`runner-up ${JSON.stringify(t.runner_up.text)} log p ${num(t.runner_up.logprob)}`);
      if (i >= draft.scored) lines.push("(not read by the score)");
      cell.title = lines.join("\n");
      row.append(cell);
    });
    let scored = draft.scored
      ? `the score reads the first ${draft.scored} of the ${draft.tokens.length} tokens`
      : "the score reads no single token";
    if (draft.scored && draft.divisor && draft.divisor !== draft.scored) {
      scored += ` and divides their sum by k = ${draft.divisor}`;
    }
    const legend = el(
      "p",
      "legend muted",
      `Coloured by ${draft.measure} (green: sure, red: unsure; hover a token for its value); ${scored}.`,
    );
    return el("div", "draft", legend, row);
  }

  function table(head, rows, cls) {
    const thead = el("thead", null, el("tr", null, ...head.map((h) => el("th", null, h))));
    const tbody = el("tbody");
    for (const cells of rows) tbody.append(el("tr", null, ...cells.map((c) => el("td", null, c))));
    return el("table", cls, thead, tbody);
  }

  // A passage that holds HTML is shown as its text: the tags cut out as a string (never parsed into a document,
  // so nothing of it runs, loads or enters the page as markup), with the markup itself one click away, as text.
  const ENTITIES = { amp: "&", lt: "<", gt: ">", quot: '"', "#39": "'", nbsp: " " };

  function passageText(text) {
    if (!/<\/?[a-zA-Z][^>]*>/.test(text)) return null;
    return text
      .replace(/<(script|style|template)\b[\s\S]*?<\/\1\s*>/gi, "")
      .replace(/<(br|\/p|\/div|\/li|\/h[1-6]|\/tr)\b[^>]*>/gi, "\n")
      .replace(/<[^>]*>/g, "")
      .replace(/&(amp|lt|gt|quot|#39|nbsp);/g, (_, name) => ENTITIES[name])
      .replace(/\n{3,}/g, "\n\n")
      .trim();
  }

  function passageNodes(text) {
    const shown = passageText(text);
    if (shown === null) return [el("p", "passage", text)];
    const raw = el("details", "raw", el("summary", "muted", "as indexed, with its markup"), el("pre", "passage-raw", text));
    return [el("p", "passage", shown), raw];
  }

  function documents(docs) {
    if (!docs.length) return el("p", "muted", "No documents read.");
    const rows = docs.map((d) => {
      const passage = el("details", null, el("summary", "doc-title", d.title || d.id), ...passageNodes(d.text));
      return [String(d.rank), passage, el("span", "doc-source", d.source || "–"), num(d.score, 3)];
    });
    return table(["#", "title (open for the passage)", "source", "score"], rows, "docs");
  }

  function stages(data) {
    const rows = data.trace.stages.map((s) => [
      s.name,
      `${s.seconds.toFixed(2)} s`,
      String(s.prompt_tokens),
      String(s.completion_tokens),
      s.overhead ? "overhead (not reused)" : "",
    ]);
    const t = data.timings;
    rows.push([
      "total",
      `${t.total_seconds.toFixed(2)} s`,
      String(data.usage.prompt_tokens),
      String(data.usage.completion_tokens),
      t.queue_seconds >= 0.01 ? `${t.queue_seconds.toFixed(2)} s waiting for the model` : "",
    ]);
    return table(["stage", "time", "prompt tokens", "generated", ""], rows, "stages");
  }

  function savingsNote(data) {
    const s = data.savings;
    if (!s || !s.saved) return el("p", "muted", "Against always retrieving: not known yet.");
    const { tokens, seconds } = s.saved;
    const said =
      tokens >= 0
        ? `${tokens} tokens and ${num(seconds, 3)} s saved`
        : `the gate cost ${-tokens} tokens and ${num(-seconds, 3)} s more (its draft was not reused)`;
    return el("p", "muted", `Against always retrieving (${s.how}): ${said}.`);
  }

  function column(method) {
    const col = el("article", "result", el("h2", null, method || (served ? served.method : "served method")));
    col.append(el("p", "muted pending", "asking…"));
    return col;
  }

  function options() {
    const out = {};
    const maxTokens = $("max-tokens").value.trim();
    const k = $("k").value.trim();
    const threshold = $("threshold").value.trim();
    if (maxTokens) out.max_tokens = Number.parseInt(maxTokens, 10);
    if (k) out.k = Number.parseInt(k, 10);
    if (threshold) out.threshold = Number.parseFloat(threshold);
    return out;
  }

  function fill(col, data) {
    col.replaceChildren(el("h2", null, data.method));
    const decision = el("p", `decision ${data.decision}`, decisionText(data));
    decision.dataset.decision = data.decision;
    const exact = el("details", "exact", el("summary", "muted", "the gate's own words"), el("p", "reason", data.gate.reason));
    col.append(
      el("p", "answer", data.answer),
      decision,
      el("p", "summary", data.gate.summary ? `Why: ${data.gate.summary}.` : ""),
      exact,
      scoreBar(data.gate),
    );
    if (data.budget && data.controlled) {
      const knob = data.budget.threshold_name === "lambda" ? "λ (the price of a retrieval)" : "τ";
      const target = data.budget.unit || "rate";
      col.append(el("p", "muted", `${knob} was set by the budget controller (target ${target} ${data.budget.budget}).`));
    }
    col.append(el("h3", null, "Draft"), tokens(data.draft));
    col.append(el("h3", null, "Documents read"), documents(data.documents));
    col.append(el("h3", null, "Cost"), stages(data), savingsNote(data));
  }

  function failed(col, err) {
    const h = col.querySelector("h2");
    col.replaceChildren(h, el("p", "error", String(err)));
  }

  async function ask(event) {
    event.preventDefault();
    const question = $("question").value.trim();
    if (!question) return;
    showError(null);
    const opts = options();
    const methods = [$("method").value || null];
    if ($("compare").value) methods.push($("compare").value);
    const columns = methods.map(column);
    $("results").replaceChildren(...columns);
    $("results").classList.toggle("compare", methods.length > 1);
    $("ask-button").disabled = true;
    $("status").textContent = methods.length > 1 ? "asking both methods…" : "asking…";
    const started = performance.now();
    let answered = 0;
    await Promise.all(
      methods.map((method, i) =>
        api("v1/answer", { question, method, options: opts, draft_tokens: true })
          .then((data) => {
            fill(columns[i], { ...data, controlled: !method && opts.threshold === undefined });
            answered += 1;
          })
          .catch((err) => failed(columns[i], err)),
      ),
    );
    $("ask-button").disabled = false;
    const took = `${((performance.now() - started) / 1000).toFixed(1)} s`;
    $("status").textContent =
      answered === methods.length
        ? `answered in ${took}`
        : answered
          ? `one method answered, one failed (${took})`
          : "no answer: the error is shown below the question";
    pollBudget();
  }

  // -- the budget panel ---------------------------------------------------------------------------------------
  function chart(node, series, low, high, extra) {
    node.replaceChildren();
    const w = 360;
    const h = 130;
    const pad = 40;
    const n = Math.max(2, series.length);
    const x = (i) => pad + ((w - pad - 6) * i) / (n - 1);
    const y = (v) => h - 18 - ((h - 26) * (v - low)) / (high - low || 1);
    node.append(svg("line", { x1: pad, y1: y(low), x2: w - 6, y2: y(low), class: "axis" }));
    node.append(svg("line", { x1: pad, y1: y(low), x2: pad, y2: y(high), class: "axis" }));
    for (const v of [low, high]) {
      const label = svg("text", { x: pad - 4, y: y(v) + 4, class: "tick", "text-anchor": "end" });
      label.textContent = num(v, 3);
      node.append(label);
    }
    const caption = svg("text", { x: w - 6, y: h - 4, class: "tick", "text-anchor": "end" });
    caption.textContent = `last ${series.length} requests`;
    node.append(caption);
    if (extra) extra(node, x, y);
    const points = series
      .map((v, i) => (typeof v === "number" ? `${x(i).toFixed(1)},${y(v).toFixed(1)}` : null))
      .filter(Boolean);
    if (points.length) node.append(svg("polyline", { points: points.join(" "), class: "series" }));
  }

  function drawBudget(b) {
    $("budget").hidden = false;
    const rate = $("budget-rate");
    rate.textContent = typeof b.window_rate === "number" ? b.window_rate.toFixed(3) : "–";
    rate.dataset.value = String(b.window_rate);
    const route = b.threshold_name === "lambda"; // a learned route policy's budget: mean retrievals, lambda
    $("budget-rate-name").textContent = route ? "realised mean retrievals" : "realised rate";
    $("budget-tau-name").textContent = route ? "λ now" : "τ now";
    if (route) {
      $("budget-rate-caption").textContent =
        "the mean retrievals per request over the last requests (the window), after each request; dashed: the target";
      $("budget-tau-caption").textContent = "λ, the learned route policy's price of one retrieval, after each request";
    }
    $("budget-count").textContent =
      `(${b.window_retrieved} of the last ${b.window_requests} requests retrieved; window ${b.window})`;
    $("budget-target").textContent = String(b.budget);
    const tau = $("budget-tau");
    tau.textContent = num(b.tau);
    tau.dataset.value = String(b.tau);
    const history = b.history || [];
    const rateHigh = typeof b.rate_high === "number" ? b.rate_high : 1;
    chart($("budget-rate-chart"), history.map((p) => p.rate), 0, rateHigh, (node, x, y) => {
      node.append(svg("line", { x1: x(0), y1: y(b.budget), x2: 354, y2: y(b.budget), class: "target" }));
    });
    const values = history.flatMap((p) => [p.tau, p.score]).filter((v) => typeof v === "number");
    values.push(b.tau);
    let low = Math.min(...values);
    let high = Math.max(...values);
    if (high - low < 1e-9) {
      low -= 0.5;
      high += 0.5;
    }
    chart($("budget-tau-chart"), history.map((p) => p.tau), low, high, (node, x, y) => {
      history.forEach((p, i) => {
        if (typeof p.score !== "number") return;
        node.append(svg("circle", { cx: x(i), cy: y(p.score), r: 2.5, class: p.retrieved ? "dot retrieved" : "dot" }));
      });
    });
    const note = [`method ${b.method}`, `gain ${b.gain}`, `${b.observed} requests observed since start`];
    if (b.state_write_error) note.push(`the state could not be written: ${b.state_write_error}`);
    $("budget-note").textContent = note.join(" · ");
  }

  async function pollBudget() {
    clearTimeout(budgetTimer);
    if (budgetOff) return;
    try {
      const b = await api("v1/budget");
      if (!b.enabled) {
        budgetOff = true;
        $("budget").hidden = true;
        return;
      }
      drawBudget(b);
    } catch (err) {
      if (err.status !== 401) $("budget-note").textContent = `the budget could not be read: ${err}`;
    }
    budgetTimer = setTimeout(pollBudget, BUDGET_POLL_MS);
  }

  // -- start --------------------------------------------------------------------------------------------------
  async function start() {
    $("ask").addEventListener("submit", ask);
    $("question").addEventListener("keydown", (event) => {
      if (event.key === "Enter" && (event.ctrlKey || event.metaKey)) $("ask").requestSubmit();
    });
    $("key").addEventListener("change", async () => {
      $("status").textContent = "";
      await loadServed();
      await loadMethods();
      pollBudget();
    });
    await loadServed();
    await loadMethods();
    pollBudget();
    document.body.dataset.ready = "true";
  }

  document.addEventListener("DOMContentLoaded", start);
})();
