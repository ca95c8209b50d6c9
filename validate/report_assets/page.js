// gpuready report page: node table (sort, filter, pages) and per-node view, drawn from the
// JSON in #gpuready-data (see validate/report_page.py for its shape). The location hash holds
// the state, so a view can be linked: #node=<name>, or #status=fail&pool=...&check=...
"use strict";
(() => {
  const PAGE_SIZE = Number(document.currentScript.dataset.pageSize) || 100;
  const D = JSON.parse(document.getElementById("gpuready-data").textContent);
  const S = D.statuses; // index = severity: skip, pass, warn, fail, error
  const NODES = D.nodes;
  const ROWS = D.rows;
  const N = NODES.name.length;
  const NCHECKS = D.checks.length;
  const $ = (id) => document.getElementById(id);

  const esc = (text) => String(text).replace(/[&<>"']/g, (c) => (
    { "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" })[c]);
  const sevOf = (i) => ROWS.status.charCodeAt(i) - 48;
  const badge = (sev) => `<span class="badge s-${S[sev]}">${S[sev]}</span>`;
  const fmt = (v) => {
    if (v === null || v === undefined) return "";
    if (Number.isInteger(v)) return v.toLocaleString("en-US");
    return v.toLocaleString("en-US", { maximumSignificantDigits: 6 });
  };
  const hashFor = (params) => {
    const p = new URLSearchParams();
    for (const [k, v] of Object.entries(params)) if (v !== "" && v !== undefined) p.set(k, v);
    return "#" + p.toString();
  };

  // Worst status of each check on each node (-1: the check did not run there).
  const nodeCheck = new Int8Array(N * NCHECKS).fill(-1);
  for (let n = 0; n < N; n++) {
    for (let i = NODES.start[n]; i < NODES.start[n + 1]; i++) {
      const k = n * NCHECKS + D.shapes.check[ROWS.shape[i]];
      const sev = sevOf(i);
      if (sev > nodeCheck[k]) nodeCheck[k] = sev;
    }
  }
  const nodeIndex = new Map(NODES.name.map((name, n) => [name, n]));
  const faultCodes = [...new Set(ROWS.code.filter((c, i) => sevOf(i) >= 2))]
    .map((c) => D.codes[c]).sort();

  // ---- table state and controls ----
  const FILTERS = ["pool", "status", "check", "code", "q"];
  let state = { pool: "", status: "", check: "", code: "", q: "", sort: "status", dir: "desc", p: 0 };
  const fill = (select, options, anyLabel) => {
    select.innerHTML = `<option value="">${esc(anyLabel)}</option>` +
      options.map(([v, label]) => `<option value="${esc(v)}">${esc(label)}</option>`).join("");
  };
  fill($("f-pool"), D.pools.map((p) => [p, p]), "all pools");
  fill($("f-status"), [["notpass", "not passing (warn, fail, error)"],
    ...[...S].reverse().map((s) => [s, s])], "any status");
  fill($("f-check"), D.checks.map((c) => [c, c]), "all checks");
  fill($("f-code"), faultCodes.map((c) => [c, c]), "any fault code");

  const columns = [
    { key: "node", label: "Node", value: (n) => NODES.name[n] },
    { key: "pool", label: "Pool", value: (n) => D.pools[NODES.pool[n]] },
    { key: "profile", label: "Profile", value: (n) => D.profiles[NODES.profile[n]] },
    { key: "status", label: "Status", value: (n) => statusOf(n) },
    { key: "failed", label: "Failed checks", value: (n) => NODES.failed[n] },
    { key: "errors", label: "Errors", value: (n) => NODES.errors[n] },
    { key: "warnings", label: "Warnings", value: (n) => NODES.warnings[n] },
    ...D.figures.map(([key, label], f) => ({ key, label, num: true, value: (n) => NODES.fig[f][n] })),
  ];
  const checkIndex = () => D.checks.indexOf(state.check);
  // With a check chosen, a node's status is that check's worst status on it.
  const statusOf = (n) => (state.check ? nodeCheck[n * NCHECKS + checkIndex()] : NODES.status[n]);

  const nodesWithCode = (code) => {
    const c = D.codes.indexOf(code);
    const hit = new Uint8Array(N);
    for (let n = 0; n < N; n++) {
      for (let i = NODES.start[n]; i < NODES.start[n + 1]; i++) {
        if (ROWS.code[i] === c) { hit[n] = 1; break; }
      }
    }
    return hit;
  };

  const visibleNodes = () => {
    const ci = checkIndex();
    const withCode = state.code ? nodesWithCode(state.code) : null;
    const q = state.q.toLowerCase();
    const out = [];
    for (let n = 0; n < N; n++) {
      if (state.pool && D.pools[NODES.pool[n]] !== state.pool) continue;
      const sev = statusOf(n);
      if (state.check && (ci < 0 || sev < 0)) continue;
      if (state.status === "notpass" ? sev < 2 : state.status && S[sev] !== state.status) continue;
      if (withCode && !withCode[n]) continue;
      if (q && !NODES.name[n].toLowerCase().includes(q)) continue;
      out.push(n);
    }
    const col = columns.find((c) => c.key === state.sort) || columns[3];
    const sign = state.dir === "asc" ? 1 : -1;
    out.sort((a, b) => {
      const va = col.value(a);
      const vb = col.value(b);
      const missingA = va === null || va === "";
      const missingB = vb === null || vb === "";
      if (missingA !== missingB) return missingA ? 1 : -1; // empty cells last either way
      const cmp = typeof va === "number" && typeof vb === "number" ? va - vb
        : String(va).localeCompare(String(vb));
      return cmp * sign || NODES.name[a].localeCompare(NODES.name[b]);
    });
    return out;
  };

  const drawTable = () => {
    for (const f of FILTERS) $(`f-${f}`).value = state[f];
    $("nodes").tHead.innerHTML = "<tr>" + columns.map((c) => {
      const sort = c.key === state.sort ? (state.dir === "asc" ? "ascending" : "descending") : "none";
      return `<th aria-sort="${sort}" data-key="${c.key}"><button type="button">${esc(c.label)}</button></th>`;
    }).join("") + "</tr>";
    const shown = visibleNodes();
    const pages = Math.max(1, Math.ceil(shown.length / PAGE_SIZE));
    const page = Math.min(Math.max(0, Number(state.p) || 0), pages - 1);
    const slice = shown.slice(page * PAGE_SIZE, (page + 1) * PAGE_SIZE);
    $("nodes").tBodies[0].innerHTML = slice.map((n) => {
      const sev = statusOf(n);
      const cells = columns.map((c) => {
        if (c.key === "node") {
          return `<td><a href="${esc(hashFor({ node: NODES.name[n] }))}">${esc(NODES.name[n])}</a></td>`;
        }
        if (c.key === "status") return `<td>${badge(sev)}</td>`;
        return c.num ? `<td class="num">${fmt(c.value(n))}</td>` : `<td>${esc(c.value(n))}</td>`;
      });
      return `<tr class="r-${S[sev]}" data-node="${esc(NODES.name[n])}">${cells.join("")}</tr>`;
    }).join("") || `<tr><td colspan="${columns.length}">No node matches these filters.</td></tr>`;
    const first = shown.length ? page * PAGE_SIZE + 1 : 0;
    $("shown").textContent = `Showing ${first.toLocaleString("en-US")}-` +
      `${(page * PAGE_SIZE + slice.length).toLocaleString("en-US")} of ` +
      `${shown.length.toLocaleString("en-US")} nodes` +
      (shown.length === N ? "" : ` (filtered from ${N.toLocaleString("en-US")})`);
    $("page").textContent = `page ${page + 1} of ${pages}`;
    $("prev").disabled = page === 0;
    $("next").disabled = page >= pages - 1;
  };

  // ---- node view ----
  const drawNode = (n) => {
    const view = $("node-view");
    const rows = [];
    const codes = new Set();
    for (let i = NODES.start[n]; i < NODES.start[n + 1]; i++) {
      const shape = ROWS.shape[i];
      const sev = sevOf(i);
      const code = D.codes[ROWS.code[i]];
      if (code !== "ok") codes.add(code);
      rows.push(`<tr class="r-${S[sev]}"><td>${esc(D.checks[D.shapes.check[shape]])}</td>` +
        `<td>${esc(D.shapes.metric[shape])}</td>` +
        `<td class="num" title="${esc(ROWS.value[i] ?? "")}">${fmt(ROWS.value[i])}</td>` +
        `<td>${esc(D.shapes.unit[shape])}</td>` +
        `<td class="num">${fmt(D.shapes.warn[shape])}</td>` +
        `<td class="num">${fmt(D.shapes.fail[shape])}</td>` +
        `<td>${badge(sev)}</td><td>${esc(code)}</td><td>${esc(D.details[ROWS.detail[i]])}</td></tr>`);
    }
    const actions = [...codes].sort().map((code) => {
      const a = D.actions[code];
      if (!a) return `<dt>${esc(code)}</dt><dd>No catalogued action: read the row's detail.</dd>`;
      const source = a.url ? `<a href="${esc(a.url)}" rel="noreferrer">${esc(a.source)}</a>` : esc(a.source);
      return `<dt>${esc(code)}</dt><dd><p class="meaning">${esc(a.meaning)}</p>` +
        `<p class="action"><strong>What to do:</strong> ${esc(a.action)}</p>` +
        `<p class="source">Source: ${source}</p></dd>`;
    });
    view.innerHTML =
      `<p><a id="back" href="${esc(hashFor(tableParams()))}">&larr; all nodes</a></p>` +
      `<h2 id="node-name">${esc(NODES.name[n])} ${badge(NODES.status[n])}</h2>` +
      `<p>Pool ${esc(D.pools[NODES.pool[n]])}, profile ${esc(D.profiles[NODES.profile[n]])}, ` +
      `${NODES.start[n + 1] - NODES.start[n]} check rows.</p>` +
      `<table id="node-rows"><thead><tr><th>check</th><th>metric</th><th>value</th><th>unit</th>` +
      `<th>warn</th><th>fail</th><th>status</th><th>code</th><th>detail</th></tr></thead>` +
      `<tbody>${rows.join("")}</tbody></table>` +
      `<h3>Operator actions</h3>` +
      (actions.length ? `<dl id="node-actions">${actions.join("")}</dl>`
        : `<p id="node-actions">No fault codes on this node.</p>`);
  };

  // ---- routing: the hash is the state ----
  const tableParams = () => {
    const p = {};
    for (const k of [...FILTERS, "sort", "dir", "p"]) p[k] = state[k];
    if (p.sort === "status" && p.dir === "desc") { p.sort = ""; p.dir = ""; }
    if (!Number(p.p)) p.p = "";
    return p;
  };
  const go = (changes) => {
    state = { ...state, ...changes };
    location.replace(hashFor(tableParams()));
  };
  const route = () => {
    const params = new URLSearchParams(location.hash.slice(1));
    const node = params.get("node");
    if (node !== null && nodeIndex.has(node)) {
      drawNode(nodeIndex.get(node));
      $("table-view").hidden = true;
      $("node-view").hidden = false;
      window.scrollTo(0, 0);
      return;
    }
    state = { pool: "", status: "", check: "", code: "", q: "", sort: "status", dir: "desc", p: 0 };
    for (const [k, v] of params) if (k in state) state[k] = v;
    $("node-view").hidden = true;
    $("table-view").hidden = false;
    drawTable();
  };

  for (const f of FILTERS) {
    $(`f-${f}`).addEventListener(f === "q" ? "input" : "change", (ev) => go({ [f]: ev.target.value, p: 0 }));
  }
  $("f-clear").addEventListener("click", () => go({ pool: "", status: "", check: "", code: "", q: "", p: 0 }));
  $("prev").addEventListener("click", () => go({ p: Math.max(0, Number(state.p) - 1) }));
  $("next").addEventListener("click", () => go({ p: Number(state.p) + 1 }));
  $("nodes").tHead.addEventListener("click", (ev) => {
    const th = ev.target.closest("th");
    if (!th) return;
    const key = th.dataset.key;
    const dir = key === state.sort ? (state.dir === "asc" ? "desc" : "asc")
      : (key === "status" || columns.find((c) => c.key === key).num ? "desc" : "asc");
    go({ sort: key, dir, p: 0 });
  });
  window.addEventListener("hashchange", route);
  route();
})();
