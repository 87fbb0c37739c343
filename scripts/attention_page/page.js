// The page's views, recomputed from gpt.js's forward pass when the text changes.
"use strict";

const data = JSON.parse(document.getElementById("data").textContent);
const model = loadModel(data);
const config = model.config, nLayers = config.n_layer, nHeads = config.n_head, headSize = config.head_size;
const vocab = data.vocab.map(code => String.fromCodePoint(code)), idOf = new Map(vocab.map((ch, i) => [ch, i]));
const MAX_APPEND = config.block_size, MAX_BENCH = 1000;
const BLUE = [31, 119, 180], RED = [214, 39, 40], HEAD_RGB = [RED, BLUE, [44, 160, 44], [148, 103, 189],
  [255, 127, 14], [23, 190, 207], [140, 86, 75], [227, 119, 194]];
const $ = id => document.getElementById(id);
const state = { text: [], result: null, pinned: null, hovered: null, random: null, language: "en", stage: null };

// English or Chinese, {0}, {1}, ... filled in; page.html keeps its Chinese in data-zh.
function say(english, chinese, ...values) {
  return (state.language === "zh" ? chinese : english).replace(/\{(\d)\}/g, (_, n) => values[n]);
}

function shown(ch) {  // a visible stand-in for an invisible character; a lone surrogate, its code
  if (ch.length === 1 && ch >= "\ud800" && ch <= "\udfff") return "\\u" + ch.charCodeAt(0).toString(16);
  return ch === "\n" ? "↵" : ch === " " ? "\u00a0" : ch === "\t" ? "→" : ch;
}
function key(ch) { return ch === " " ? "␣" : shown(ch); }
function codePoint(ch) { return "U+" + ch.codePointAt(0).toString(16).toUpperCase().padStart(4, "0"); }
function quoted(ch) {  // a quote mark in quotes is ambiguous: its code point
  return /^["'`\p{Pi}\p{Pf}]$/u.test(ch) ? ch + " (" + codePoint(ch) + ")" : "“" + shown(ch) + "”";
}
function fixed(value) { return value === -Infinity ? "−∞" : value.toFixed(4); }
function tint(rgb, strength) { return rgb.map(c => Math.round(255 + (c - 255) * strength)); }  // over white
function weightRgb(h, weight) { return tint(HEAD_RGB[h % HEAD_RGB.length], Math.sqrt(weight)); }  // small ones show
function signedRgb(value) { return tint(value < 0 ? BLUE : RED, Math.min(1, Math.abs(value))); }  // -1 blue, +1 red
function element(tag, text, className) {
  const node = document.createElement(tag);
  if (text !== undefined) node.textContent = text;
  if (className) node.className = className;
  return node;
}
function addRow(table, tag, texts) {
  const row = table.insertRow();
  texts.forEach(text => row.appendChild(element(tag, text)));
  return row;
}
function bar(row, rem) {  // a new cell with a bar rem wide
  const cell = row.insertCell();
  cell.appendChild(element("span", "", "bar")).style.width = rem.toFixed(2) + "rem";
  return cell;
}
function paren(text) { return say(" ({0})", "（{0}）", text); }
function range(n) { return [...Array(n).keys()]; }
function size(values) { return values.length + " × " + values[0].length; }

// ---- Section 1: the text's last block_size known characters, as sample.py reads them
function characters(text) {
  // By code point; two lone surrogates a text box joined are the two halves the vocabulary knows.
  return Array.from(text).flatMap(ch => (ch.length === 2 && !idOf.has(ch) && idOf.has(ch[0]) && idOf.has(ch[1]) ?
    [ch[0], ch[1]] : [ch]));
}

function readText() {
  const typed = characters($("input").value);
  const unknown = [...new Set(typed.filter(ch => !idOf.has(ch)))];
  let known = typed.filter(ch => idOf.has(ch));
  const most = config.block_size, cut = Math.max(0, known.length - most);
  known = known.slice(cut);
  const notes = [say("{0} of at most {1} characters", "{0} 个字符，最多 {1} 个", known.length, most)];
  if (unknown.length) {
    notes.push(say("skipped, never seen in training: {0}", "已跳过训练中从未见过的字符：{0}",
                   unknown.slice(0, 20).map(quoted).join(" ")));
  }
  if (cut) notes.push(say("the first {0} left out: the model reads at most {1}", "去掉了前 {0} 个：模型最多只读 {1} 个", cut, most));
  $("input-note").textContent = notes.join(say("; ", "；"));
  $("input-note").classList.toggle("warn", unknown.length > 0 || cut > 0);
  $("opening-note").hidden = $("input").value !== data.text;
  state.text = known;
  state.result = known.length ? forward(model, known.map(ch => idOf.get(ch)), { scoreFactor: scoreFactor() }) : null;
  if (state.pinned !== null && state.pinned >= known.length) state.pinned = null;
}

function query() {
  // The character pointed at, else clicked, else the middle one (the last one's mask hides nothing).
  return state.hovered ?? state.pinned ?? (state.text.length ? Math.floor((state.text.length - 1) / 2) : null);
}
function layer() { return Number($("layer").value); }
function viewedHead() { return $("view").value === "all" ? null : Number($("view").value); }
function weightOf(l, head, q, key) {
  return q !== null && key <= q ? state.result.layers[l].heads[head].weights[q][key] : 0;
}

// ---- Section 2: the whole model, step by step along the residual stream
function stages() {
  // Each forward-pass step: name (#numbers), block (0: none), label, code (as in model/gpt.py), T rows.
  const r = state.result, list = [], learned = config.position === "learned", rope = config.position === "rope";
  const add = (name, block, label, code, values) =>
    list.push({ name: (block ? "block" + block + "." : "") + name, block, label, code, values });
  const act = config.activation === "gelu" ? "gelu" : "relu²";
  add("embedding.token", 0, learned ? say("token embedding: the row of each character's id",
    "token 嵌入：按每个字符的编号取出 wte 的一行") : say("token embedding: the residual stream x begins (positions: {0})",
    "token 嵌入：残差流 x 从这里开始（位置：{0}）", rope ? say("rotary, inside attention", "旋转位置编码，在注意力内部") :
    say("none", "没有")), "wte[id]", r.embedded.tokens);
  if (learned) {
    add("embedding.position", 0, say("position embedding: the row of each place t", "位置嵌入：取出第 t 个位置的那一行"),
        "wpe[t]", r.embedded.positions);
    add("embedding.sum", 0, say("x = token + position: the residual stream begins", "x = token + 位置：残差流从这里开始"),
        "wte[id] + wpe[t]", r.embedded.x);
  }
  r.layers.forEach((seen, l) => {
    const b = l + 1, one = seen.stream, heads = say(nHeads === 1 ? "1 head" : "{0} heads", "{0} 个头", nHeads);
    if (config.residual) {
      add("ln_1", b, say("LayerNorm: each row to mean 0, spread 1, then its weight{0}", "LayerNorm：每一行化为均值 0、" +
          "标准差 1，再乘权重{0}", config.bias ? say(" and bias", "、加偏置") : say(" (no bias: --bias false)",
          "（没有偏置：--bias false）")), "ln_1(x)", one.ln_1);
      add("attention", b, say("attention ({0}, then W_O): sections 3–7 open it", "注意力（{0}，再乘 W_O）：第 3–7 节细讲",
          heads), "attn(ln_1(x))", one.attention);
      add("residual_1", b, say("residual add: x keeps what it had, plus what attention brought",
          "残差相加：x 保留原值，再加上注意力的输出"), "x + attn(ln_1(x))", one.afterAttention);
      if (one.mlp) add("ln_2", b, say("LayerNorm again, before the MLP", "MLP 之前再做一次 LayerNorm"), "ln_2(x)", one.ln_2);
    } else {  // without residual connections each part replaces x
      add("attention", b, say("attention ({0}, then W_O), no residual: it replaces x",
          "注意力（{0}，再乘 W_O），没有残差：输出直接取代 x", heads), "x = attn(x)", one.attention);
    }
    if (!one.mlp) return;
    const res = config.residual;
    add("mlp_hidden", b, say("MLP hidden layer, 4 times wider, after {0}", "MLP 的隐藏层：维度扩大到 4 倍，再经过 {0}", act),
        act + (res ? "(c_fc(ln_2(x)))" : "(c_fc(x))"), one.hidden);
    add("mlp", b, res ? say("MLP output: each character alone, back to {0} numbers", "MLP 的输出：每个字符各自计算，变回 {0} 维",
        config.n_embd) : say("MLP output: the block's output, no residual", "MLP 的输出：即块的输出，没有残差"),
        res ? "c_proj(hidden)" : "x = mlp(x)", one.mlp);
    if (res) add("residual_2", b, say("residual add: the block's output", "残差相加：即块的输出"), "x + mlp(ln_2(x))",
                 one.output);
  });
  add("ln_f", 0, say("final LayerNorm", "最后的 LayerNorm"), "ln_f(x)", r.normed);
  add("logits", 0, say("logits: one score per character of the vocabulary; softmax makes them section 8's odds",
      "logits：词表里每个字符一个分数；softmax 把它们变成第 8 节的概率"), (config.tie_weights ? "ln_f(x) wteᵀ" :
      "lm_head(ln_f(x))") + (config.logit_softcap ? ", cap·tanh(·/cap)" : ""), r.logits);
  return list;
}

function largestOf(values) {  // the masked -Infinity left out
  let largest = 0;
  for (const row of values) for (const value of row) if (value > -Infinity) largest = Math.max(largest, -value, value);
  return largest;
}

function paint(canvas, rows, columns, rgbAt) {  // one pixel per cell
  canvas.width = columns;
  canvas.height = rows;
  const context = canvas.getContext("2d"), picture = context.createImageData(columns, rows);
  for (let i = 0, at = 0; i < rows; i++) {
    for (let j = 0; j < columns; j++, at += 4) picture.data.set([...rgbAt(i, j), 255], at);
  }
  context.putImageData(picture, 0, 0);
}

function drawValues(canvas, values) {
  const largest = largestOf(values) || 1;
  paint(canvas, values.length, values[0].length, (t, d) => signedRgb(values[t][d] / largest));
  return largest;
}

function chosenStage(list) { return list.find(one => one.name === state.stage) ?? list[0]; }

function renderModel() {
  const table = $("model"), list = stages();
  table.replaceChildren();
  const top = addRow(table, "th", [say("block", "块"), say("step", "步骤"), say("code", "代码"), say("size", "形状"),
    say("every number", "全部数值")]);
  top.appendChild(element("th", "|x|", "length")).title = say("the length of the chosen character's row",
    "所选字符那一行的长度");
  list.forEach((one, at) => {
    const row = table.insertRow(), first = one.block && (at === 0 || list[at - 1].block !== one.block);
    row.className = "stage" + (first ? " block-start" : "");
    row.dataset.stage = one.name;
    if (first) {
      const cell = row.appendChild(element("td", say("block {0}", "第 {0} 块", one.block), "block"));
      cell.rowSpan = list.filter(other => other.block === one.block).length;
    } else if (!one.block) row.appendChild(element("td"));
    row.append(element("td", one.label, "label"), element("td", one.code, "mono"),
      element("td", size(one.values), "mono"));
    drawValues(row.insertCell().appendChild(element("canvas")), one.values);
    row.appendChild(element("td", "", "length"));
    row.addEventListener("click", () => {
      state.stage = one.name;
      if (one.name.endsWith(".attention")) $("layer").value = String(one.block - 1);
      render();
    });
  });
}

function renderModelChoice() {
  const list = stages(), chosen = chosenStage(list), q = query();
  $("model").querySelectorAll("tr.stage").forEach((row, at) => {
    row.classList.toggle("chosen", list[at].name === chosen.name);
    const values = list[at].values[q];
    row.querySelector("td.length").textContent = q === null ? "" : Math.sqrt(dot(values, values)).toFixed(2);
  });
  const largest = drawValues($("model-picture"), chosen.values), T = chosen.values.length, D = chosen.values[0].length;
  const cell = Math.max(1, Math.min(12, Math.floor(960 / D)));
  $("model-picture").style.width = D * cell + "px";
  $("model-picture").style.height = T * Math.max(cell, Math.min(12, Math.floor(400 / T))) + "px";
  $("model-bar").textContent = say("colour scale: blue −{0}, white 0, red +{0}", "颜色：蓝 −{0}，白 0，红 +{0}",
    largest.toFixed(4));
  $("model-formula").textContent = (chosen.block ? say("Block {0}: ", "第 {0} 块：", chosen.block) : "") +
    say("{0} — {1}, {2}: point at the picture for a number", "{0} — {1}，{2}：指向图看数值", chosen.label, chosen.code,
      size(chosen.values));
  $("model-vector").replaceChildren(vector((chosen.name === "logits" ? "logits" : "x") + (q + 1) +
    paren(quoted(state.text[q])), chosen.values[q]));
}

function pointAtModel(event) {
  if (!state.result) return;
  const chosen = chosenStage(stages()), [t, d] = cellUnder(event), value = chosen.values[t][d];
  const column = chosen.name === "logits" ? say("next character ", "下一个字符 ") + quoted(vocab[d]) :
    say("number {0}", "第 {0} 维", d + 1);
  $("model-readout").textContent = say("character {0} {1}, {2}: {3}", "第 {0} 个字符{1}，{2}：{3}", t + 1,
    quoted(state.text[t]), column, value.toFixed(4));
}

// ---- Section 3: the strip of characters and the grid of heads
function buildStrip() {
  const strip = $("strip"), grid = $("grid");
  strip.replaceChildren();
  grid.replaceChildren();
  state.text.forEach((ch, i) => {
    const span = element("span", shown(ch), "ch");
    span.dataset.position = i + 1;
    span.addEventListener("mouseover", () => { state.hovered = i; render(); });
    span.addEventListener("mouseout", () => { state.hovered = null; render(); });
    span.addEventListener("click", () => { state.pinned = state.pinned === i ? null : i; render(); });
    strip.append(span, ...(ch === "\n" ? [element("br")] : []));
  });
  addRow(grid, "th", ["", ...state.text.map(shown)]);
  for (let h = 0; h < nHeads; h++) {
    const row = addRow(grid, "th", [say("head {0}", "头 {0}", h + 1)]);
    row.cells[0].className = "head";
    state.text.forEach(() => row.insertCell());
  }
}

function renderStrip() {
  const q = query(), l = layer(), head = viewedHead();
  $("grid").style.display = head === null ? "" : "none";
  const shade = (node, h, weight, titled, prefix = "") => {
    node.dataset.weight = weight.toFixed(5);
    node.style.backgroundColor = weight > 0 ? "rgb(" + weightRgb(h, weight) + ")" : "";
    node.title = titled ? prefix + "weight " + weight.toFixed(4) : "";
  };
  $("strip").querySelectorAll(".ch").forEach((span, key) => {
    span.classList.toggle("query", key === q);
    span.classList.toggle("future", q !== null && key > q);
    shade(span, head, head === null ? 0 : weightOf(l, head, q, key), head !== null && q !== null && key <= q);
  });
  Array.from($("grid").rows).slice(1).forEach((row, h) => Array.from(row.cells).slice(1).forEach((cell, key) => {
    const weight = weightOf(l, h, q, key);
    shade(cell, h, weight, weight > 0, "head " + (h + 1) + ", ");
  }));
  const heads = head === null ? range(nHeads) : [head];
  $("readout").textContent = q === null ? "" : say("{0} (character {1}), layer {2}: ", "{0}（第 {1} 个字符），第 {2} 层：",
    quoted(state.text[q]), q + 1, l + 1) + heads.map(h => {
      const top = state.result.layers[l].heads[h].weights[q].slice(0, q + 1).map((w, key) => [w, key])
        .sort((a, b) => b[0] - a[0]).slice(0, 3);
      return say("head {0} looks most at ", "头 {0} 最多看 ", h + 1) + top.map(([w, key]) =>
        say("{0} ({1}) {2}", "{0}（{1}）{2}", quoted(state.text[key]), key + 1, w.toFixed(2))).join(say(", ", "，"));
    }).join(say("; ", "；"));
}

// ---- Section 4: every head's weights A, one pixel per weight
const MASKED_RGB = [85, 85, 85];  // a dark grey no weight's colour reaches

function buildHeads() {
  const table = $("heads");
  table.replaceChildren();
  addRow(table, "th", ["", ...range(nHeads).map(h => say("head {0}", "头 {0}", h + 1))]);
  for (let l = 0; l < nLayers; l++) {
    const row = addRow(table, "th", [say("layer {0}", "第 {0} 层", l + 1)]);
    for (let h = 0; h < nHeads; h++) {
      const canvas = row.insertCell().appendChild(element("canvas"));
      Object.assign(canvas.dataset, { layer: l, head: h });
      canvas.title = say("layer {0}, head {1}: click to open it in the matrices", "第 {0} 层，头 {1}：点击，在矩阵里打开它",
        l + 1, h + 1);
    }
  }
}

function renderHeads() {
  const T = state.text.length;
  $("heads").querySelectorAll("canvas").forEach(canvas => {
    canvas.width = canvas.height = Math.max(T, 1);
    if (!T) return;
    const h = Number(canvas.dataset.head), weights = state.result.layers[canvas.dataset.layer].heads[h].weights;
    paint(canvas, T, T, (i, j) => (j <= i ? weightRgb(h, weights[i][j]) : MASKED_RGB));
  });
}

function cellUnder(event) {
  const canvas = event.target, box = canvas.getBoundingClientRect();
  const at = (offset, size, n) => Math.min(n - 1, Math.max(0, Math.floor(offset / size * n)));
  return [at(event.clientY - box.top, box.height, canvas.height),
          at(event.clientX - box.left, box.width, canvas.width)];
}

function pointAtHeads(event) {
  if (event.target.tagName !== "CANVAS" || !state.result) return;
  const l = Number(event.target.dataset.layer), h = Number(event.target.dataset.head), [i, j] = cellUnder(event);
  const weight = state.result.layers[l].heads[h].weights[i][j];
  $("heads-readout").textContent = say("layer {0}, head {1}: A[{2}][{3}] = {4}, {5} looking at {6}",
    "第 {0} 层，头 {1}：A[{2}][{3}] = {4}，{5}看{6}", l + 1, h + 1, i + 1, j + 1, j <= i ? weight.toFixed(4) :
    say("masked (the future)", "被掩码遮住（未来）"), quoted(state.text[i]), quoted(state.text[j]));
}

function openHead(event) {
  if (event.target.tagName !== "CANVAS") return;
  $("layer").value = event.target.dataset.layer;
  $("view").value = event.target.dataset.head;
  $("matrix-step").value = String(matrices(layer(), viewedHead()).findIndex(m => m.name === "A"));
  render();
  $("matrix-section").scrollIntoView();
}

// ---- The what-if scale: the factor on every q·k
const FACTORS = { sqrt: ["÷√" + headSize, 1 / Math.sqrt(headSize)], 1: ["×1", 1], 10: ["×10", 10] };
const FORM = config.form, OWN_FACTOR = FORM.scaled ? "sqrt" : "1", SCALABLE = FORM.scores === "dot";

function scoreFactor() { return FACTORS[$("scale").value || OWN_FACTOR][1]; }
function factorName(value = $("scale").value || OWN_FACTOR) {
  return FACTORS[value][0] + (value === "1" ? say(", no scale", "，不缩放") : "");
}
function times() {
  const ratio = scoreFactor() / FACTORS[OWN_FACTOR][1];
  return Math.abs(ratio - Math.round(ratio)) < 1e-9 && ratio < 10 ? "" :
    say(" ({0} times it)", "（是它的 {0} 倍）", ratio.toFixed(1));
}
function whatIf() { return SCALABLE && $("scale").value !== OWN_FACTOR; }
function scaledName() { return factorName() + (whatIf() ? say(" (what-if)", "（假设）") : ""); }

// ---- Section 5: one head's whole matrices, in the tutorials' order
// Each page symbol in the tutorials: [tutorial, name, notebook cell]; 002's In [None] never ran.
function tutorialNames() {
  const form = FORM.scores, cell = form === "additive" ? "In [9]" : "In [None]";
  const projection = (letter, word, words, in000, in001) => [["000", letter + " = " + word + "(x)", in000],
    ["001", words + " = x @ W_" + word, in001], ["002", words, cell], ["003", letter.toUpperCase()],
    ["004", letter + "ⁱ = W_" + letter + " aⁱ"]];
  return {
    Q: projection("q", "query", "queries", "In [28]", "In [29]"),
    K: projection("k", "key", "keys", "In [28]", "In [8]"),
    V: projection("v", "value", "values", "In [36]", "In [8]"),
    S: form === "additive" ? [["002", "scores = w_v(tanh(W_q q + W_k k))", "In [9]"]] :
      [["000", "wei = q @ k.transpose(-2, -1)", "In [31]"], ["001", "ω, attn_scores = queries @ keys.T", "In [29]"],
       ["002", "torch.bmm(queries, keys.transpose(1, 2))", "In [None]"], ["003", "q·k"], ["004", "qⁱ·kʲ"]],
    scaled: [["000", say("none: its last cell scales the output instead", "没有：它最后一个单元格缩放的是输出"), "In [48]"],
             ["001", "ω / √d_k", "In [30]"], ["002", "scores = … / math.sqrt(d)", "In [None]"],
             ["003", "q·k / √d_k"], ["004", "αᵢ,ⱼ = qⁱ·kʲ / √d"]],
    masked: [["000", "wei.masked_fill(tril == 0, float('-inf'))", "In [33]"],
             ["001", "masked_simple = attn_weights * mask_simple" + say(", after the softmax, renormalised in In [34]",
               "，在 softmax 之后，In [34] 再逐行归一化"), "In [33]"],
             ["002", "sequence_mask(X, valid_lens, -1e6)" + say(": padding, −1e6 where the page has −∞",
               "：遮住填充，用 −1e6，页面用 −∞"), "In [3]"],
             ["004", say("none: its example lets every token see all three", "没有：它的例子里每个 token 都看得到全部三个")]],
    A: form === "none" ? [["000", "wei = tril / wei.sum(1)", "In [17]"]] :
      [["000", "wei = F.softmax(wei, dim=-1)", "In [33]"], ["001", "α, attn_weights", "In [30]"],
       ["002", "attention_weights = masked_softmax(scores, valid_lens)", cell], ["003", "y = softmax(x)"],
       ["004", "α\u0302ᵢ,ⱼ"]],
    AV: form === "none" ? [["000", "xbow = wei @ x", "In [18]"]] :
      [["000", "out = wei @ v", "In [36]"], ["001", "z, context_vec = attn_weights @ values", "In [15]"],
       ["002", "torch.bmm(attention_weights, values)", cell], ["004", "bⁱ = Σⱼ α\u0302ᵢ,ⱼ vʲ"]],
    x: [["000", "x", "In [26]"], ["001", "embedded_sentence, x⁽ⁱ⁾", "In [4]"], ["004", "aⁱ"]],
    heads: [["001", "torch.cat([head(x) for head in self.heads], dim=-1)", "In [20]"]],
  };
}

function tutorialsLine(...symbols) {
  const box = element("div", "", "hint mono");
  symbols.map(namedIn).filter(Boolean).forEach((line, at) => {
    if (at) box.appendChild(element("br"));
    marked(box, line);
  });
  return box;
}

// A monospace font puts a combining hat beside its letter and lacks ⱼ: α̂ gets a drawn hat, ᵢ,ⱼ and ₁,ⱼ a <sub>.
const SUBSCRIPTS = { "ᵢ": "i", "ⱼ": "j", "₁": "1", ",": "," }, SUBSCRIPT = /^[ᵢⱼ₁]/u;
function marked(node, text) {
  for (const part of text.split(/(α\u0302|[ᵢⱼ₁](?:,[ᵢⱼ₁])?)/u)) {
    if (part === "α\u0302") node.appendChild(element("span", "α", "hat"));
    else if (SUBSCRIPT.test(part)) node.appendChild(element("sub", [...part].map(c => SUBSCRIPTS[c]).join("")));
    else if (part) node.appendChild(document.createTextNode(part));
  }
  return node;
}

function namedIn(symbol) {
  const named = tutorialNames()[symbol] ?? [];
  return named.length ? say("In the tutorials: ", "教程中的记号：") + named.map(([tutorial, name, cell]) =>
    tutorial + (cell ? " " + cell : "") + " " + name).join(" · ") : "";
}

function buildLegend() {
  const table = $("legend"), names = tutorialNames(), tutorials = ["000", "001", "002", "003", "004"];
  table.replaceChildren();
  addRow(table, "th", [say("page", "页面"), ...tutorials]);
  const symbols = { Q: "Q", K: "K", V: "V", S: "S", scaled: say("S scaled", "缩放后的 S"), masked: say("masked", "掩码"),
                    A: "A", AV: "A·V" };
  for (const [symbol, shownName] of Object.entries(symbols)) {
    const row = addRow(table, "th", [shownName]);
    row.dataset.symbol = symbol;
    for (const tutorial of tutorials) {
      const found = (names[symbol] ?? []).find(entry => entry[0] === tutorial);
      marked(row.appendChild(element("td")), found ? found[1] + (found[2] ? " (" + found[2] + ")" : "") : "—");
    }
  }
}

function matrices(l, h) {  // name, label, formula, values, columns ("dims" or "text")
  const head = state.result.layers[l].heads[h], list = [], form = FORM.scores;
  const add = (name, label, formula, values, columns) => list.push({ name, label, formula, values, columns });
  if (form !== "none") {
    const after = [config.qk_norm && "QK-norm", config.position === "rope" && "RoPE"].filter(Boolean)
      .join(say(", ", "、"));
    add("Q", say("Q", "查询 Q"), say("Q: one query per character (row), {0} numbers each",
        "查询 Q：每个字符（行）一个查询，各 {0} 维", headSize) + (after && paren(after)), head.q, "dims");
    add("K", say("K", "键 K"), say("K: one key per character", "键 K：每个字符一个键"), head.k, "dims");
  }
  add("V", say("V", "值 V"), say("V: one value per character", "值 V：每个字符一个值"), head.v, "dims");
  add("S", say("S", "注意力分数 S"), form === "additive" ? say("S = w·tanh(qᵢ + kⱼ) for every pair (additive scores)",
      "S = w·tanh(qᵢ + kⱼ)，每一对都算（加性注意力分数）") : say("S = Q Kᵀ: Sᵢⱼ = qᵢ·kⱼ, every query with every key, the " +
      "future too", "S = Q Kᵀ：Sᵢⱼ = qᵢ·kⱼ，每个查询对每个键，未来的也算"), head.raw, "text");
  if (form === "dot") {
    add("scaled", say("scaled", "缩放"), "S " + scaledName() + say(": the scores the softmax will see",
        "：送进 softmax 的分数"),
        head.raw.map(row => row.map(s => s * scoreFactor())), "text");
  }
  add("masked", say("masked", "掩码"), say("the causal mask: keys after the query −∞ (hatched), weight 0",
      "因果掩码：查询之后的键设为 −∞（斜线），权重为 0"), head.scores, "text");
  add("A", say("A", "注意力权重 A"), say("A = softmax of each row: the attention weights",
      "A = 对每一行做 softmax：注意力权重"), head.weights, "text");
  add("AV", "A·V", say("A·V: the head's output", "A·V：这个头的输出（上下文向量）"), head.out, "dims");
  return list;
}

function renderMatrix() {
  const table = $("matrix"), l = layer(), h = viewedHead() ?? 0, list = matrices(l, h);
  const select = $("matrix-step");
  if (select.options.length !== list.length || select.options[0].text !== "1. " + list[0].label) {
    // A first; Q, K and V of a trained model look like noise
    const chosen = select.options.length ? select.value : String(list.findIndex(m => m.name === "A"));
    select.replaceChildren(...list.map((m, i) => new Option((i + 1) + ". " + m.label, String(i))));
    select.value = chosen;
  }
  const at = Math.min(Number(select.value) || 0, list.length - 1), shownMatrix = list[at];
  select.value = String(at);
  $("matrix-formula").textContent = say("Layer {0}, head {1}: ", "第 {0} 层，头 {1}：", l + 1, h + 1) + shownMatrix.formula;
  $("matrix-tutorials").replaceChildren();
  marked($("matrix-tutorials"), namedIn(shownMatrix.name));
  $("legend").querySelectorAll("tr[data-symbol]").forEach(row => {
    row.classList.toggle("chosen", row.dataset.symbol === shownMatrix.name);
  });
  const values = shownMatrix.values, weights = shownMatrix.name === "A", q = query(), largest = largestOf(values);
  table.replaceChildren();
  const width = values[0].length, written = values.length <= SMALL_MATRIX && width <= SMALL_MATRIX;
  table.classList.toggle("written", written);
  colourBar(largest, weights, values.some(row => Array.prototype.includes.call(row, -Infinity)));
  addRow(table, "th", ["", ...range(width).map(j => (shownMatrix.columns === "text" ? key(state.text[j]) :
    String(j + 1)))]);
  values.forEach((row, i) => {
    const tr = table.insertRow();
    tr.className = i === q ? "chosen" : "";
    const label = tr.appendChild(element("th", key(state.text[i]) + " " + (i + 1)));
    label.title = say("character {0}: click to explain it step by step", "第 {0} 个字符：点击，逐步解释它", i + 1);
    Array.from(row).forEach((value, j) => {
      const cell = tr.insertCell();
      cell.dataset.value = String(value);
      if (value === -Infinity) cell.className = "masked";
      else {
        const share = value / (largest || 1), strength = weights ? Math.sqrt(value) : Math.abs(share);
        cell.style.backgroundColor = "rgb(" + (weights ? tint(BLUE, strength) : signedRgb(share)) + ")";
        if (written && strength > 0.7) cell.style.color = "#fff";
      }
      if (written) cell.textContent = value === -Infinity ? "−∞" : value.toFixed(2);
      cell.title = say(shownMatrix.name, shownMatrix.label) + "[" + (i + 1) + "][" + (j + 1) + "] = " + fixed(value);
    });
    tr.addEventListener("click", () => {
      state.pinned = i;
      render();
      $("steps-section").scrollIntoView();
    });
  });
}

const SMALL_MATRIX = 12;

function colourBar(largest, weights, masked) {
  const scale = $("matrix-bar"), ramp = element("span", "", "ramp");
  ramp.style.background = weights ? "linear-gradient(to right, #fff, rgb(31,119,180))" :
    "linear-gradient(to right, rgb(31,119,180), #fff, rgb(214,39,40))";
  scale.replaceChildren(say("colours: ", "颜色：") + (weights ? "0 " : "−" + largest.toFixed(4) + " "), ramp,
    weights ? " 1" + say(" (strength √weight, so that small weights show)", "（深浅按 √权重，小权重也看得见）") :
      " +" + largest.toFixed(4));
  if (masked) scale.append(say("; ", "；"), element("span", "", "hatched"), say(" −∞ (masked)", " −∞（被掩码遮住）"));
}

function pointAtMatrix(event) {
  const cell = event.target.closest("td");
  if (cell) $("matrix-readout").textContent = cell.title;
}

// ---- Section 6: positions

function positionSimilarities() {
  const table = model.weights.wpe.weight, n = config.block_size, nEmbd = config.n_embd;
  const rows = Array.from({ length: n }, (_, t) => table.subarray(t * nEmbd, (t + 1) * nEmbd));
  const norms = rows.map(row => Math.sqrt(dot(row, row)));
  return rows.map((a, s) => rows.map((b, t) => dot(a, b) / Math.max(norms[s] * norms[t], 1e-12)));
}

function rotaryDotsByDistance() {
  // q·k of q = k = (1, ..., 1) turned at `from` + distance and at `from`: a function of the distance alone.
  const ones = new Float64Array(headSize).fill(1), { cos, sin } = model.rope;
  const turned = cos.map((_, t) => applyRope(ones, cos[t], sin[t]));
  return [0, Math.floor(config.block_size / 2)].map(from => ({
    from, values: turned.slice(from).map(q => dot(q, turned[from])) }));
}

function distancePlot(curves) {
  // The SVG namespace from the parser: the page names no web address.
  const parsed = document.createElement("div");
  parsed.innerHTML = "<svg></svg>";
  const svgNs = parsed.firstChild.namespaceURI, width = 480, height = 160, pad = 28, n = config.block_size;
  const make = (tag, attributes, text) => {
    const node = document.createElementNS(svgNs, tag);
    for (const [name, value] of Object.entries(attributes)) node.setAttribute(name, value);
    if (text !== undefined) node.textContent = text;
    return node;
  };
  const svg = make("svg", { id: "distance-plot", width, height }), add = (...made) => svg.appendChild(make(...made));
  const x = d => pad + (width - 2 * pad) * d / Math.max(1, n - 1);
  const y = v => height / 2 - (height / 2 - 14) * v / headSize;
  add("line", { x1: pad, x2: width - pad, y1: y(0), y2: y(0), stroke: "#ccc" });
  add("text", { x: pad + 4, y: 10 }, "q·k");
  for (const value of [headSize, 0, -headSize]) add("text", { x: 2, y: y(value) + 4 }, String(value));
  add("text", { x: width - pad - 90, y: height - 2 }, say("distance → ", "距离 → ") + (n - 1));
  const [line, dots] = curves;
  add("polyline", { points: line.values.map((v, d) => x(d) + "," + y(v)).join(" "), fill: "none",
                    stroke: "#1f77b4", "stroke-width": 1.5 });
  for (const curve of curves) {
    curve.values.forEach((value, d) => {
      const dot = add("circle", { cx: x(d), cy: y(value), r: curve === dots ? 2.2 : 1.2,
                                  fill: curve === dots ? "#d62728" : "#1f77b4" });
      Object.assign(dot.dataset, { from: curve.from + 1, distance: d, value });
      dot.appendChild(make("title", {}, say("key at character {0}, query {1} later: q·k = {2}",
        "键在第 {0} 个字符，查询在其后 {1} 个：q·k = {2}", curve.from + 1, d, value.toFixed(4))));
    });
  }
  return svg;
}

function buildPositions() {
  const box = $("positions"), about = $("positions-about");
  box.replaceChildren();
  if (config.position === "none") {
    about.textContent = say("This model has no position information (position none): only the causal mask tells " +
      "it where a character is.", "这个模型没有位置信息（position none）：只有因果掩码告诉它字符在哪里。");
    return;
  }
  if (config.position === "learned") {
    about.textContent = say("Learned positions: a vector pₜ added to the embedding at each of the {0} places. The " +
      "picture shows cos(pₛ, pₜ) of every pair: red alike, blue opposite; a band along the diagonal: neighbours " +
      "learned alike.", "可学习的位置编码：{0} 个位置各有一个向量 pₜ，加到该位置的嵌入上。图中是每一对的 cos(pₛ, pₜ)：" +
      "红色相似，蓝色相反；沿对角线的亮带表示相邻的位置学得相似。", config.block_size);
    const similarities = positionSimilarities(), n = similarities.length;
    const canvas = box.appendChild(element("canvas"));
    canvas.id = "similarity";
    paint(canvas, n, n, (s, t) => signedRgb(similarities[s][t]));
    canvas.addEventListener("mousemove", event => {
      const [s, t] = cellUnder(event);
      $("positions-readout").textContent = "cos(p" + (s + 1) + ", p" + (t + 1) + ") = " +
        similarities[s][t].toFixed(4);
    });
    return;
  }
  const angle = "(t − 1)·θᵢ, θᵢ = " + config.rope_base + "^(−2(i − 1)/" + headSize + ")";
  const middle = Math.floor(config.block_size / 2) + 1, additive = FORM.scores === "additive";
  about.textContent = say("Rotary positions: before scoring, each pair i, i + {0} of character t's query and key " +
    "turns by {1}. A turn keeps lengths, so q·k depends only on the distance: for q = k = (1, …, 1), the line (key " +
    "at character 1) and the red dots (key at {2}) fall on one curve.", "旋转位置编码（RoPE）：打分之前，第 t 个字符的" +
    "查询和键的每一对数（i 和 i + {0}）旋转 {1}。旋转不改变长度，所以 q·k 只取决于距离：q = k = (1, …, 1) 时，蓝线" +
    "（键在第 1 个字符）和红点（键在第 {2} 个）落在同一条曲线上。", headSize / 2, angle, middle) + (additive ?
    say(" (This model scores with w·tanh(q + k), not q·k.)", "（这个模型用 w·tanh(q + k) 打分，不是 q·k。）") : "");
  box.append(distancePlot(rotaryDotsByDistance()), element("table", "", "numbers"));
  box.lastChild.id = "rotary";
}

function renderPositions() {
  const table = $("rotary"), q = query();
  if (!table) return;
  table.replaceChildren();
  const t = q === null ? 1 : q + 1;
  addRow(table, "th", [say("pair i", "第 i 对"), say("numbers", "分量"), say("θᵢ (radians per character)",
    "θᵢ（每个字符的弧度）"), say("angle at character {0} (radians)", "第 {0} 个字符的角度（弧度）", t),
    say("in degrees", "角度（度）"), say("one whole turn every", "转一整圈需要")]);
  model.rope.frequencies.forEach((frequency, i) => {
    const angle = Math.fround((t - 1) * frequency);
    const row = addRow(table, "td", [String(i + 1), (i + 1) + say(" and ", " 和 ") + (i + 1 + headSize / 2),
      frequency.toPrecision(4), angle.toFixed(4), (angle * 180 / Math.PI % 360).toFixed(1) + "°",
      (2 * Math.PI / frequency).toFixed(1) + say(" characters", " 个字符")]);
    Object.assign(row.dataset, { frequency, angle });
  });
}

// ---- Section 7: one character's attention in one head, step by step
const SHOWN_VALUES = 8;

function vector(name, values) {
  const line = element("div", "", "vector");
  const all = Array.from(values, fixed), some = all.slice(0, SHOWN_VALUES);
  const numbers = element("span", name + " = [" + some.join(", ") + (all.length > some.length ? ", …]" : "]"));
  line.appendChild(numbers);
  if (all.length > some.length) {
    const button = element("button", say("all ", "全部 ") + all.length);
    button.addEventListener("click", () => { numbers.textContent = name + " = [" + all.join(", ") + "]";
                                             button.remove(); });
    line.appendChild(button);
  }
  return line;
}

function step(title, formula, ...contents) {
  const box = $("steps").appendChild(element("div", "", "step"));
  box.append(element("h3", title), ...(formula ? [element("div", formula, "formula")] : []), ...contents);
}

function stepValues() {
  const q = query(), l = layer(), h = viewedHead() ?? 0, seen = state.result.layers[l], head = seen.heads[h];
  const past = rows => rows.slice(0, q + 1).map(row => Array.from(row));
  return { layer: l + 1, head: h + 1, query: q + 1, input: Array.from(seen.input[q]), q: Array.from(head.q[q]),
           keys: past(head.k), values: past(head.v), raw: head.raw[q].slice(0, q + 1),
           scores: head.scores[q].slice(0, q + 1), weights: head.weights[q].slice(0, q + 1),
           out: Array.from(head.out[q]), joined: Array.from(seen.joined[q]), output: Array.from(seen.output[q]) };
}

function keyFormula() {
  if (FORM.scores === "none") return say("no keys: every score is 0", "没有键：每个分数都是 0");
  const letter = config.shared_qk ? "Q" : "K";
  let key = "xⱼ W_" + letter + (config.bias ? " + b_" + letter : "");
  if (config.qk_norm) key = "rms-norm(" + key + ")";
  if (config.position === "rope") key = "R(j) " + (config.qk_norm ? key : "(" + key + ")");
  return "kⱼ = " + key;
}

function keysAndValues(v) {
  const box = element("details");
  box.open = v.keys.length <= 8;
  box.appendChild(element("summary", say("{0} keys and values", "{0} 个键和值", v.keys.length)));
  v.keys.forEach((k, j) => {
    if (FORM.scores !== "none") box.appendChild(vector("k" + (j + 1), k));
    box.appendChild(vector("v" + (j + 1), v.values[j]));
  });
  return box;
}

function renderSteps() {
  $("steps").replaceChildren();
  const q = query();
  if (q === null) { $("step-title").textContent = say("type some text first", "请先输入一些文本"); return; }
  const v = stepValues(), i = q + 1, form = FORM.scores, scaled = FORM.scaled || whatIf();
  $("step-title").textContent = say("{0} (character {1}), layer {2}, head {3}", "{0}（第 {1} 个字符），第 {2} 层，头 {3}",
    quoted(state.text[q]), i, v.layer, v.head) + (viewedHead() === null ? say(" (choose a head above to see another)",
    "（要看别的头，请在上面选择）") : "");
  const head = state.result.layers[v.layer - 1].heads[v.head - 1];
  const sized = say(", {0} numbers", "，{0} 维", config.n_embd);
  step(say("The input: character {0} as the block sees it", "输入：块看到的第 {0} 个字符", i),
    "x" + i + " = " + (config.residual ? say("LayerNorm(residual stream)", "LayerNorm(残差流)") : v.layer === 1 ?
      say("its embedding (no LayerNorm, no residual)", "它的嵌入（没有 LayerNorm，没有残差）") :
      say("the previous layer's output (no residual)", "上一层的输出（没有残差）")) + sized,
    vector("x" + i, v.input), tutorialsLine("x"));
  if (form === "none") {
    step(say("No queries or keys (attention_score {0})", "没有查询和键（attention_score {0}）", config.attention_score),
      say("every score is 0, so each of the {0} keys gets 1/{0}", "每个分数都是 0，所以 {0} 个键各得 1/{0}", i));
  } else {
    const projected = [vector("q" + i, head.projected.q[q])];
    if (config.qk_norm) projected.push(element("div", "QK-norm: q ← q / rms(q)", "formula"));
    if (config.position === "rope") {
      projected.push(element("div", say("rotary: q ← R({0}) q (section 6 shows the angles)",
        "旋转位置编码：q ← R({0}) q（角度见第 6 节）", i), "formula"));
    }
    if (config.qk_norm || config.position === "rope") projected.push(vector("q" + i, v.q));
    step(say("The query: what character {0} is looking for", "查询：第 {0} 个字符在找什么", i),
      "q" + i + " = x" + i + " W_Q" + (config.bias ? " + b_Q" : "") + say(", {0} numbers", "，{0} 维", headSize) +
      (config.shared_qk ? say("; keys use the same W", "；键也用同一个 W") : ""), ...projected, tutorialsLine("Q"));
  }
  const table = element("table", "", "numbers");
  const header = ["j", say("key", "键"), form === "additive" ? "w·tanh(q" + i + " + kⱼ)" : "q" + i + "·kⱼ"];
  if (scaled) header.push(scaledName());
  header.push(say("mask", "掩码"), "softmax α" + i + "ⱼ");
  addRow(table, "th", header);
  state.text.slice(0, q + 1).forEach((ch, j) => {
    const cells = [String(j + 1), key(ch), fixed(v.raw[j])];
    if (scaled) cells.push(fixed(v.scores[j]));
    cells.push(say("kept", "保留"), v.weights[j].toFixed(4));
    bar(addRow(table, "td", cells), v.weights[j] * 8).style.textAlign = "left";
  });
  if (q + 1 < state.text.length) {
    const after = state.text.slice(q + 1), keys = (q + 2) + (after.length > 1 ? "–" + state.text.length : "");
    const cells = [keys, after.slice(0, 6).map(key).join("") + (after.length > 6 ? "…" : ""), "—"];
    if (scaled) cells.push("—");
    cells.push("−∞" + say(" (future)", "（未来）"), "0");
    addRow(table, "td", cells).className = "masked";
  }
  step(say("The keys and values character {0} sees", "第 {0} 个字符看到的键和值", i),
    keyFormula() + say("; ", "；") + "vⱼ = " + (config.attention_values ? "xⱼ W_V" + (config.bias ? " + b_V" : "") :
      say("head {0}'s slice of xⱼ", "xⱼ 中属于头 {0} 的一段", v.head)) + say(", ", "，") + "j = 1…" + i,
    keysAndValues(v), tutorialsLine("K", "V"));
  const scoring = form === "additive" ? "sⱼ = w·tanh(q + kⱼ)" : form === "none" ? "sⱼ = 0" :
    "sⱼ = q·kⱼ" + (FORM.scaled ? " / √d, d = " + headSize : say(" (not scaled)", "（不缩放）"));
  step(say("Scores, the causal mask and the softmax over the keys kⱼ", "注意力分数、因果掩码和对键 kⱼ 的 softmax"),
    scoring + say("; keys after {0}: −∞ (weight 0); ", "；第 {0} 个之后的键：−∞（权重 0）；", i) + "α = softmax(s)",
    table, tutorialsLine("S", "scaled", "masked", "A"));
  step(say("The weighted sum of the values vⱼ", "对值 vⱼ 的加权求和"), "y" + i + " = Σⱼ α" + i + "ⱼ vⱼ",
    vector("y" + i, v.out), tutorialsLine("AV"));
  nHeads === 1 ? step(say("The one head's output", "唯一一个头的输出"), "concat = y" + i + sized,
    vector("concat", v.joined)) : step(say("All {0} heads side by side", "拼接全部 {0} 个头", nHeads),
    say("concat(head 1, …, head {0}){1}; head {2}'s: {3}…{4}", "concat(头 1, …, 头 {0}){1}；头 {2} 占第 {3}…{4} 维",
      nHeads, sized, v.head, (v.head - 1) * headSize + 1, v.head * headSize), vector("concat", v.joined),
    tutorialsLine("heads"));
  step(say("The output projection", "输出投影"), "o" + i + " = concat W_O" +
    (config.bias ? " + b_O" : "") + (config.residual ? "; x ← x + o" + i : ""), vector("o" + i, v.output),
    element("div", say("In the tutorials: no W_O; 001 only concatenates (In [20])",
                       "教程里：没有 W_O；001 只是拼接（In [20]）"), "hint mono"));
}

// ---- Section 8: the next character
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
      row.appendChild(element("td")).appendChild(element("span", key(vocab[id]), "mono box"));
      bar(row, p * 20);
      row.appendChild(element("td", (100 * p).toFixed(1) + "%"));
    });
}

function appendSampled() {
  if (!state.result) return;
  if (!state.random) state.random = seededRandom(Number($("seed").value));
  $("input").value += vocab[drawCharacter(nextProbabilities(), state.random)];
  update();
}

// ---- Wiring
function render() {
  $("what-if").hidden = !whatIf();
  if (whatIf()) {
    $("what-if").textContent = say("What-if: the scores are q·k {0}, not q·k {1} as in training{2}; every number on " +
      "the page, the next character too, is what the model computes so.", "假设：注意力分数改为 q·k {0}，而不是训练时的 " +
      "q·k {1}{2}；页面上的每个数，包括下一个字符，都按这个缩放重新计算。", factorName(), FACTORS[OWN_FACTOR][0], times());
  }
  if (state.result) { renderStrip(); renderMatrix(); renderModelChoice(); } else {
    $("readout").textContent = "";
    $("matrix").replaceChildren();
  }
  renderPositions();
  renderSteps();
  renderNext();
}

// ---- The language, and the fonts this browser lacks
function aboutLine(a) {
  return say("{0}: step {1}, {2} layers x {3} heads of {4}, {5} wide, {6}M parameters, trained on {7}",
    "{0}：第 {1} 步，{2} 层 × {3} 个头（每个 {4} 维），嵌入维度 {5}，{6}M 个参数，训练于 {7}", a.path, a.step, a.n_layer,
    a.n_head, a.head_size, a.n_embd, a.millions, a.corpus ?? say("an unrecorded corpus", "未记录的语料"));
}

function openingLine(a) {  // a.because: attention_html.py's reason in English
  const instead = { default: say("Opened on a line of Romeo and Juliet", "打开时是《罗密欧与朱丽叶》中的一行"),
                    written: say("Opened on text the model wrote itself", "打开时是模型自己写的文本") }[a.opening];
  if (instead) {
    return say("{0}, not on the run's own validation text: {1}.", "{0}，而不是这次训练自己的验证文本：{2}。", instead, a.because, {
      unrecorded: "检查点没有记录语料",
      missing: "找不到这次训练的 token 缓存，也找不到它的语料文件",
      changed: "token 缓存已不在，语料文件在训练之后又改过",
      large: "token 缓存已不在，语料文件太大，不再重读（超过 100 MB）",
      short: "其中没有一段 20 个字符以上、且每个字符模型都认识的文本",
    }[a.why]);
  }
  return {
    line: say("Opened on a line of the run's validation text (text it never trained on).",
              "打开时是这次训练的验证文本中的一行（模型没有用它训练过）。"),
    lines: say("Opened on whole lines of the run's validation text, joined with their line breaks (↵): its " +
               "lines are short.", "打开时是这次训练的验证文本中的几整行，连同换行（↵）：它的行都很短。"),
    given: say("Opened on the text given to attention_html.py (--text).", "打开时是交给 attention_html.py 的文本（--text）。"),
    address: say("Opened on the text in the address (#text=).", "打开时是地址里给出的文本（#text=）。"),
  }[a.opening] ?? "";
}

function applyLanguage(language) {
  state.language = language;
  $("language").value = language;
  document.documentElement.lang = say("en", "zh-CN");
  document.querySelectorAll("[data-zh]").forEach(node => {
    if (node.dataset.en === undefined) node.dataset.en = node.innerHTML;
    if (language === "zh") node.textContent = node.dataset.zh.replace(/\s*\n\s*/g, "");
    else node.innerHTML = node.dataset.en;
  });
  $("title").textContent = say(data.title, "你的模型，正在思考");
  document.title = say("chargpt: your model, thinking", "chargpt：你的模型，正在思考");
  $("about").textContent = aboutLine(data.about);
  $("opening-note").textContent = openingLine(data.about);
  const help = say("The address opens the page in a state: `page.html#text=ROMEO&query=3&layer=2&view=1` (view: a " +
    "head, or `all`), also `hover`, `temperature`, `top_k`, `top_p`, `seed`, `append` (at most {0} characters), " +
    "`lang` (en or zh) and `numbers`; characters, layers and heads count from 1.", "地址可以让页面以某种状态打开：" +
    "page.html#text=ROMEO&query=3&layer=2&view=1（view：一个头，或 all），还有 hover、temperature、top_k、top_p、" +
    "seed、append（最多 {0} 个字符）、lang（en 或 zh）和 numbers；字符、层和头都从 1 开始数。", MAX_APPEND);
  const mono = (part, at) => (at % 2 ? element("span", part, "mono") : part);  // `name` in monospace
  $("address-help").replaceChildren(...help.split("`").map(mono));
  document.querySelectorAll(".form-formula").forEach(node => { node.textContent = say(...FORM.formula); });
  $("view").options[0].text = say("all heads", "所有头");
  for (const option of $("scale").options) {
    option.text = factorName(option.value) + (option.value === OWN_FACTOR ? say(" (the model's own)", "（模型自己的）") :
      say(" (what-if)", "（假设）"));
  }
  buildHeads();
  buildPositions();
  buildLegend();
  noteMissingFonts();
}

function missingGlyphs(characters) {
  // Each character drawn and compared with unassigned U+0378, which every font draws as its box.
  const size = 28, canvas = document.createElement("canvas");
  canvas.width = canvas.height = size;
  const context = canvas.getContext("2d", { willReadFrequently: true });
  context.font = "20px " + getComputedStyle($("strip")).fontFamily;
  const draw = ch => {
    context.clearRect(0, 0, size, size);
    context.fillText(ch, 2, 22);
    return new Uint32Array(context.getImageData(0, 0, size, size).data.buffer);
  };
  const box = draw("\u0378");
  return characters.filter(ch => draw(ch).every((pixel, at) => pixel === box[at]));
}

function noteMissingFonts() {
  const drawable = vocab.filter(ch => !/^[\p{Cc}\p{Cf}\p{Cs}\s]$/u.test(ch));
  const missing = missingGlyphs(drawable), chinese = state.language === "zh" && missingGlyphs(["中"]).length > 0;
  const named = missing.slice(0, 12).map(codePoint);
  const what = [missing.length ? missing.length + " of the model's " + drawable.length + " characters (" +
    named.join(" ") + (missing.length > 12 ? " …" : "") + ")" : "", chinese ? "this page's Chinese text" : ""];
  $("font-note").hidden = !missing.length && !chinese;
  $("font-note").textContent = "This browser has no font for " + what.filter(Boolean).join(", nor for ") +
    ", so they show as boxes. Fix (Debian/Ubuntu): sudo apt-get install fonts-noto-cjk, then reload the page." +
    (state.language === "zh" ? " 这个浏览器缺少显示这些字符的字体，它们会显示成方框。请安装字体（Debian/Ubuntu：" +
    "sudo apt-get install fonts-noto-cjk），然后刷新页面。" : "");
}

function headsLook() {  // heads that watch the text's commonest mark ("，" in poems, a space in English)
  const counts = new Map();
  state.text.filter(ch => !/[\p{L}\p{N}\n]/u.test(ch)).forEach(ch => counts.set(ch, (counts.get(ch) ?? 0) + 1));
  const mark = [...counts].sort((a, b) => b[1] - a[1])[0]?.[0];
  const at = mark === undefined ? "" : mark === " " ? say(", at spaces (a column)", "、盯着空格的头（一条竖列）") :
    say(", at {0} (a column; the commonest mark in your text)", "、盯着{0}的头（一条竖列；它是你的文本里最常见的符号）",
      quoted(mark));
  $("heads-look").textContent = say("Look for heads that look one character back (a line under the diagonal){0}, or " +
    "at the start of a line.", "找一找：只看前一个字符的头（对角线下方的一条斜线）{0}，或盯着行首的头。", at);
}

function update() {
  readText();
  headsLook();
  buildStrip();
  if (state.result) renderModel(); else $("model").replaceChildren();
  render();
  renderHeads();
}

function numbers(extra) {  // (JSON writes -Infinity as null)
  const r = state.result, plain = values => values.map(row => Array.from(row));
  const named = list => Object.fromEntries(list.map(one => [one.name, plain(one.values)]));
  return JSON.stringify({ text: state.text.join(""), ids: state.text.map(ch => idOf.get(ch)),
    logits: r ? plain(r.logits) : [], matrices: r ? named(matrices(layer(), viewedHead() ?? 0)) : null,
    scale: scoreFactor(), step: r ? stepValues() : null, model: r ? named(stages()) : null, sampling: sampling(),
    probs: r ? nextProbabilities() : null, ...extra });
}

for (let l = 0; l < nLayers; l++) $("layer").add(new Option(String(l + 1), String(l)));
$("view").add(new Option("all heads", "all"));
for (let h = 0; h < nHeads; h++) $("view").add(new Option(String(h + 1), String(h)));
$("input").value = data.text;
$("input").addEventListener("input", update);
["layer", "view", "matrix-step"].forEach(id => $(id).addEventListener("change", render));
for (const value of Object.keys(FACTORS)) $("scale").add(new Option("", value));
$("scale").value = OWN_FACTOR;
$("scale-control").hidden = !SCALABLE;
$("scale").addEventListener("change", update);
$("language").addEventListener("change", () => { applyLanguage($("language").value); update(); });
$("matrix").addEventListener("mouseover", pointAtMatrix);
$("heads").addEventListener("mousemove", pointAtHeads);
$("model-picture").addEventListener("mousemove", pointAtModel);
$("heads").addEventListener("click", openHead);
$("matrix-previous").addEventListener("click", () => moveStep(-1));
$("matrix-next").addEventListener("click", () => moveStep(1));
function moveStep(by) {
  const select = $("matrix-step");
  select.value = String(Math.max(0, Math.min(select.options.length - 1, Number(select.value) + by)));
  render();
}
["temperature", "top-k", "top-p"].forEach(id => $(id).addEventListener("input", renderNext));
$("seed").addEventListener("input", () => { state.random = null; });
$("append").addEventListener("click", appendSampled);

const wanted = new URLSearchParams(location.hash.slice(1));  // the state the address asks for
if (wanted.has("text")) {
  $("input").value = wanted.get("text");
  data.text = $("input").value;
  data.about.opening = "address";
}
function choose(select, value) {
  if (Array.from(select.options).some(option => option.value === value)) select.value = value;
}
if (wanted.has("layer")) choose($("layer"), String(Number(wanted.get("layer")) - 1));
const view = wanted.get("view");
if (view !== null) choose($("view"), view === "all" ? "all" : String(Number(view) - 1));
if (wanted.has("scale")) choose($("scale"), wanted.get("scale"));
// The sampling controls: model/generate.py's defaults, unless the address sets them.
for (const { name, default: initial } of data.sampling) {
  const id = name.replace("_", "-");
  if (initial !== null) $(id).value = initial;
  if (wanted.has(name)) $(id).value = wanted.get(name);
}
if (wanted.has("seed")) $("seed").value = wanted.get("seed");
const browserLanguage = navigator.language.toLowerCase().startsWith("zh") ? "zh" : "en";
applyLanguage(["en", "zh"].includes(wanted.get("lang")) ? wanted.get("lang") : browserLanguage);
update();
const asked = Number(wanted.get("query")) - 1;
if (Number.isInteger(asked) && asked >= 0 && asked < state.text.length) { state.pinned = asked; render(); }
const appends = Math.min(Math.floor(Number(wanted.get("append"))) || 0, MAX_APPEND);
for (let n = 0; n < appends; n++) appendSampled();
if (wanted.has("hover")) {
  const span = $("strip").querySelectorAll(".ch")[Number(wanted.get("hover")) - 1];
  if (span) span.dispatchEvent(new MouseEvent("mouseover", { bubbles: true }));
}
if (wanted.has("numbers") || wanted.has("bench")) {
  const extra = {};
  if (wanted.has("bench")) {
    const ids = state.text.map(ch => idOf.get(ch)), times = [];
    for (let n = 0; n < Math.min(Number(wanted.get("bench")), MAX_BENCH); n++) {
      const start = performance.now();
      forward(model, ids);
      times.push(performance.now() - start);
    }
    extra.bench_all_ms = times.sort((a, b) => a - b);
  }
  $("numbers").textContent = numbers(extra);
  $("numbers").hidden = false;
}
