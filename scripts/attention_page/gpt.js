// The model of model/ in plain JavaScript: the same forward pass, keeping every intermediate value the page shows.
// Read it beside the Python; each function here is named for its counterpart and nested as it is:
//
//   forward(model, ids, options)         GPT.forward                    model/gpt.py
//     embedding(model, ids)                wte(idx) + wpe(positions)      model/gpt.py
//     block(config, weights, x, rope)      Block.forward                  model/gpt.py
//       layerNorm(x, norm)                   nn.LayerNorm (ln_1, ln_2, ln_f)
//       attention(config, attn, x, ...)      CausalSelfAttention.forward    model/attention.py
//         projections(config, attn, x)         CausalSelfAttention.projections
//         rmsNorm(x)                           F.rms_norm (qk_norm)
//         applyRope(x, cos, sin)               apply_rope                     model/attention.py
//         dotProductScores(q, k)               dot_product_scores (unscaled)  model/scoring.py
//         additiveScores(q, k, w)              additive_scores                model/scoring.py
//         causalMask(scores)                   attention_mask + masked_fill   model/attention.py
//         softmax(row)                         F.softmax
//       mlp(config, weights, x)              MLP.forward                    model/gpt.py
//         ACTIVATIONS.gelu / .relu2            nn.GELU / ReLUSquared
//     head(config, weights, x)             ln_f, then GPT.head: lm_head   model/gpt.py
//                                            and the logit soft-cap
//   linear(xs, layer)                     nn.Linear: the one matrix product
//   ropeTables(blockSize, headSize, base) rope_tables                    model/attention.py
//   loadModel(data)                       GPT(config).load_state_dict    training/checkpoint.py
//
// Vectors are Float64Arrays, one per position; a Linear's weight is a Float32Array of out x in numbers, row after
// row, as torch stores it. The weights keep the state dict's names and nesting: blocks[0].attn.c_attn.weight is
// "blocks.0.attn.c_attn.weight".
"use strict";

// ---------------------------------------------------------------------------------------------
// The pieces: a Linear layer, the norms, the nonlinearities, rotary positions, softmax.
// ---------------------------------------------------------------------------------------------
function linear(xs, { weight, bias }) {
  // nn.Linear for every position's vector x of xs: y[o] = b[o] + W[o] · x. The forward pass spends most of its time
  // here, so positions go four at a time: each weight read from memory serves four positions, and the four sums are
  // independent, so the processor adds them at once. Past the last position the last one stands in (its sums, the
  // same numbers, are written to it again).
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

function layerNorm(x, { weight, bias }) {  // nn.LayerNorm: subtract the mean, divide by the standard deviation
  const n = x.length;
  let mean = 0, variance = 0;
  for (let i = 0; i < n; i++) mean += x[i];
  mean /= n;
  for (let i = 0; i < n; i++) variance += (x[i] - mean) ** 2;
  const scale = 1 / Math.sqrt(variance / n + 1e-5), y = new Float64Array(n);
  for (let i = 0; i < n; i++) y[i] = (x[i] - mean) * scale * weight[i] + (bias ? bias[i] : 0);
  return y;
}

const FLOAT32_EPS = 1.1920928955078125e-7;  // F.rms_norm's epsilon for float32 tensors

function rmsNorm(x) {  // F.rms_norm without a weight (QK-norm): every vector to root-mean-square 1
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
  gelu: x => 0.5 * x * (1 + erf(x / Math.SQRT2)),  // nn.GELU(): x times the normal distribution's P(X <= x)
  relu2: x => (x > 0 ? x * x : 0),  // ReLUSquared: relu(x) squared
};

// Rotary tables as model/attention.py's rope_tables builds them, in float32 as torch does (Math.fround), so the angles are the same.
function ropeTables(blockSize, headSize, base) {
  const half = headSize / 2, cos = [], sin = [];
  const frequencies = Array.from({ length: half },
    (_, i) => Math.fround(base ** Math.fround(-(2 * i) / headSize)));
  for (let position = 0; position < blockSize; position++) {
    const c = new Float64Array(headSize), s = new Float64Array(headSize);
    for (let i = 0; i < half; i++) {  // dimensions i and i + half turn by the same angle
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

function softmax(scores) {  // exp(s - max) / sum: subtracting the largest score changes nothing and cannot overflow
  let top = -Infinity, total = 0;
  for (const s of scores) if (s > top) top = s;
  const e = scores.map(s => (s === -Infinity ? 0 : Math.exp(s - top)));  // a masked score: weight 0
  for (const value of e) total += value;
  return e.map(value => value / total);
}

// ---------------------------------------------------------------------------------------------
// Attention (model/attention.py and model/scoring.py), one head at a time, whole T x T matrices.
// ---------------------------------------------------------------------------------------------
function dotProductScores(q, k) {  // S = Q Kᵀ: S[i][j] = q_i · k_j, for every query i and key j
  return q.map(qi => k.map(kj => dot(qi, kj)));
}

function additiveScores(q, k, w) {  // S[i][j] = w · tanh(q_i + k_j)
  return q.map(qi => k.map(kj => {
    let sum = 0;
    for (let d = 0; d < w.length; d++) sum += w[d] * Math.tanh(qi[d] + kj[d]);
    return sum;
  }));
}

function causalMask(scores) {  // the tril: a query at i may look at keys 0..i; later keys get -inf (weight 0)
  return scores.map((row, i) => row.map((s, j) => (j <= i ? s : -Infinity)));
}

function ownScoreFactor(config) {  // what the model multiplies q·k by before the softmax: 1/√d, or 1
  return config.form.scaled ? 1 / Math.sqrt(config.head_size) : 1;
}

function projections(config, attn, x) {
  // x (T vectors of n_embd) -> q, k, v, each a list over heads of T vectors of head_size, as the form makes them:
  // c_attn makes q, k, v side by side (k missing when shared_qk, q and k missing for the uniform form).
  const { n_head: nHead, n_embd: nEmbd, head_size: headSize } = config;
  const made = attn.c_attn ? linear(x, attn.c_attn) : [];
  const learnedQK = config.form.scores === "none" ? 0 : config.shared_qk ? 1 : 2;
  const part = (index, h) => made.map(row => row.subarray(index * nEmbd + h * headSize,
                                                          index * nEmbd + (h + 1) * headSize));
  const heads = Array.from({ length: nHead }, (_, h) => h);
  const v = heads.map(h => (config.attention_values ? part(learnedQK, h) :  // without values: the head's slice of x
    x.map(row => row.subarray(h * headSize, (h + 1) * headSize))));
  const q = heads.map(h => (learnedQK ? part(0, h) : x.map(() => new Float64Array(headSize))));
  const k = heads.map((h, at) => (learnedQK === 2 ? part(1, h) : q[at]));
  return { q, k, v };
}

function attention(config, attn, x, rope, scoreFactor) {
  // CausalSelfAttention.forward for x, the block's normalised input (T vectors). Returns the output for each position
  // and everything on the way, per head: q and k as projected and as scored (after QK-norm and rotary turns), v,
  // the raw scores S (T x T, before the mask), the scaled and masked scores, the weights A and the output A·V.
  // scoreFactor: what q·k is multiplied by (the model's own: ownScoreFactor); the additive form has none.
  const { n_head: nHead, head_size: headSize } = config, form = config.form.scores, T = x.length;
  const made = projections(config, attn, x), heads = [];
  for (let h = 0; h < nHead; h++) {
    let q = made.q[h], k = made.k[h];
    const v = made.v[h], projected = { q, k };
    if (config.qk_norm) { q = q.map(rmsNorm); k = k.map(rmsNorm); }
    if (rope) {
      q = q.map((row, t) => applyRope(row, rope.cos[t], rope.sin[t]));
      k = k.map((row, t) => applyRope(row, rope.cos[t], rope.sin[t]));
    }
    const raw = form === "additive" ? additiveScores(q, k, attn.w_score.subarray(h * headSize, (h + 1) * headSize))
      : dotProductScores(q, k);  // (0 for the uniform form: every key weighs the same)
    const factor = form === "additive" ? 1 : scoreFactor;
    const scores = causalMask(raw.map(row => row.map(s => s * factor)));  // scaled BEFORE the softmax
    const weights = scores.map(softmax);
    const out = weights.map(row => {  // A·V: each query's weighted sum of the values
      const y = new Float64Array(headSize);
      for (let j = 0; j < T; j++) if (row[j]) for (let d = 0; d < headSize; d++) y[d] += row[j] * v[j][d];
      return y;
    });
    heads.push({ projected, q, k, v, raw, scores, weights, out });
  }
  const joined = x.map((_, t) => {  // the heads' outputs side by side: n_embd numbers again
    const row = new Float64Array(config.n_embd);
    heads.forEach((one, h) => row.set(one.out[t], h * headSize));
    return row;
  });
  return { heads, joined, output: linear(joined, attn.c_proj) };
}

// ---------------------------------------------------------------------------------------------
// The block, the feed-forward network, the model.
// ---------------------------------------------------------------------------------------------
function mlp(config, weights, xs) {
  // MLP.forward: Linear -> GELU (or ReLU²) -> Linear, four times wider inside. Returns the output and the hidden
  // layer after its nonlinearity (4·n_embd numbers per position), which the page's overview shows.
  const activation = ACTIVATIONS[config.activation];
  const hidden = linear(xs, weights.c_fc).map(row => row.map(activation));
  return { hidden, output: linear(hidden, weights.c_proj) };
}

function add(xs, changes) {  // the residual connection: x + change, position by position
  return xs.map((row, t) => {
    const sum = Float64Array.from(row), change = changes[t];
    for (let d = 0; d < sum.length; d++) sum[d] += change[d];
    return sum;
  });
}

function block(config, weights, x, rope, scoreFactor) {
  // Block.forward: x + attention(ln_1(x)), then x + mlp(ln_2(x)); without residual connections (the ladder's
  // rung), x = attention(x), then x = mlp(x). Returns the block's output x and seen: its attention's values with
  // their input, and the stream: every vector on the way (the block's input, its norms, attention's output, the
  // residual sums, the MLP's hidden layer and output), T vectors each, for the page's overview.
  if (!config.residual) {
    const seen = { input: x, ...attention(config, weights.attn, x, rope, scoreFactor) };
    const ff = weights.mlp ? mlp(config, weights.mlp, seen.output) : null;
    const out = ff ? ff.output : seen.output;
    seen.stream = { input: x, attention: seen.output, hidden: ff && ff.hidden, mlp: ff && ff.output, output: out };
    return { x: out, seen };
  }
  const input = x.map(row => layerNorm(row, weights.ln_1));
  const seen = { input, ...attention(config, weights.attn, input, rope, scoreFactor) };
  const stream = { input: x, ln_1: input, attention: seen.output };
  x = stream.afterAttention = add(x, seen.output);
  if (weights.mlp) {
    stream.ln_2 = x.map(row => layerNorm(row, weights.ln_2));
    const ff = mlp(config, weights.mlp, stream.ln_2);
    stream.hidden = ff.hidden;
    stream.mlp = ff.output;
    x = add(x, ff.output);
  }
  stream.output = x;
  seen.stream = stream;
  return { x, seen };
}

function embedding(model, ids) {
  // wte(idx), plus wpe(positions) for learned positions: the token's row and the position's row, kept for the
  // overview, and their sum x, the residual stream's start.
  const { config, weights } = model, nEmbd = config.n_embd;
  const tokens = ids.map(id => weights.wte.weight.subarray(id * nEmbd, (id + 1) * nEmbd));
  const positions = weights.wpe ? ids.map((_, t) => weights.wpe.weight.subarray(t * nEmbd, (t + 1) * nEmbd)) : null;
  const x = positions ? add(tokens, positions) : tokens.map(row => Float64Array.from(row));
  return { tokens, positions, x };
}

function head(config, weights, x) {
  // ln_f, then lm_head (tied: the token embedding is the output head). Returns the normalised x and the logits.
  const normed = x.map(row => layerNorm(row, weights.ln_f));
  const logits = linear(normed, weights.lm_head || weights.wte);
  const cap = config.logit_softcap || 0;  // logit_softcap: cap * tanh(logit / cap); 0 (or a model without it): off
  return { normed, logits: cap ? logits.map(row => row.map(v => cap * Math.tanh(v / cap))) : logits };
}

function forward(model, ids, options = {}) {
  // GPT.forward for ids (at most block_size). Returns each position's logits over the vocabulary; for each layer,
  // its attention's values and input and its stream (block); the embedding; and ln_f's output (normed).
  // options.scoreFactor: a what-if factor on every q·k (the page's scale control); left out, the model's own.
  const { config, weights, rope } = model;
  const scoreFactor = options.scoreFactor ?? ownScoreFactor(config);
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

// ---------------------------------------------------------------------------------------------
// The weights: one block of float32 numbers, cut into the state dict's tensors and nested by their names.
// ---------------------------------------------------------------------------------------------
function loadModel(data) {
  const bytes = Uint8Array.from(atob(data.weights), c => c.charCodeAt(0));
  const all = new Float32Array(bytes.buffer), weights = { blocks: [] };
  for (const [name, [start, end]] of Object.entries(data.tensors)) {  // "blocks.0.attn.c_attn.weight" ->
    const path = name.split(".");                                     // weights.blocks[0].attn.c_attn.weight
    let at = weights;
    for (const part of path.slice(0, -1)) at = at[part] ?? (at[part] = {});
    at[path[path.length - 1]] = all.subarray(start, end);
  }
  weights.blocks = Array.from({ length: data.config.n_layer }, (_, l) => weights.blocks[l]);
  // ModelConfig.head_size, the form of attention as model/scoring.py declares it (how it scores, whether scaled), and
  // model/attention.py's ROPE_BASE
  const config = { ...data.config, head_size: data.config.n_embd / data.config.n_head, form: data.form,
                   rope_base: data.rope_base };
  const rope = config.position === "rope" ? ropeTables(config.block_size, config.head_size, config.rope_base) : null;
  return { config, weights, rope };
}
