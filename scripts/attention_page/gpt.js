// The model of model/gpt.py and model/attention.py in plain JavaScript: the same forward pass, one position and one
// head at a time, keeping every intermediate value the page shows. Vectors are Float64Arrays; a weight matrix is a
// Float32Array of out x in numbers, row after row, exactly as torch stores an nn.Linear's weight.
"use strict";

// ---------------------------------------------------------------------------------------------
// The pieces: a Linear layer, the norms, the nonlinearities, rotary positions.
// ---------------------------------------------------------------------------------------------
function linear(xs, weight, bias, nOut) {
  // y = W x + b for every position's vector x of xs, as nn.Linear computes it: y[o] = b[o] + sum over i of
  // W[o][i] x[i]. Four positions at a time, so that each weight read from memory serves four of them (the forward
  // pass spends most of its time here).
  const nIn = xs[0].length, ys = xs.map(() => new Float64Array(nOut));
  for (let t = 0; t < xs.length; t += 4) {
    const x0 = xs[t], x1 = xs[t + 1] || x0, x2 = xs[t + 2] || x0, x3 = xs[t + 3] || x0;
    for (let o = 0; o < nOut; o++) {
      const row = o * nIn;
      let s0 = bias ? bias[o] : 0, s1 = s0, s2 = s0, s3 = s0;
      for (let i = 0; i < nIn; i++) {
        const w = weight[row + i];
        s0 += w * x0[i]; s1 += w * x1[i]; s2 += w * x2[i]; s3 += w * x3[i];
      }
      ys[t][o] = s0;
      if (t + 1 < xs.length) ys[t + 1][o] = s1;
      if (t + 2 < xs.length) ys[t + 2][o] = s2;
      if (t + 3 < xs.length) ys[t + 3][o] = s3;
    }
  }
  return ys;
}

function layerNorm(x, weight, bias) {  // nn.LayerNorm: subtract the mean, divide by the standard deviation
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
  relu2: x => (x > 0 ? x * x : 0),  // relu(x) squared
};

// Rotary tables as model/rope.py builds them, in float32 as torch does (Math.fround), so the angles are the same.
function ropeTables(blockSize, headSize) {
  const half = headSize / 2, cos = [], sin = [];
  const frequencies = Array.from({ length: half },
    (_, i) => Math.fround(10000 ** Math.fround(-(2 * i) / headSize)));
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
  return { cos, sin };
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
  const finite = scores.filter(Number.isFinite), top = Math.max(...finite);
  const e = scores.map(s => (Number.isFinite(s) ? Math.exp(s - top) : 0));
  const total = e.reduce((a, b) => a + b, 0);
  return e.map(value => value / total);
}

// ---------------------------------------------------------------------------------------------
// Attention, one head at a time (the textbook form of model/textbook.py, with the forms of model/attention.py).
// ---------------------------------------------------------------------------------------------
function attention(config, layer, x, rope) {
  // x: one vector per position, the block's normalised input. Returns the layer's output for each position and
  // everything on the way: each head's q, k, v, scores and weights, and its weighted sums.
  const { n_head: nHead, n_embd: nEmbd, attention_score: form } = config, headSize = nEmbd / nHead;
  const T = x.length, made = layer.c_attn ? linear(x, layer.c_attn.weight, layer.c_attn.bias, layer.c_attn.rows)
    : x.map(() => new Float64Array(0));
  // c_attn makes q, k, v side by side (k missing when shared_qk, q and k missing for the uniform form)
  const learnedQK = form === "uniform" ? 0 : config.shared_qk ? 1 : 2;
  const part = (row, index, head) => row.subarray(index * nEmbd + head * headSize, index * nEmbd + (head + 1) * headSize);
  const heads = [];
  for (let h = 0; h < nHead; h++) {
    const v = made.map((row, t) => (config.attention_values ? part(row, learnedQK, h) :
      x[t].subarray(h * headSize, (h + 1) * headSize)));  // without values: the head's own slice of x
    let q = made.map(row => (learnedQK ? part(row, 0, h) : new Float64Array(headSize)));
    let k = made.map((row, t) => (learnedQK === 2 ? part(row, 1, h) : q[t]));
    const projected = { q, k };
    if (config.qk_norm) { q = q.map(rmsNorm); k = k.map(rmsNorm); }
    if (rope) { q = q.map((row, t) => applyRope(row, rope.cos[t], rope.sin[t]));
                k = k.map((row, t) => applyRope(row, rope.cos[t], rope.sin[t])); }
    const scale = form === "dot" ? 1 : 1 / Math.sqrt(headSize);
    const raw = [], scores = [], weights = [], out = [];
    for (let i = 0; i < T; i++) {  // the query at position i and the keys at 0..i (the tril: no later key)
      const rawRow = [], row = [];
      for (let j = 0; j <= i; j++) {
        if (form === "additive") {  // w · tanh(q_i + k_j)
          let sum = 0;
          for (let d = 0; d < headSize; d++) sum += layer.w_score[h * headSize + d] * Math.tanh(q[i][d] + k[j][d]);
          rawRow.push(sum);
          row.push(sum);
        } else {
          const s = dot(q[i], k[j]);  // q·k (0 for the uniform form: every key weighs the same)
          rawRow.push(s);
          row.push(s * scale);  // scaled BEFORE the softmax
        }
      }
      const w = softmax(row);
      const y = new Float64Array(headSize);  // the weighted sum of the values
      for (let j = 0; j <= i; j++) for (let d = 0; d < headSize; d++) y[d] += w[j] * v[j][d];
      raw.push(rawRow); scores.push(row); weights.push(w); out.push(y);
    }
    heads.push({ projected, q, k, v, raw, scores, weights, out });
  }
  const joined = x.map((_, t) => {  // the heads' outputs side by side: n_embd numbers again
    const row = new Float64Array(nEmbd);
    heads.forEach((head, h) => row.set(head.out[t], h * headSize));
    return row;
  });
  const output = linear(joined, layer.c_proj.weight, layer.c_proj.bias, nEmbd);
  return { heads, joined, output };
}

// ---------------------------------------------------------------------------------------------
// The model: embeddings, the blocks, the final norm and the head.
// ---------------------------------------------------------------------------------------------
function forward(model, ids) {
  // ids: the text's character ids (at most block_size). Returns each position's logits over the vocabulary and,
  // for each layer, its attention's values (attention() above) and its input.
  const { config, weights } = model, nEmbd = config.n_embd;
  let x = ids.map((id, t) => {
    const row = Float64Array.from(weights.wte.subarray(id * nEmbd, (id + 1) * nEmbd));
    if (config.position === "learned") for (let d = 0; d < nEmbd; d++) row[d] += weights.wpe[t * nEmbd + d];
    return row;
  });
  const rope = config.position === "rope" ? model.rope : null;
  const layers = [];
  for (const layer of weights.blocks) {
    if (!config.residual) {  // the ladder's rung without residual connections: each part replaces its input
      const seen = attention(config, layer, x, rope);
      layers.push({ input: x, ...seen });
      x = layer.mlp ? mlp(config, layer.mlp, seen.output) : seen.output;
      continue;
    }
    const input = x.map(row => layerNorm(row, layer.ln_1.weight, layer.ln_1.bias));
    const seen = attention(config, layer, input, rope);
    layers.push({ input, ...seen });
    x = x.map((row, t) => row.map((value, d) => value + seen.output[t][d]));  // x + attention(norm(x))
    if (layer.mlp) {  // x + mlp(norm(x))
      const change = mlp(config, layer.mlp, x.map(row => layerNorm(row, layer.ln_2.weight, layer.ln_2.bias)));
      x = x.map((row, t) => row.map((value, d) => value + change[t][d]));
    }
  }
  const head = weights.lm_head || weights.wte;  // tied: the token embedding is the output head
  const logits = linear(x.map(row => layerNorm(row, weights.ln_f.weight, weights.ln_f.bias)), head, null,
    config.vocab_size);
  return { logits, layers };
}

function mlp(config, weights, xs) {  // Linear -> GELU (or ReLU²) -> Linear, four times wider inside; each position
  const activation = ACTIVATIONS[config.activation];
  const hidden = linear(xs, weights.c_fc.weight, weights.c_fc.bias, 4 * config.n_embd).map(row => row.map(activation));
  return linear(hidden, weights.c_proj.weight, weights.c_proj.bias, config.n_embd);
}

// ---------------------------------------------------------------------------------------------
// The weights: one block of float32 numbers, cut into the tensors the state dict names.
// ---------------------------------------------------------------------------------------------
function loadModel(data) {
  const bytes = Uint8Array.from(atob(data.weights), c => c.charCodeAt(0));
  const all = new Float32Array(bytes.buffer);
  const tensor = name => (name in data.tensors ? all.subarray(...data.tensors[name]) : null);
  const config = data.config, linearOf = name => (tensor(name + ".weight") ? {
    weight: tensor(name + ".weight"), bias: tensor(name + ".bias"),
    rows: tensor(name + ".weight").length / config.n_embd } : null);
  const norm = name => ({ weight: tensor(name + ".weight"), bias: tensor(name + ".bias") });
  const blocks = Array.from({ length: config.n_layer }, (_, l) => {
    const at = "blocks." + l + ".";
    return { ln_1: norm(at + "ln_1"), ln_2: norm(at + "ln_2"), c_attn: linearOf(at + "attn.c_attn"),
             c_proj: linearOf(at + "attn.c_proj"), w_score: tensor(at + "attn.w_score"),
             mlp: config.mlp ? { c_fc: linearOf(at + "mlp.c_fc"), c_proj: linearOf(at + "mlp.c_proj") } : null };
  });
  const weights = { wte: tensor("wte.weight"), wpe: tensor("wpe.weight"), lm_head: tensor("lm_head.weight"),
                    ln_f: norm("ln_f"), blocks };
  const rope = config.position === "rope" ? ropeTables(config.block_size, config.n_embd / config.n_head) : null;
  return { config, weights, rope };
}
