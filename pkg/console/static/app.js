// The gauntlet console: pages over /console/api/ (docs/console.md). Routes live in the
// URL's hash: #/ (runs), #/runs/ID (a run), #/runs/ID/faults (its fault heatmap),
// #/episodes/ID?step=N (the replay viewer), #/curricula and #/curricula/ID. Everything is
// built with DOM calls and textContent, so no value read from ClickHouse or Temporal is
// ever parsed as HTML. The one action, signalling a curriculum, sends the env API token
// the user typed (kept in this tab's sessionStorage only).
import uPlot from "./vendor/uPlot.esm.js";

const main = document.getElementById("main");
const crumbs = document.getElementById("crumbs");
const statusEl = document.getElementById("status");

// How often a page refreshes while something it shows is in flight, and the runs list
// otherwise (to find new runs).
const LIVE_MS = 2000;
const IDLE_MS = 10000;

let timer = null;
let generation = 0; // bumped on each navigation; stale refreshes drop their result

// show puts children in place of the page's content, leaving out the null and undefined
// a page passes for a part it does not show (replaceChildren would show them as text).
function show(...children) {
  main.replaceChildren(...children.flat().filter((c) => c !== null && c !== undefined));
}

function el(tag, attrs, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null) continue;
    if (k === "class") e.className = v;
    else if (k === "text") e.textContent = v;
    else if (k.startsWith("on")) e.addEventListener(k.slice(2), v);
    else e.setAttribute(k, v);
  }
  for (const c of children.flat()) {
    if (c === null || c === undefined) continue;
    e.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return e;
}

async function getJSON(path, init) {
  const res = await fetch("api/" + path, { ...init, headers: { Accept: "application/json", ...(init && init.headers) } });
  let body;
  try {
    body = await res.json();
  } catch {
    throw new Error(`${path}: HTTP ${res.status}`);
  }
  if (!res.ok) throw new Error(body.error || `${path}: HTTP ${res.status}`);
  return body;
}

// Number formats, shared by every page so the same figure reads the same everywhere.
export const fmt = {
  pct: (x) => (100 * x).toFixed(1) + "%",
  reward: (x) => x.toFixed(3),
  int: (x) => String(x),
  time: (s) => (s ? s.replace("T", " ").replace("Z", "") : ""),
  // kinds says what failed in a run's or batch's infra errors: "model_endpoint 3,
  // sandbox 1"; "" when there were none. Success rates and mean rewards leave them out.
  kinds: (m) => Object.entries(m || {}).sort(([a], [b]) => (a < b ? -1 : 1)).map(([k, n]) => `${k} ${n}`).join(", "),
};

function setCrumbs(...parts) {
  crumbs.replaceChildren(...parts.flatMap((p, i) => (i ? [" / ", p] : [p])));
}

function showError(err) {
  show(el("p", { class: "error", role: "alert", text: err.message }));
}

function schedule(ms, gen) {
  clearTimeout(timer);
  timer = setTimeout(() => {
    if (gen === generation) route(true);
  }, ms);
}

// --- runs list ---------------------------------------------------------------------

async function runsPage(gen) {
  setCrumbs(el("span", { text: "runs" }));
  const { runs } = await getJSON("runs");
  if (gen !== generation) return;
  const rows = runs.map((r) =>
    el("tr", { "data-run": r.run_id },
      el("td", {}, el("a", { href: `#/runs/${encodeURIComponent(r.run_id)}`, text: r.run_id })),
      el("td", { "data-field": "env", text: r.env }),
      el("td", { class: "num", "data-field": "episodes", text: fmt.int(r.episodes) }),
      el("td", { class: "num muted", "data-field": "planned", text: r.planned === undefined ? "" : "of " + fmt.int(r.planned) }),
      el("td", { class: "num", "data-field": "success_rate", text: fmt.pct(r.success_rate) }),
      el("td", { class: "num", "data-field": "mean_reward", text: fmt.reward(r.mean_reward) }),
      el("td", { class: "num", "data-field": "infra_errors", text: fmt.int(r.infra_errors) }),
      el("td", { class: "muted", "data-field": "infra_by_kind", text: fmt.kinds(r.infra_by_kind) }),
      el("td", { "data-field": "first", text: fmt.time(r.first) }),
      el("td", { "data-field": "last", text: fmt.time(r.last) }),
      el("td", { class: r.live ? "live" : "muted", "data-field": "state", text: stateText(r) })));
  show(
    el("h1", { text: "Runs" }),
    runs.length === 0
      ? el("p", { class: "muted", text: "No episode has ended yet. Start a run with `gauntlet run`." })
      : el("table", { id: "runs" },
        el("thead", {}, el("tr", {},
          ["run", "env"].map((h) => el("th", { text: h })),
          ["episodes ended", "", "success", "mean reward", "infra errors"].map((h) => el("th", { class: "num", text: h })),
          ["of kind", "first started", "last ended", ""].map((h) => el("th", { text: h })))),
        el("tbody", {}, rows)));
  return runs.some((r) => r.live) ? LIVE_MS : IDLE_MS;
}

// stateText says where a run is: the scheduler's state when it has a record of the run,
// else whether an episode ended lately.
function stateText(r) {
  if (r.state === "running") return "running";
  if (r.state === "done") return r.live ? "done, storing" : "done";
  return r.live ? "active" : "idle";
}

// --- run page ----------------------------------------------------------------------

function card(key, value, field) {
  return el("div", { class: "card" }, el("div", { class: "v", "data-field": field, text: value }), el("div", { class: "k", text: key }));
}

function chart(title, opts, data) {
  const box = el("div", { class: "chart" });
  // uPlot measures its container, so it is built once the box is in the document.
  queueMicrotask(() => new uPlot({ title, width: 540, height: 260, ...opts }, data, box));
  return box;
}

const EPISODES_PAGE = 200; // episodes listed at once on the run page

// runPage shows a run. Its episodes are paged by offset (a run the scheduler planned, or
// one whose ids do not sort in issue order) or, for an env API run whose ids do
// (eps.keyed), by a cursor: after, the id of the episode the page follows.
async function runPage(gen, runID, offset, after) {
  setCrumbs(el("a", { href: "#/", text: "runs" }), el("span", { text: runID }));
  const enc = encodeURIComponent(runID);
  const which = after ? `after=${encodeURIComponent(after)}` : `offset=${offset}`;
  const [page, eps] = await Promise.all([getJSON(`runs/${enc}`), getJSON(`runs/${enc}/episodes?${which}&limit=${EPISODES_PAGE}`)]);
  if (gen !== generation) return;
  const r = page.run;
  const xs = page.series.map((p) => p.from);
  const bars = uPlot.paths.bars({ size: [0.9, 100] });
  const histX = page.reward_histogram.map((b) => (b.lo + b.hi) / 2);
  const hist = page.reward_histogram;
  const histRange = (u, lo, hi) => (hist.length ? [hist[0].lo - (hist.length === 1 ? 1 : 0), hist[hist.length - 1].hi + (hist.length === 1 ? 1 : 0)] : [lo, hi]);
  show(
    el("h1", {}, "Run ", el("span", { id: "run-id", text: r.run_id }), " ", el("span", { class: r.live ? "live" : "muted", "data-field": "state", text: stateText(r) })),
    el("div", { class: "cards" },
      card("env", r.env, "env"),
      card(r.planned === undefined ? "episodes ended" : `episodes ended of ${r.planned}`, fmt.int(r.episodes), "episodes"),
      card("success rate", fmt.pct(r.success_rate), "success_rate"),
      card("mean reward", fmt.reward(r.mean_reward), "mean_reward"),
      card("steps", fmt.int(r.steps), "steps"),
      card("infra errors", fmt.int(r.infra_errors), "infra_errors"),
      r.infra_errors ? card("infra errors by kind", fmt.kinds(r.infra_by_kind), "infra_by_kind") : null),
    r.infra_errors ? el("p", { class: "muted", text: "Success rate, mean reward, the reward distribution and the per fault kind table leave infra errors out: they carry no reward." }) : null,
    el("h2", { text: "Over the run" }),
    el("div", { class: "charts" },
      chart(`success rate and mean reward by episode index (${page.series_width} per point)`, {
        scales: { x: { time: false }, rate: { range: [0, 1] } },
        axes: [{ label: "episode index" }, { scale: "rate", label: "success rate" }, { scale: "reward", side: 1, label: "mean reward", grid: { show: false } }],
        series: [{ label: "from episode" }, { label: "success rate", scale: "rate", stroke: "#1f7a3d", width: 2 }, { label: "mean reward", scale: "reward", stroke: "#2456a6", width: 2 }],
      }, [xs, page.series.map((p) => p.success_rate), page.series.map((p) => p.mean_reward)]),
      chart("reward distribution (episodes)", {
        // The bars are drawn at their bins' centres; the axis spans the bins' edges.
        scales: { x: { time: false, range: histRange } },
        axes: [{ label: "episode reward" }, { label: "episodes" }],
        series: [{ label: "reward" }, { label: "episodes", fill: "#2456a655", stroke: "#2456a6", paths: bars, points: { show: false } }],
      }, [histX, page.reward_histogram.map((b) => b.count)])),
    el("h2", {}, "By fault kind ", el("a", { id: "heatmap-link", href: `#/runs/${enc}/faults`, text: "(heatmap by service)" })),
    el("table", { id: "fault-kinds" },
      el("thead", {}, el("tr", {}, el("th", { text: "fault kind met" }), ["episodes", "success", "mean reward"].map((h) => el("th", { class: "num", text: h })))),
      el("tbody", {}, page.fault_kinds.map((k) => el("tr", { "data-kind": k.kind },
        el("td", { text: k.kind || "(no fault)" }),
        el("td", { class: "num", text: fmt.int(k.episodes) }),
        el("td", { class: "num", text: fmt.pct(k.success_rate) }),
        el("td", { class: "num", text: fmt.reward(k.mean_reward) }))))),
    eps.keyed
      ? el("h2", { text: `Episodes in the order they were issued${after ? ", after " + after : ""} (${fmt.int(r.episodes)} ended)` })
      : el("h2", { text: eps.episodes.length ? `Episodes ${offset}–${offset + eps.episodes.length - 1} of ${r.episodes} ended` : "Episodes" }),
    eps.keyed
      ? el("div", { class: "stepper" },
        after ? el("a", { id: "episodes-first", href: `#/runs/${enc}`, text: "◀ first" }) : null,
        eps.next ? el("a", { id: "episodes-next", href: `#/runs/${enc}?after=${encodeURIComponent(eps.next)}`, text: "next ▶" }) : null)
      : el("div", { class: "stepper" },
        offset > 0 ? el("a", { id: "episodes-prev", href: `#/runs/${enc}?offset=${Math.max(0, offset - EPISODES_PAGE)}`, text: "◀ previous" }) : null,
        offset + eps.episodes.length < r.episodes ? el("a", { id: "episodes-next", href: `#/runs/${enc}?offset=${offset + EPISODES_PAGE}`, text: "next ▶" }) : null),
    el("table", { id: "episodes" },
      el("thead", {}, el("tr", {}, el("th", { text: "episode" }), el("th", { class: "num", text: "idx" }),
        ["policy", "profile"].map((h) => el("th", { text: h })),
        ["steps", "faults", "reward"].map((h) => el("th", { class: "num", text: h })), el("th", { text: "outcome" }))),
      el("tbody", {}, eps.episodes.map((e) => el("tr", { "data-episode": e.episode_id },
        el("td", {}, el("a", { href: `#/episodes/${encodeURIComponent(e.episode_id)}`, text: e.episode_id })),
        el("td", { class: "num", text: fmt.int(e.idx) }),
        el("td", { text: e.policy }), el("td", { text: e.profile }),
        el("td", { class: "num", text: fmt.int(e.steps) }),
        el("td", { class: "num", text: fmt.int(e.faults_fired) }),
        el("td", { class: "num", text: fmt.reward(e.total_reward) }),
        el("td", { class: e.success ? "ok" : "bad", text: e.infra_error ? "infra error" : e.reason }))))));
  return r.live ? LIVE_MS : 0;
}

// --- replay viewer -----------------------------------------------------------------

const PAGE = 100; // steps fetched at once
let replay = null; // {id, episode, pages: Map(from -> steps), total}

async function stepAt(id, n) {
  const from = Math.floor(n / PAGE) * PAGE;
  if (!replay.pages.has(from)) {
    const page = await getJSON(`episodes/${encodeURIComponent(id)}?from=${from}&limit=${PAGE}`);
    replay.pages.set(from, page.steps);
    replay.episode = page.episode;
    replay.forks = page.forks;
  }
  return replay.pages.get(from)[n - from];
}

function pretty(text) {
  if (!text) return "";
  try {
    return JSON.stringify(JSON.parse(text), null, 2);
  } catch {
    return text;
  }
}

function goStep(id, n) {
  location.hash = `#/episodes/${encodeURIComponent(id)}?step=${n}`;
}

async function episodePage(gen, id, n) {
  setCrumbs(el("a", { href: "#/", text: "runs" }), el("span", { text: id }));
  if (!replay || replay.id !== id) replay = { id, episode: null, pages: new Map() };
  const step = await stepAt(id, n);
  if (gen !== generation) return;
  const ep = replay.episode;
  if (ep) {
    setCrumbs(el("a", { href: "#/", text: "runs" }), el("a", { href: `#/runs/${encodeURIComponent(ep.run_id)}`, text: ep.run_id }), el("span", { text: id }));
  }
  const total = ep ? ep.steps : null;
  // Fork lineage: the episode this one was forked from (its steps before parent_step
  // are the parent's, replayed), and the episodes forked from this one.
  const lineage = ep && (ep.parent_episode_id || (replay.forks && replay.forks.length))
    ? el("div", { id: "lineage", class: "stepper" },
      ep.parent_episode_id ? el("span", {}, "forked from ",
        el("a", { id: "parent-link", href: `#/episodes/${encodeURIComponent(ep.parent_episode_id)}?step=${ep.parent_step || 0}`, text: ep.parent_episode_id }),
        " at step ", el("b", { id: "parent-step", text: String(ep.parent_step || 0) })) : null,
      replay.forks && replay.forks.length ? el("span", {}, "forks: ",
        replay.forks.flatMap((f, i) => [i ? ", " : "", el("a", { class: "fork-link", href: `#/episodes/${encodeURIComponent(f.episode_id)}?step=${f.step}`, text: `${f.episode_id} (step ${f.step})` })])) : null)
    : null;
  const last = total !== null ? total - 1 : null;
  const head = el("div", { class: "cards" },
    ep ? [card("env", ep.env, "env"), card("policy", ep.policy, "policy"), card("profile", ep.profile, "profile"),
      card("seed", String(ep.seed), "seed"), card("outcome", ep.infra_error ? "infra error: " + ep.error : ep.reason, "reason"),
      card("total reward", fmt.reward(ep.total_reward), "total_reward")]
      : el("p", { class: "muted", text: "This episode has not ended yet." }));
  const stepper = el("div", { class: "stepper" },
    el("button", { id: "prev", disabled: n <= 0 ? "" : null, onclick: () => goStep(id, n - 1), text: "◀ previous" }),
    el("span", {}, "step ", el("b", { id: "step-index", text: String(n) }), total !== null ? ` of 0–${last}` : ""),
    el("button", { id: "next", disabled: step === undefined || (last !== null && n >= last) ? "" : null, onclick: () => goStep(id, n + 1), text: "next ▶" }));
  if (step === undefined) {
    show(el("h1", { text: "Episode " + id }), head, lineage, stepper, el("p", { class: "muted", text: `No step ${n} recorded.` }));
    return ep ? 0 : LIVE_MS;
  }
  const flags = [step.terminated && "terminated", step.truncated && "truncated", step.success && "success", step.invalid_action && "invalid action", step.reason].filter(Boolean);
  show(
    el("h1", { text: "Episode " + id }), head, lineage, stepper,
    el("div", { class: "grid" },
      el("section", {}, el("h3", { text: "action" }), el("pre", { id: "step-action", text: step.tool + " " + pretty(step.args) })),
      el("section", {}, el("h3", { text: "observation" }), el("pre", { id: "step-observation", text: pretty(step.observation) })),
      el("section", {}, el("h3", { text: "state diff" }), el("pre", { id: "step-diff", text: pretty(step.state_diff) })),
      el("section", {},
        el("h3", { text: "reward" }),
        el("table", { id: "step-reward" },
          el("tbody", {},
            el("tr", {}, el("th", { text: "total" }), el("td", { class: "num", "data-field": "reward", text: fmt.reward(step.reward) })),
            step.components.map((c) => el("tr", {}, el("td", { text: c.name }), el("td", { class: "num", text: fmt.reward(c.value) }))))),
        el("p", { class: "muted", text: [step.reward_spec && "spec " + step.reward_spec, `progress ${step.progress.toFixed(2)}`, ...flags].filter(Boolean).join(" · ") }),
        el("h3", { text: `faults fired (${step.faults.length})` }),
        step.faults.length === 0 ? el("p", { class: "muted", text: "none" })
          : el("table", { id: "step-faults" }, el("tbody", {}, step.faults.map((f) => el("tr", {}, el("td", { text: f.kind }), el("td", { text: f.target }), el("td", { text: f.detail }))))),
        step.violations.length ? [el("h3", { text: "causal feedback" }), el("ul", {}, step.violations.map((v) => el("li", { text: v })))] : null,
        step.safety_events.length ? [el("h3", { text: "safety events" }), el("ul", {}, step.safety_events.map((v) => el("li", { text: v })))] : null)));
  return ep ? 0 : LIVE_MS;
}

document.addEventListener("keydown", (e) => {
  if (e.target instanceof HTMLInputElement) return;
  const button = e.key === "ArrowLeft" ? "prev" : e.key === "ArrowRight" ? "next" : null;
  const b = button && document.getElementById(button);
  if (b && !b.disabled) b.click();
});

// --- fault heatmap -----------------------------------------------------------------

// heatColor shades a success rate from red (0) to green (1).
function heatColor(rate) {
  return `hsl(${Math.round(120 * rate)}, 60%, ${88 - 18 * (1 - Math.abs(2 * rate - 1))}%)`;
}

async function heatmapPage(gen, runID) {
  const enc = encodeURIComponent(runID);
  setCrumbs(el("a", { href: "#/", text: "runs" }), el("a", { href: `#/runs/${enc}`, text: runID }), el("span", { text: "faults" }));
  const page = await getJSON(`runs/${enc}/faults`);
  if (gen !== generation) return;
  const kinds = [...new Set(page.cells.map((c) => c.kind))].sort();
  const services = [...new Set(page.cells.map((c) => c.service))].sort();
  const at = new Map(page.cells.map((c) => [c.kind + "\u0000" + c.service, c]));
  show(
    el("h1", {}, "Faults of run ", el("span", { id: "run-id", text: page.run.run_id })),
    el("p", { class: "muted", text: "Success rate of the scored episodes (infra errors left out) in which a fault kind fired on a service at least once; the cell's title gives the counts." }),
    page.cells.length === 0 ? el("p", { class: "muted", text: "No fault fired in this run." })
      : el("table", { id: "heatmap", class: "heatmap" },
        el("thead", {}, el("tr", {}, el("th", { text: "fault kind \u2193 service \u2192" }), services.map((s) => el("th", { class: "num", text: s })))),
        el("tbody", {}, kinds.map((k) => el("tr", { "data-kind": k }, el("th", { text: k }),
          services.map((s) => {
            const c = at.get(k + "\u0000" + s);
            if (!c) return el("td", { class: "num muted", "data-service": s, text: "\u2013" });
            return el("td", { class: "num", "data-service": s, "data-episodes": String(c.episodes), style: `background: ${heatColor(c.success_rate)}`,
              title: `${c.succeeded} of ${c.episodes} episodes succeeded`, text: fmt.pct(c.success_rate) });
          }))))));
  return page.run.live ? LIVE_MS : 0;
}

// --- curricula ---------------------------------------------------------------------

// A curriculum's states that still run (their pages refresh).
const OPEN_STATES = new Set(["running", "paused"]);

async function curriculaPage(gen) {
  setCrumbs(el("span", { text: "curricula" }));
  const { curricula } = await getJSON("curricula");
  if (gen !== generation) return;
  show(
    el("h1", { text: "Curricula" }),
    curricula.length === 0
      ? el("p", { class: "muted", text: "No curriculum yet. Start one with `gauntlet curriculum start -f spec.yaml`." })
      : el("table", { id: "curricula" },
        el("thead", {}, el("tr", {}, ["curriculum", "name", "state", "stage"].map((h) => el("th", { text: h })),
          ["runs", "episodes ended", "success", "infra errors"].map((h) => el("th", { class: "num", text: h })),
          ["started", "closed", "by"].map((h) => el("th", { text: h })))),
        el("tbody", {}, curricula.map((c) => el("tr", { "data-curriculum": c.id },
          el("td", {}, el("a", { href: `#/curricula/${encodeURIComponent(c.id)}`, text: c.id })),
          el("td", { "data-field": "name", text: c.name }),
          el("td", { class: c.open ? "live" : "muted", "data-field": "state", text: c.state }),
          el("td", { "data-field": "stage", text: `${c.stage} ${c.stage_name}` }),
          el("td", { class: "num", "data-field": "runs", text: fmt.int(c.runs) }),
          el("td", { class: "num", "data-field": "episodes", text: fmt.int(c.episodes) }),
          el("td", { class: "num", "data-field": "success_rate", text: fmt.pct(c.success_rate) }),
          el("td", { class: "num", "data-field": "infra_errors", text: fmt.int(c.infra_errors) }),
          el("td", { text: fmt.time(c.started) }),
          el("td", { text: fmt.time(c.closed) }),
          el("td", { text: c.submitted_by }))))));
  return curricula.some((c) => c.open) ? LIVE_MS : IDLE_MS;
}

const TOKEN_KEY = "gauntlet.envapi-token";

// signal sends a curriculum a signal with the token typed on the page; the answer (or
// the refusal) is shown beside the buttons.
async function signal(id, sig, note) {
  const token = sessionStorage.getItem(TOKEN_KEY) || "";
  note.textContent = `sending ${sig}…`;
  note.className = "muted";
  try {
    await getJSON(`curricula/${encodeURIComponent(id)}/signal/${sig}`, { method: "POST", headers: { Authorization: "Bearer " + token } });
    note.textContent = `${sig} sent; it takes effect after the batch in flight.`;
    route(true);
  } catch (err) {
    note.textContent = err.message;
    note.className = "bad";
  }
}

function actions(id, page) {
  if (!page.actions) return el("p", { class: "muted", id: "actions", text: "This console is read-only." });
  if (!page.curriculum.open) return null;
  const note = el("span", { id: "action-note", class: "muted", role: "status" });
  const token = el("input", { id: "token", type: "password", placeholder: "env API token", autocomplete: "off", size: "28" });
  token.value = sessionStorage.getItem(TOKEN_KEY) || "";
  token.addEventListener("input", () => sessionStorage.setItem(TOKEN_KEY, token.value.trim()));
  const paused = page.curriculum.state === "paused" || (page.progress && page.progress.pause_requested);
  const buttons = [
    ["pause", paused], ["resume", !paused], ["skip", false], ["abort", false],
  ].map(([sig, off]) => el("button", {
    id: "signal-" + sig, disabled: off ? "" : null,
    onclick: () => {
      sessionStorage.setItem(TOKEN_KEY, token.value.trim());
      if ((sig === "abort" || sig === "skip") && !confirm(`${sig} curriculum ${id}?`)) return;
      signal(id, sig, note);
    },
    text: sig,
  }));
  return el("div", { class: "stepper", id: "actions" }, token, buttons, note);
}

// KIND_COLOURS gives each kind of infra error its colour in kindBar.
const KIND_COLOURS = { model_endpoint: "#b3261e", sandbox: "#b3661e", verifier: "#7a1fa6", gauntlet: "#2456a6", unknown: "#68727d" };

// kindBar draws a stage's infra errors as one small bar stacked by kind, its length
// their share of the stage's episodes; each part names its kind and count on hover.
// Nothing for a stage without any (or closed before kinds were recorded).
function kindBar(kinds, episodes) {
  const parts = Object.entries(kinds || {}).sort(([a], [b]) => (a < b ? -1 : 1));
  if (!parts.length || !episodes) return null;
  return el("span", { class: "kindbar", role: "img", "aria-label": "infra errors by kind: " + fmt.kinds(kinds) },
    parts.map(([k, n]) => el("span", { "data-kind": k, title: `${k}: ${n} of ${episodes} episodes`,
      style: `width:${(6 * n / episodes).toFixed(2)}em;background:${KIND_COLOURS[k] || "#1e8fb3"}` })));
}

async function curriculumPage(gen, id) {
  const enc = encodeURIComponent(id);
  setCrumbs(el("a", { href: "#/curricula", text: "curricula" }), el("span", { text: id }));
  // An action's note survives the page's refresh.
  const note = document.getElementById("action-note");
  const kept = note ? [note.textContent, note.className] : null;
  const typing = document.activeElement && document.activeElement.id === "token";
  const page = await getJSON(`curricula/${enc}`);
  if (gen !== generation) return;
  const c = page.curriculum;
  const p = page.progress;
  const stages = p ? p.stages : null;
  // The chart: one point per batch, at the episodes ended by its end.
  let ended = 0;
  const xs = page.batches.map((b) => (ended += b.episodes));
  const drift = page.selectors.map((sel, i) => ({ label: "drift " + sel, scale: "drift", stroke: ["#b3661e", "#7a1fa6", "#1e8fb3", "#a61f5e"][i % 4], width: 1.5, dash: [4, 3] }));
  const stepped = uPlot.paths.stepped({ align: 1 });
  show(
    el("h1", {}, "Curriculum ", el("span", { id: "curriculum-id", text: c.id }), " ", el("span", { class: c.open ? "live" : "muted", "data-field": "state", text: c.state })),
    el("div", { class: "cards" },
      card("name", c.name || (p && p.name) || "", "name"),
      card("state", c.state + (p && p.pause_requested ? " (pausing after the batch in flight)" : ""), "state-card"),
      c.pause_reason ? card("paused by itself", c.pause_reason, "pause_reason") : null,
      card(stages ? `stage of ${stages}` : "stage", `${c.stage} ${c.stage_name}`, "stage"),
      card("episodes ended", fmt.int(c.episodes), "episodes"),
      card("success rate", fmt.pct(c.success_rate), "success_rate"),
      card("infra errors", fmt.int(c.infra_errors), "infra_errors"),
      card("runs", fmt.int(c.runs), "runs"),
      p ? card(`window of ${p.window_episodes}: success`, fmt.pct(p.window_success_rate), "window_success_rate") : null,
      ...(p && p.drift ? p.drift.map((d) => card("drift " + d.selector, String(+d.value.toFixed(3)), "drift")) : [])),
    actions(id, page),
    el("h2", { text: "Stage, drift and success over the curriculum" }),
    page.batches.length === 0 ? el("p", { class: "muted", text: "No batch has run yet." })
      : el("div", { class: "charts" }, chart("per batch, by episodes ended", {
        width: 1000,
        scales: { x: { time: false }, rate: { range: [0, 1] } },
        // Stages are whole numbers; the drift, when there is one, has its own axis.
        axes: [{ label: "episodes ended" }, { scale: "rate", label: "success rate" },
          { scale: "stage", side: 1, label: "stage", grid: { show: false }, incrs: [1], values: (u, ticks) => ticks.map((v) => String(v)) },
          ...(page.selectors.length ? [{ scale: "drift", side: 1, label: "drift", grid: { show: false } }] : [])],
        series: [{ label: "episodes" },
          { label: "success rate", scale: "rate", stroke: "#1f7a3d", width: 2 },
          { label: "stage", scale: "stage", stroke: "#2456a6", width: 2, paths: stepped },
          ...drift],
      }, [xs, page.batches.map((b) => b.success_rate), page.batches.map((b) => b.stage), ...page.selectors.map((_, i) => page.batches.map((b) => b.drift[i]))])),
    el("h2", { text: "Stages closed" }),
    page.stages.length === 0 ? el("p", { class: "muted", text: "No stage has closed yet." })
      : el("table", { id: "stages" },
        el("thead", {}, el("tr", {}, ["stage", "name", "outcome", "metric"].map((h) => el("th", { text: h })),
          ["window value", "threshold", "episodes", "success", "infra errors"].map((h) => el("th", { class: "num", text: h })), el("th", { text: "of kind" }),
          el("th", { class: "num", text: "batches" }), el("th", { text: "closed" }))),
        el("tbody", {}, page.stages.map((s) => el("tr", { "data-stage": String(s.stage) },
          el("td", { text: String(s.stage) }), el("td", { text: s.stage_name }), el("td", { text: s.outcome }), el("td", { text: s.metric }),
          el("td", { class: "num", text: fmt.reward(s.window_value) }), el("td", { class: "num", text: fmt.reward(s.threshold) }),
          el("td", { class: "num", text: fmt.int(s.episodes) }), el("td", { class: "num", text: fmt.pct(s.episodes > s.infra_errors ? s.succeeded / (s.episodes - s.infra_errors) : 0) }),
          el("td", { class: "num", "data-field": "infra_errors", text: fmt.int(s.infra_errors) }),
          el("td", {}, kindBar(s.infra_by_kind, s.episodes), el("span", { class: "muted", "data-field": "infra_by_kind", text: fmt.kinds(s.infra_by_kind) })),
          el("td", { class: "num", text: fmt.int(s.batches) }), el("td", { text: fmt.time(s.closed_at) }))))),
    el("h2", { text: "Batches" }),
    el("table", { id: "batches" },
      el("thead", {}, el("tr", {}, ["run", "stage", "batch", "drift (batch mean)"].map((h) => el("th", { text: h })),
        ["episodes", "success", "mean reward", "infra errors"].map((h) => el("th", { class: "num", text: h })), el("th", { text: "of kind" }))),
      el("tbody", {}, page.batches.map((b) => el("tr", { "data-run": b.run_id },
        el("td", {}, el("a", { href: `#/runs/${encodeURIComponent(b.run_id)}`, text: b.run_id })),
        el("td", { text: `${b.stage} ${b.stage_name}` }), el("td", { text: String(b.batch) }),
        el("td", { class: "muted", title: b.drift_text, text: page.selectors.map((sel, i) => (b.drift[i] === null ? null : `${sel}=${+b.drift[i].toFixed(3)}`)).filter(Boolean).join(", ") || b.drift_text }),
        el("td", { class: "num", "data-field": "episodes", text: fmt.int(b.episodes) }),
        el("td", { class: "num", "data-field": "success_rate", text: fmt.pct(b.success_rate) }),
        el("td", { class: "num", "data-field": "mean_reward", text: fmt.reward(b.mean_reward) }),
        el("td", { class: "num", "data-field": "infra_errors", text: fmt.int(b.infra_errors) }),
        el("td", { class: "muted", "data-field": "infra_by_kind", text: fmt.kinds(b.infra_by_kind) }))))));
  const again = document.getElementById("action-note");
  if (kept && again) [again.textContent, again.className] = kept;
  if (typing && document.getElementById("token")) document.getElementById("token").focus();
  return OPEN_STATES.has(c.state) ? LIVE_MS : 0;
}

// --- routing -----------------------------------------------------------------------

async function route(refresh) {
  const gen = refresh ? generation : ++generation;
  clearTimeout(timer);
  const hash = location.hash.replace(/^#/, "") || "/";
  const [path, query] = hash.split("?");
  const params = new URLSearchParams(query || "");
  const parts = path.split("/").filter(Boolean).map(decodeURIComponent);
  try {
    let next;
    if (parts.length === 0) next = await runsPage(gen);
    else if (parts[0] === "runs" && parts.length === 2) next = await runPage(gen, parts[1], Math.max(0, parseInt(params.get("offset") || "0", 10) || 0), params.get("after") || "");
    else if (parts[0] === "runs" && parts.length === 3 && parts[2] === "faults") next = await heatmapPage(gen, parts[1]);
    else if (parts[0] === "curricula" && parts.length === 1) next = await curriculaPage(gen);
    else if (parts[0] === "curricula" && parts.length === 2) next = await curriculumPage(gen, parts[1]);
    else if (parts[0] === "episodes" && parts.length === 2) {
      // Pages of an ended episode are kept while stepping; one in flight is read again.
      if (!replay || replay.id !== parts[1] || !replay.episode) replay = null;
      next = await episodePage(gen, parts[1], Math.max(0, parseInt(params.get("step") || "0", 10) || 0));
    } else throw new Error(`no page at #${hash}`);
    if (gen !== generation) return;
    statusEl.textContent = "updated " + new Date().toLocaleTimeString() + (next === LIVE_MS ? " · live" : "");
    if (next) schedule(next, gen);
  } catch (err) {
    if (gen !== generation) return;
    showError(err);
    statusEl.textContent = "";
    schedule(IDLE_MS, gen);
  }
}

window.addEventListener("hashchange", () => route(false));
route(false);
