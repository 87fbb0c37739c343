// model/'s forward pass in plain JavaScript, keeping every value the page shows; names as in model/*.py.
// Vectors are Float64Arrays, one per position; a Linear's weight is a Float32Array, out x in as in torch.
"use strict";

function linear(xs, { weight, bias }) {
  // nn.Linear, four positions at a time (one weight read, four sums); past the end the last one stands in.
  const nIn = xs[0].length, nOut = weight.length / nIn, ys = xs.map(() => new Float64Array(nOut));
  const last = xs.length - 1, at = (t, k) => Math.min(t + k, last);
  for (let t = 0; t <= last; t += 4) {
    const x0 = xs[t], x1 = xs[at(t, 1)], x2 = xs[at(t, 2)], x3 = xs[at(t, 3)];
    const y0 = ys[t], y1 = ys[at(t, 1)], y2 = ys[at(t, 2)], y3 = ys[at(t, 3)];
    for (let o = 0; o < nOut; o++) {
      let s0 = bias ? bias[o] : 0, s1 = s0, s2 = s0, s3 = s0;
      for (let i = 0, w = o * nIn; i < nIn; i++, w++) {
        const weightOI = weight[w];
        s0 += weightOI * x0[i];
        s1 += weightOI * x1[i];
        s2 += weightOI * x2[i];
        s3 += weightOI * x3[i];
      }
      y3[o] = s3;
      y2[o] = s2;
      y1[o] = s1;
      y0[o] = s0;
    }
  }
  return ys;
}

function layerNorm(x, { weight, bias }) {  // nn.LayerNorm
  const n = x.length;
  let mean = 0, variance = 0;
  for (let i = 0; i < n; i++) mean += x[i];
  mean /= n;
  for (let i = 0; i < n; i++) variance += (x[i] - mean) ** 2;
  const scale = 1 / Math.sqrt(variance / n + 1e-5), y = new Float64Array(n);
  for (let i = 0; i < n; i++) y[i] = (x[i] - mean) * scale * weight[i] + (bias ? bias[i] : 0);
  return y;
}

const FLOAT32_EPS = 1.1920928955078125e-7;  // F.rms_norm's epsilon for float32

function rmsNorm(x) {  // F.rms_norm without a weight (QK-norm)
  let meanSquare = 0;
  for (let i = 0; i < x.length; i++) meanSquare += x[i] * x[i];
  const scale = 1 / Math.sqrt(meanSquare / x.length + FLOAT32_EPS);
  return x.map(value => value * scale);
}

function erf(x) {  // Abramowitz and Stegun 7.1.26: within 1.5e-7 of the error function
  const sign = x < 0 ? -1 : 1, a = Math.abs(x), t = 1 / (1 + 0.3275911 * a);
  const poly = t * (0.254829592 + t * (-0.284496736 + t * (1.421413741 + t * (-1.453152027 + t * 1.061405429))));
  return sign * (1 - poly * Math.exp(-a * a));
}

const ACTIVATIONS = {
  gelu: x => 0.5 * x * (1 + erf(x / Math.SQRT2)),  // nn.GELU()
  relu2: x => (x > 0 ? x * x : 0),
};

// rope_tables, in float32 as torch computes them (Math.fround).
function ropeTables(blockSize, headSize, base) {
  const half = headSize / 2, cos = [], sin = [];
  const frequencies = Array.from({ length: half },
    (_, i) => Math.fround(base ** Math.fround(-(2 * i) / headSize)));
  for (let position = 0; position < blockSize; position++) {
    const c = new Float64Array(headSize), s = new Float64Array(headSize);
    for (let i = 0; i < half; i++) {  // i and i + half turn by one angle
      const angle = Math.fround(position * frequencies[i]);
      c[i] = c[i + half] = Math.fround(Math.cos(angle));
      s[i] = s[i + half] = Math.fround(Math.sin(angle));
    }
    cos.push(c);
    sin.push(s);
  }
  return { cos, sin, frequencies };
}

function applyRope(x, cos, sin) {  // turn each pair (x[i], x[i + half]) by its position's angle
  const half = x.length / 2, y = new Float64Array(x.length);
  for (let i = 0; i < half; i++) {
    y[i] = x[i] * cos[i] - x[i + half] * sin[i];
    y[i + half] = x[i + half] * cos[i + half] + x[i] * sin[i + half];
  }
  return y;
}

function dot(a, b) {
  let sum = 0;
  for (let i = 0; i < a.length; i++) sum += a[i] * b[i];
  return sum;
}

function softmax(scores) {  // less the largest score: no overflow
  let top = -Infinity, total = 0;
  for (const s of scores) if (s > top) top = s;
  const e = scores.map(s => (s === -Infinity ? 0 : Math.exp(s - top)));  // a masked score: weight 0
  for (const value of e) total += value;
  return e.map(value => value / total);
}

// ---- Attention, one head at a time, whole T x T matrices
function additiveScores(q, k, w) {  // S[i][j] = w · tanh(q_i + k_j)
  return q.map(qi => k.map(kj => {
    let sum = 0;
    for (let d = 0; d < w.length; d++) sum += w[d] * Math.tanh(qi[d] + kj[d]);
    return sum;
  }));
}

function causalMask(scores) {  // keys after the query: -inf (weight 0)
  return scores.map((row, i) => row.map((s, j) => (j <= i ? s : -Infinity)));
}

function projections(config, attn, x) {
  // x -> q, k, v per head from c_attn (no k when shared_qk, no q or k for the uniform form).
  const { n_head: nHead, n_embd: nEmbd, head_size: headSize } = config;
  const made = attn.c_attn ? linear(x, attn.c_attn) : [];
  const learnedQK = config.form.scores === "none" ? 0 : config.shared_qk ? 1 : 2;
  const part = (index, h) => {
    const start = index * nEmbd + h * headSize;
    return made.map(row => row.subarray(start, start + headSize));
  };
  const heads = Array.from({ length: nHead }, (_, h) => h);
  const v = heads.map(h => (config.attention_values ? part(learnedQK, h) :  // without values: the head's slice of x
    x.map(row => row.subarray(h * headSize, (h + 1) * headSize))));
  const q = heads.map(h => (learnedQK ? part(0, h) : x.map(() => new Float64Array(headSize))));
  const k = heads.map((h, at) => (learnedQK === 2 ? part(1, h) : q[at]));
  return { q, k, v };
}

function attention(config, attn, x, rope, scoreFactor) {
  // CausalSelfAttention.forward, keeping each head's every matrix; scoreFactor multiplies q·k, not additive scores.
  const { n_head: nHead, head_size: headSize } = config, form = config.form.scores, T = x.length;
  const made = projections(config, attn, x), heads = [];
  for (let h = 0; h < nHead; h++) {
    let q = made.q[h], k = made.k[h];
    const v = made.v[h], projected = { q, k };
    if (config.qk_norm) { q = q.map(rmsNorm); k = k.map(rmsNorm); }
    if (rope) {
      const turn = rows => rows.map((row, t) => applyRope(row, rope.cos[t], rope.sin[t]));
      q = turn(q);
      k = turn(k);
    }
    const raw = form === "additive" ? additiveScores(q, k, attn.w_score.subarray(h * headSize, (h + 1) * headSize))
      : q.map(qi => k.map(kj => dot(qi, kj)));  // S = Q Kᵀ (0 for the uniform form)
    const factor = form === "additive" ? 1 : scoreFactor;
    const scores = causalMask(raw.map(row => row.map(s => s * factor)));  // scaled BEFORE the softmax
    const weights = scores.map(softmax);
    const out = weights.map(row => {  // A·V
      const y = new Float64Array(headSize);
      for (let j = 0; j < T; j++) if (row[j]) for (let d = 0; d < headSize; d++) y[d] += row[j] * v[j][d];
      return y;
    });
    heads.push({ projected, q, k, v, raw, scores, weights, out });
  }
  const joined = x.map((_, t) => {  // the heads' outputs side by side
    const row = new Float64Array(config.n_embd);
    heads.forEach((one, h) => row.set(one.out[t], h * headSize));
    return row;
  });
  return { heads, joined, output: linear(joined, attn.c_proj) };
}

// ---- The block, the MLP, the model
function mlp(config, weights, xs) {
  // MLP.forward, keeping the hidden layer.
  const activation = ACTIVATIONS[config.activation];
  const hidden = linear(xs, weights.c_fc).map(row => row.map(activation));
  return { hidden, output: linear(hidden, weights.c_proj) };
}

function add(xs, changes) {  // the residual connection
  return xs.map((row, t) => {
    const sum = Float64Array.from(row), change = changes[t];
    for (let d = 0; d < sum.length; d++) sum[d] += change[d];
    return sum;
  });
}

function block(config, weights, x, rope, scoreFactor) {
  // Block.forward: x + attn(ln_1(x)), then x + mlp(ln_2(x)); without residuals, x = attn(x), then x = mlp(x).
  // seen: attention's input and values; seen.stream: every vector on the way.
  const residual = config.residual, stream = { input: x };
  if (residual) stream.ln_1 = x.map(row => layerNorm(row, weights.ln_1));
  const input = residual ? stream.ln_1 : x;
  const seen = { input, ...attention(config, weights.attn, input, rope, scoreFactor), stream };
  stream.attention = seen.output;
  x = residual ? add(x, seen.output) : seen.output;
  if (residual) stream.afterAttention = x;
  if (weights.mlp) {
    if (residual) stream.ln_2 = x.map(row => layerNorm(row, weights.ln_2));
    const ff = mlp(config, weights.mlp, residual ? stream.ln_2 : x);
    stream.hidden = ff.hidden;
    stream.mlp = ff.output;
    x = residual ? add(x, ff.output) : ff.output;
  }
  stream.output = x;
  return { x, seen };
}

function embedding(model, ids) {
  // wte(idx), plus wpe(positions) if learned.
  const { config, weights } = model, nEmbd = config.n_embd;
  const tokens = ids.map(id => weights.wte.weight.subarray(id * nEmbd, (id + 1) * nEmbd));
  const positions = weights.wpe ? ids.map((_, t) => weights.wpe.weight.subarray(t * nEmbd, (t + 1) * nEmbd)) : null;
  const x = positions ? add(tokens, positions) : tokens.map(row => Float64Array.from(row));
  return { tokens, positions, x };
}

function head(config, weights, x) {
  // ln_f, lm_head (tied: wte), then the optional soft-cap.
  const normed = x.map(row => layerNorm(row, weights.ln_f));
  const logits = linear(normed, weights.lm_head || weights.wte);
  const cap = config.logit_softcap || 0;
  return { normed, logits: cap ? logits.map(row => row.map(v => cap * Math.tanh(v / cap))) : logits };
}

function forward(model, ids, options = {}) {
  // GPT.forward; options.scoreFactor: a what-if factor on q·k.
  const { config, weights, rope } = model;
  const scoreFactor = options.scoreFactor ?? (config.form.scaled ? 1 / Math.sqrt(config.head_size) : 1);
  const embedded = embedding(model, ids), layers = [];
  let x = embedded.x;
  for (const weightsOfBlock of weights.blocks) {
    const done = block(config, weightsOfBlock, x, rope, scoreFactor);
    x = done.x;
    layers.push(done.seen);
  }
  const { normed, logits } = head(config, weights, x);
  return { logits, layers, embedded, normed };
}

// ---- The weights: one float32 block, cut into the state dict's tensors (blocks[0].attn.c_attn.weight)
function loadModel(data) {
  const bytes = Uint8Array.from(atob(data.weights), c => c.charCodeAt(0));
  const all = new Float32Array(bytes.buffer), weights = { blocks: [] };
  for (const [name, [start, end]] of Object.entries(data.tensors)) {
    const path = name.split(".");
    let at = weights;
    for (const part of path.slice(0, -1)) at = at[part] ?? (at[part] = {});
    at[path[path.length - 1]] = all.subarray(start, end);
  }
  const config = { ...data.config, head_size: data.config.n_embd / data.config.n_head, form: data.form,
                   rope_base: data.rope_base };
  const rope = config.position === "rope" ? ropeTables(config.block_size, config.head_size, config.rope_base) : null;
  return { config, weights, rope };
}
