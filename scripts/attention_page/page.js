// The page's views: the text box, the attention strip and grid, the step-by-step attention of one character and
// head, and the next character; each recomputed from gpt.js's forward pass whenever the text changes.
"use strict";

const data = JSON.parse(document.getElementById("data").textContent);
const model = loadModel(data);
const config = model.config, nLayers = config.n_layer, nHeads = config.n_head, headSize = config.head_size;
const vocab = data.vocab.map(code => String.fromCodePoint(code)), idOf = new Map(vocab.map((ch, i) => [ch, i]));
const MAX_APPEND = config.block_size, MAX_BENCH = 1000;  // what the address may ask for: a window, 1000 passes
const headColors = ["214,39,40", "31,119,180", "44,160,44", "148,103,189", "255,127,14", "23,190,207",
                    "140,86,75", "227,119,194"];
const $ = id => document.getElementById(id);
const state = { text: [], result: null, pinned: null, hovered: null, random: null };

function shown(ch) {  // characters that would be invisible get a visible stand-in; a lone surrogate, its code
  if (ch.length === 1 && ch >= "\ud800" && ch <= "\udfff") return "\\u" + ch.charCodeAt(0).toString(16);
  return ch === "\n" ? "\u21b5" : ch === " " ? "\u00a0" : ch === "\t" ? "\u2192" : ch;
}
function key(ch) { return ch === " " ? "\u2423" : shown(ch); }  // in a table a space shows as ␣
function quoted(ch) { return "\u201c" + shown(ch) + "\u201d"; }
function fixed(value) { return value === -Infinity ? "\u2212\u221e" : value.toFixed(4); }
function color(head, weight) {  // the square root, so that small weights still show
  return "rgba(" + headColors[head % headColors.length] + "," + Math.sqrt(weight).toFixed(3) + ")";
}
function element(tag, text, className) {
  const node = document.createElement(tag);
  if (text !== undefined) node.textContent = text;
  if (className) node.className = className;
  return node;
}

// ---------------------------------------------------------------------------------------------
// The text: the characters the model knows, at most block_size of them (the last ones, as sample.py reads).
// ---------------------------------------------------------------------------------------------
function characters(text) {
  // The text's characters, by code point (never by UTF-16 unit). A vocabulary read with unicode_escape can hold lone
  // surrogates, which a text box joins into one character when they meet: such a character, unknown to the model
  // while both its halves are known, is read as those two halves.
  return Array.from(text).flatMap(ch => (ch.length === 2 && !idOf.has(ch) && idOf.has(ch[0]) && idOf.has(ch[1]) ?
    [ch[0], ch[1]] : [ch]));
}

function readText() {
  const typed = characters($("input").value);
  const unknown = [...new Set(typed.filter(ch => !idOf.has(ch)))];
  let known = typed.filter(ch => idOf.has(ch));
  const cut = Math.max(0, known.length - config.block_size);
  known = known.slice(cut);
  const notes = [known.length + " of at most " + config.block_size + " characters"];
  if (unknown.length) notes.push("skipped, never seen in training: " + unknown.slice(0, 20).map(quoted).join(" "));
  if (cut) notes.push("the first " + cut + " left out: the model reads at most " + config.block_size);
  $("input-note").textContent = notes.join("; ");
  $("input-note").classList.toggle("warn", unknown.length > 0 || cut > 0);
  state.text = known;
  state.result = known.length ? forward(model, known.map(ch => idOf.get(ch)), { scoreFactor: scoreFactor() }) : null;
  if (state.pinned !== null && state.pinned >= known.length) state.pinned = null;
}

function query() {
  // The chosen character: the one pointed at, else the one clicked, else the middle one (the last one's mask keeps
  // every key, so it shows nothing of the mask).
  return state.hovered ?? state.pinned ?? (state.text.length ? Math.floor((state.text.length - 1) / 2) : null);
}
function layer() { return Number($("layer").value); }
function viewedHead() { return $("view").value === "all" ? null : Number($("view").value); }
function weightOf(l, head, q, key) {
  return q !== null && key <= q ? state.result.layers[l].heads[head].weights[q][key] : 0;
}

// ---------------------------------------------------------------------------------------------
// Section 2: the strip of characters and the grid of heads.
// ---------------------------------------------------------------------------------------------
function buildStrip() {
  const strip = $("strip"), grid = $("grid");
  strip.replaceChildren();
  grid.replaceChildren();
  state.text.forEach((ch, i) => {
    const span = element("span", shown(ch), "ch");
    span.dataset.position = String(i + 1);
    span.addEventListener("mouseover", () => { state.hovered = i; render(); });
    span.addEventListener("mouseout", () => { state.hovered = null; render(); });
    span.addEventListener("click", () => { state.pinned = state.pinned === i ? null : i; render(); });
    strip.appendChild(span);
    if (ch === "\n") strip.appendChild(element("br"));
  });
  const header = grid.insertRow();
  header.appendChild(element("th"));
  state.text.forEach(ch => header.appendChild(element("th", shown(ch))));
  for (let h = 0; h < nHeads; h++) {
    const row = grid.insertRow();
    row.appendChild(element("th", "head " + (h + 1), "head"));
    state.text.forEach(() => row.insertCell());
  }
}

function renderStrip() {
  const q = query(), l = layer(), head = viewedHead();
  $("grid").style.display = head === null ? "" : "none";
  $("strip").querySelectorAll(".ch").forEach((span, key) => {
    span.classList.toggle("query", key === q);
    span.classList.toggle("future", q !== null && key > q);
    const weight = head === null ? 0 : weightOf(l, head, q, key);
    span.dataset.weight = weight.toFixed(5);
    span.style.backgroundColor = weight > 0 ? color(head, weight) : "";
    span.title = head !== null && q !== null && key <= q ? "weight " + weight.toFixed(4) : "";
  });
  Array.from($("grid").rows).slice(1).forEach((row, h) => Array.from(row.cells).slice(1).forEach((cell, key) => {
    const weight = weightOf(l, h, q, key);
    cell.dataset.weight = weight.toFixed(5);
    cell.style.backgroundColor = weight > 0 ? color(h, weight) : "";
    cell.title = weight > 0 ? "head " + (h + 1) + ", weight " + weight.toFixed(4) : "";
  }));
  const heads = head === null ? [...Array(nHeads).keys()] : [head];
  $("readout").textContent = q === null ? "" : quoted(state.text[q]) + " (character " + (q + 1) + "), layer " +
    (l + 1) + ": " + heads.map(h => {
      const top = state.result.layers[l].heads[h].weights[q].slice(0, q + 1).map((w, key) => [w, key])
        .sort((a, b) => b[0] - a[0]).slice(0, 3);
      return "head " + (h + 1) + " looks most at " +
        top.map(([w, key]) => quoted(state.text[key]) + " " + w.toFixed(2)).join(", ");
    }).join("; ");
}

// ---------------------------------------------------------------------------------------------
// The what-if scale: the factor on every q·k, the model's own unless the reader picks another.
// ---------------------------------------------------------------------------------------------
const FACTORS = { sqrt: ["\u00f7\u221a" + headSize, 1 / Math.sqrt(headSize)], 1: ["\u00d71, no scale", 1],
                  10: ["\u00d710", 10] };
const OWN_FACTOR = config.attention_score === "scaled_dot" ? "sqrt" : "1";
const SCALABLE = config.attention_score === "scaled_dot" || config.attention_score === "dot";

function scoreFactor() { return FACTORS[$("scale").value || OWN_FACTOR][1]; }
function factorName() { return FACTORS[$("scale").value || OWN_FACTOR][0]; }
function whatIf() { return SCALABLE && $("scale").value !== OWN_FACTOR; }

// ---------------------------------------------------------------------------------------------
// Section 3: the chosen layer and head as whole matrices, in the tutorials' order, one step at a time.
// ---------------------------------------------------------------------------------------------
function matrices(l, h) {  // each step's name, formula and T x d or T x T values (-Infinity where masked)
  const head = state.result.layers[l].heads[h], scaled = config.attention_score !== "additive";
  const list = [];
  if (config.attention_score !== "uniform") {
    list.push({ name: "Q", formula: "Q: one query per character (row), " + headSize + " numbers each" +
                (config.qk_norm || config.position === "rope" ? ", after QK-norm and rotary turns" : ""),
                values: head.q, columns: "dims" });
    list.push({ name: "K", formula: "K: one key per character", values: head.k, columns: "dims" });
  }
  list.push({ name: "V", formula: "V: one value per character", values: head.v, columns: "dims" });
  list.push({ name: "S", formula: config.attention_score === "additive" ? "S = w\u00b7tanh(q\u1d62 + k\u2c7c) for " +
              "every pair (additive scores)" : "S = Q K\u1d40: S\u1d62\u2c7c = q\u1d62\u00b7k\u2c7c, every query " +
              "with every key, the future too", values: head.raw, columns: "text" });
  if (scaled && config.attention_score !== "uniform") {
    list.push({ name: "scaled", formula: "S " + factorName() + (whatIf() ? " (what-if)" : "") +
                ": the scores the softmax will see", values: head.raw.map(row => row.map(s => s * scoreFactor())),
                columns: "text" });
  }
  list.push({ name: "masked", formula: "the causal mask: every key after the query set to \u2212\u221e (drawn " +
              "hatched), so the softmax gives it weight 0", values: head.scores, columns: "text" });
  list.push({ name: "A", formula: "A = softmax of each row: the attention weights, each row sums to 1",
              values: head.weights, columns: "text" });
  list.push({ name: "AV", formula: "A\u00b7V: each character's weighted sum of the values, the head's output",
              values: head.out, columns: "dims" });
  return list;
}

function cellColor(value, largest, weights) {  // weights: white to blue; others: blue (negative) to red (positive)
  if (weights) return "rgba(31,119,180," + Math.sqrt(value).toFixed(3) + ")";
  const strength = largest ? Math.min(1, Math.abs(value) / largest) : 0;
  return (value < 0 ? "rgba(31,119,180," : "rgba(214,39,40,") + strength.toFixed(3) + ")";
}

function renderMatrix() {
  const table = $("matrix"), l = layer(), h = viewedHead() ?? 0, list = matrices(l, h);
  const select = $("matrix-step");
  if (select.options.length !== list.length) {
    select.replaceChildren(...list.map((m, i) => new Option((i + 1) + ". " + m.name, String(i))));
  }
  const at = Math.min(Number(select.value) || 0, list.length - 1), shownMatrix = list[at];
  select.value = String(at);
  $("matrix-formula").textContent = "Layer " + (l + 1) + ", head " + (h + 1) + ": " + shownMatrix.formula;
  const values = shownMatrix.values, weights = shownMatrix.name === "A", q = query();
  let largest = 0;
  for (const row of values) for (const value of row) if (Number.isFinite(value)) largest = Math.max(largest, Math.abs(value));
  table.replaceChildren();
  const top = table.insertRow();
  top.appendChild(element("th"));
  const width = values[0].length;
  for (let j = 0; j < width; j++) {
    top.appendChild(element("th", shownMatrix.columns === "text" ? key(state.text[j]) : String(j + 1)));
  }
  values.forEach((row, i) => {
    const tr = table.insertRow();
    tr.className = i === q ? "chosen" : "";
    const label = tr.appendChild(element("th", key(state.text[i]) + " " + (i + 1)));
    label.title = "character " + (i + 1) + ": click to explain it step by step";
    Array.from(row).forEach((value, j) => {
      const cell = tr.insertCell();
      cell.dataset.value = String(value);
      if (value === -Infinity) { cell.className = "masked"; } else {
        cell.style.backgroundColor = cellColor(value, largest, weights);
      }
      cell.title = shownMatrix.name + "[" + (i + 1) + "][" + (j + 1) + "] = " + fixed(value);
    });
    tr.addEventListener("click", () => {
      state.pinned = i;
      render();
      $("steps-section").scrollIntoView();
    });
  });
}

function pointAtMatrix(event) {  // the number of the cell pointed at, in a line below the matrix
  const cell = event.target.closest("td");
  if (cell) $("matrix-readout").textContent = cell.title;
}

// ---------------------------------------------------------------------------------------------
// Section 4: one character's attention in one head, step by step.
// ---------------------------------------------------------------------------------------------
const SHOWN_VALUES = 8;  // a vector shows its first few numbers until asked for all of them

function vector(name, values) {
  const line = element("div", undefined, "vector");
  const all = Array.from(values, fixed), some = all.slice(0, SHOWN_VALUES);
  const numbers = element("span", name + " = [" + some.join(", ") + (all.length > some.length ? ", \u2026]" : "]"));
  line.appendChild(numbers);
  if (all.length > some.length) {
    const button = element("button", "all " + all.length);
    button.addEventListener("click", () => { numbers.textContent = name + " = [" + all.join(", ") + "]";
                                             button.remove(); });
    line.appendChild(button);
  }
  return line;
}

function step(title, formula, ...contents) {
  const box = element("div", undefined, "step");
  box.appendChild(element("h3", title));
  if (formula) box.appendChild(element("div", formula, "formula"));
  contents.forEach(content => box.appendChild(content));
  return box;
}

function stepValues() {  // the numbers section 3 shows, also what #numbers reports
  const q = query(), l = layer(), h = viewedHead() ?? 0, seen = state.result.layers[l], head = seen.heads[h];
  return { layer: l + 1, head: h + 1, query: q + 1, input: Array.from(seen.input[q]),
           q: Array.from(head.q[q]), keys: head.k.slice(0, q + 1).map(k => Array.from(k)),
           values: head.v.slice(0, q + 1).map(v => Array.from(v)), raw: head.raw[q].slice(0, q + 1),
           scores: head.scores[q].slice(0, q + 1), weights: head.weights[q].slice(0, q + 1),
           out: Array.from(head.out[q]), joined: Array.from(seen.joined[q]),
           output: Array.from(seen.output[q]) };
}

function keyFormula() {
  // How the model computes key j: its projection (W_Q itself when queries and keys share it), then QK-norm and the
  // rotary turn where the model has them, as for the query.
  if (config.attention_score === "uniform") return "no keys: every score is 0";
  let key = "x\u2c7c " + (config.shared_qk ? "W_Q" : "W_K") + (config.bias ? (config.shared_qk ? " + b_Q" : " + b_K")
    : "");
  if (config.qk_norm) key = "rms-norm(" + key + ")";
  if (config.position === "rope") key = "R(j) " + (config.qk_norm ? key : "(" + key + ")");
  return "k\u2c7c = " + key;
}

function keysAndValues(v) {  // k_j and v_j for every key the chosen query sees, in a box that folds
  const box = element("details");
  box.open = v.keys.length <= 8;
  box.appendChild(element("summary", v.keys.length + " keys and values"));
  v.keys.forEach((k, j) => {
    if (config.attention_score !== "uniform") box.appendChild(vector("k" + (j + 1), k));
    box.appendChild(vector("v" + (j + 1), v.values[j]));
  });
  return box;
}

function renderSteps() {
  const steps = $("steps");
  steps.replaceChildren();
  const q = query();
  if (q === null) { $("step-title").textContent = "type some text first"; return; }
  const v = stepValues(), i = q + 1, form = config.attention_score, scaled = form === "scaled_dot" || whatIf();
  $("step-title").textContent = quoted(state.text[q]) + " (character " + i + "), layer " + v.layer + ", head " +
    v.head + (viewedHead() === null ? " (choose a head above to see another)" : "");
  const head = state.result.layers[v.layer - 1].heads[v.head - 1];
  steps.appendChild(step("The input: character " + i + " as the block sees it",
    config.residual ? "x" + i + " = LayerNorm(residual stream at character " + i + "), " + config.n_embd +
      " numbers" : "x" + i + " = the previous layer's output, " + config.n_embd + " numbers",
    vector("x" + i, v.input)));
  if (form === "uniform") {
    steps.appendChild(step("No queries or keys (attention_score uniform)", "every visible key scores 0, so the " +
      "softmax gives each of the " + i + " the same weight 1/" + i));
  } else {
    const projected = [vector("q" + i, head.projected.q[q])];
    if (config.qk_norm) projected.push(element("div", "QK-norm: q \u2190 q / rms(q)", "formula"));
    if (config.position === "rope") projected.push(element("div", "rotary positions: q \u2190 R(" + i + ") q " +
      "(each pair of numbers turned by an angle that grows with the position)", "formula"));
    if (config.qk_norm || config.position === "rope") projected.push(vector("q" + i, v.q));
    steps.appendChild(step("The query: what character " + i + " is looking for",
      "q" + i + " = x" + i + " W_Q" + (config.bias ? " + b_Q" : "") + ", " + headSize + " numbers (head " +
      v.head + "'s share of the " + config.n_embd + ")" + (config.shared_qk ? "; keys come from the same W" : ""),
      ...projected));
  }
  const table = element("table", undefined, "numbers");
  const scoreName = form === "additive" ? "w\u00b7tanh(q" + i + " + k\u2c7c)" : "q" + i + "\u00b7k\u2c7c";
  const header = ["j", "key", scoreName];
  if (scaled) header.push(factorName() + (whatIf() ? " (what-if)" : ""));
  header.push("mask", "softmax \u03b1" + i + "\u2c7c");
  const top = table.insertRow();
  header.forEach(name => top.appendChild(element("th", name)));
  state.text.slice(0, q + 1).forEach((ch, j) => {
    const row = table.insertRow(), cells = [String(j + 1), key(ch), fixed(v.raw[j])];
    if (scaled) cells.push(fixed(v.scores[j]));
    cells.push("kept", v.weights[j].toFixed(4));
    cells.forEach(text => row.appendChild(element("td", text)));
    const bar = row.insertCell().appendChild(element("span", undefined, "bar"));  // the weight, drawn
    bar.style.width = (v.weights[j] * 8).toFixed(2) + "rem";
    bar.parentNode.style.textAlign = "left";
  });
  if (q + 1 < state.text.length) {  // the future keys, in one row: the mask gives them all weight 0
    const row = table.insertRow(), after = state.text.slice(q + 1);
    row.className = "masked";
    const keys = (q + 2) + (after.length > 1 ? "\u2013" + state.text.length : "");
    const cells = [keys, after.slice(0, 6).map(key).join("") + (after.length > 6 ? "\u2026" : ""), "\u2014"];
    if (scaled) cells.push("\u2014");
    cells.push("\u2212\u221e (future)", "0");
    cells.forEach(text => row.appendChild(element("td", text)));
  }
  steps.appendChild(step("The keys and values character " + i + " sees",
    keyFormula() + "; v\u2c7c = " + (config.attention_values ? "x\u2c7c W_V" + (config.bias ? " + b_V" : "") :
      "head " + v.head + "'s slice of x\u2c7c") + ", for j = 1 to " + i + " (the keys after " + i + " are masked)",
    keysAndValues(v)));
  const scoring = form === "additive" ? "additive scores: s\u2c7c = w\u00b7tanh(q + k\u2c7c), one w per head" :
    form === "dot" ? "dot-product scores, not scaled (attention_score dot): s\u2c7c = q\u00b7k\u2c7c" :
    form === "uniform" ? "every score is 0" : "scaled dot-product scores: s\u2c7c = q\u00b7k\u2c7c / \u221ad, d = " +
      headSize + ", so their spread does not grow with d";
  steps.appendChild(step("Scores, the causal mask and the softmax over the keys k\u2c7c",
    scoring + "; keys after character " + i + " are masked to \u2212\u221e (weight 0); \u03b1 = softmax(s) = " +
    "exp(s\u2c7c) / \u03a3 exp(s)", table));
  steps.appendChild(step("The weighted sum of the values v\u2c7c",
    "head output = \u03a3\u2c7c \u03b1" + i + "\u2c7c v\u2c7c" + (config.attention_values ? "" :
      " (no value projection: v\u2c7c is head " + v.head + "'s slice of x\u2c7c)"), vector("y" + i, v.out)));
  steps.appendChild(step("All " + nHeads + " heads side by side",
    "concat(head 1, \u2026, head " + nHeads + "): " + config.n_embd + " numbers; head " + v.head + "'s are " +
      ((v.head - 1) * headSize + 1) + " to " + v.head * headSize, vector("concat", v.joined)));
  steps.appendChild(step("The output projection", "o" + i + " = concat W_O" + (config.bias ? " + b_O" : "") +
    (config.residual ? ", added to the residual stream: x \u2190 x + o" : ", the block's attention output"),
    vector("o" + i, v.output)));
}

// ---------------------------------------------------------------------------------------------
// Section 5: the next character after the whole text.
// ---------------------------------------------------------------------------------------------
function sampling() {
  return { temperature: Number($("temperature").value), top_k: Math.max(0, Math.floor(Number($("top-k").value))),
           top_p: Number($("top-p").value) };
}

function nextProbabilities() {
  const { temperature, top_k: topK, top_p: topP } = sampling(), logits = state.result.logits;
  return nextCharacterProbabilities(Array.from(logits[logits.length - 1]), temperature, topK, topP);
}

function renderNext() {
  const s = sampling(), table = $("next");
  $("temperature-value").textContent = s.temperature.toFixed(2);
  $("top-p-value").textContent = s.top_p.toFixed(2);
  table.replaceChildren();
  $("append").disabled = !state.result;
  if (!state.result) return;
  const probs = nextProbabilities();
  probs.map((p, id) => [p, id]).filter(([p]) => p > 0).sort((a, b) => b[0] - a[0]).slice(0, 12)
    .forEach(([p, id]) => {
      const row = table.insertRow();
      row.appendChild(element("td", quoted(vocab[id]), "mono"));
      const bar = row.insertCell().appendChild(element("span", undefined, "bar"));
      bar.style.width = (p * 20).toFixed(2) + "rem";
      row.appendChild(element("td", (100 * p).toFixed(1) + "%"));
    });
}

function appendSampled() {
  if (!state.result) return;
  if (!state.random) state.random = seededRandom(Number($("seed").value));
  $("input").value += vocab[drawCharacter(nextProbabilities(), state.random)];
  update();
}

// ---------------------------------------------------------------------------------------------
// Wiring, and the address: #text=...&layer=2&view=3&query=5&temperature=0.8&top_k=5&top_p=0.9&seed=7&append=10
// opens the page in that state (layers, heads and characters counted from 1; append at most MAX_APPEND characters);
// &hover=N points at character N with a real mouse event; &numbers shows the page's numbers as JSON; &bench=N times
// N forward passes (at most MAX_BENCH). The line #address-help says the same to the reader.
// ---------------------------------------------------------------------------------------------
function render() {
  $("what-if").hidden = !whatIf();
  if (whatIf()) {
    $("what-if").textContent = "What-if: every q·k multiplied by " + factorName() + ", not by the model's own " +
      FACTORS[OWN_FACTOR][0] + " that it was trained with; every number on the page, the next character too, is " +
      "what the model would compute so.";
  }
  if (state.result) { renderStrip(); renderMatrix(); } else {
    $("readout").textContent = "";
    $("matrix").replaceChildren();
  }
  renderSteps();
  renderNext();
}

function update() {
  readText();
  buildStrip();
  render();
}

function numbers(extra) {
  const logits = state.result ? state.result.logits.map(row => Array.from(row)) : [];
  const shownMatrices = state.result ? Object.fromEntries(matrices(layer(), viewedHead() ?? 0).map(m => [m.name,
    m.values.map(row => Array.from(row, value => (value === -Infinity ? null : value)))])) : null;
  return JSON.stringify({ text: state.text.join(""), ids: state.text.map(ch => idOf.get(ch)), logits,
                          matrices: shownMatrices, scale: scoreFactor(), step: state.result ? stepValues() : null,
                          sampling: sampling(), probs: state.result ? nextProbabilities() : null, ...extra });
}

for (let l = 0; l < nLayers; l++) $("layer").add(new Option(String(l + 1), String(l)));
$("view").add(new Option("all heads", "all"));
for (let h = 0; h < nHeads; h++) $("view").add(new Option(String(h + 1), String(h)));
$("title").textContent = data.title;
$("about").textContent = data.about;
$("append-most").textContent = String(MAX_APPEND);
$("input").value = data.text;
$("input").addEventListener("input", update);
["layer", "view", "matrix-step"].forEach(id => $(id).addEventListener("change", render));
for (const [value, [name]] of Object.entries(FACTORS)) {
  $("scale").add(new Option(name + (value === OWN_FACTOR ? " (the model's own)" : " (what-if)"), value));
}
$("scale").value = OWN_FACTOR;
$("scale-control").hidden = !SCALABLE;
$("scale").addEventListener("change", update);
$("matrix").addEventListener("mouseover", pointAtMatrix);
$("matrix-previous").addEventListener("click", () => { moveStep(-1); });
$("matrix-next").addEventListener("click", () => { moveStep(1); });
function moveStep(by) {
  const select = $("matrix-step");
  select.value = String(Math.max(0, Math.min(select.options.length - 1, Number(select.value) + by)));
  render();
}
["temperature", "top-k", "top-p"].forEach(id => $(id).addEventListener("input", renderNext));
$("seed").addEventListener("input", () => { state.random = null; });
$("append").addEventListener("click", appendSampled);

const wanted = new URLSearchParams(location.hash.slice(1));
if (wanted.has("text")) $("input").value = wanted.get("text");
function choose(select, value) {  // an option the address names, if the page has it
  if (Array.from(select.options).some(option => option.value === value)) select.value = value;
}
if (wanted.has("layer")) choose($("layer"), String(Number(wanted.get("layer")) - 1));
if (wanted.has("view")) choose($("view"), wanted.get("view") === "all" ? "all" : String(Number(wanted.get("view")) - 1));
if (wanted.has("scale")) choose($("scale"), wanted.get("scale"));
for (const [key, id] of [["temperature", "temperature"], ["top_k", "top-k"], ["top_p", "top-p"], ["seed", "seed"]]) {
  if (wanted.has(key)) $(id).value = wanted.get(key);
}
update();
const asked = Number(wanted.get("query")) - 1;  // a character of the text, or none
if (Number.isInteger(asked) && asked >= 0 && asked < state.text.length) { state.pinned = asked; render(); }
const appends = Math.min(Math.floor(Number(wanted.get("append"))) || 0, MAX_APPEND);  // NaN, negative: none
for (let n = 0; n < appends; n++) appendSampled();
if (wanted.has("hover")) {
  const span = $("strip").querySelectorAll(".ch")[Number(wanted.get("hover")) - 1];
  if (span) span.dispatchEvent(new MouseEvent("mouseover", { bubbles: true }));
}
if (wanted.has("numbers") || wanted.has("bench")) {
  const extra = {};
  if (wanted.has("bench")) {  // the median of N forward passes over the text, in milliseconds
    const ids = state.text.map(ch => idOf.get(ch)), times = [];
    for (let n = 0; n < Math.min(Number(wanted.get("bench")), MAX_BENCH); n++) {
      const start = performance.now();
      forward(model, ids);
      times.push(performance.now() - start);
    }
    times.sort((a, b) => a - b);
    extra.bench_ms = times[Math.floor(times.length / 2)];
    extra.bench_all_ms = times;
  }
  $("numbers").textContent = numbers(extra);
  $("numbers").hidden = false;
}
