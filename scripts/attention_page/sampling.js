// The next character: logits -> probabilities (temperature, top-k, top-p, as model/generate.py's logits_to_probs)
// -> one seeded draw, so the same seed appends the same characters.
"use strict";

function nextCharacterProbabilities(logits, temperature, topK, topP) {
  // temperature 0: greedy
  if (temperature === 0) {
    const best = logits.indexOf(Math.max(...logits));
    return logits.map((_, i) => (i === best ? 1 : 0));
  }
  let scaled = Array.from(logits, value => value / temperature);
  if (topK > 0 && topK < scaled.length) {  // keep the k largest and ties with the k-th
    const kth = [...scaled].sort((a, b) => b - a)[topK - 1];
    scaled = scaled.map(value => (value < kth ? -Infinity : value));
  }
  let probs = softmax(scaled);
  if (topP < 1) {  // keep the likeliest until their mass reaches top_p; the first always stays
    const order = probs.map((p, i) => [p, i]).sort((a, b) => b[0] - a[0]);
    let before = 0;
    const kept = new Array(probs.length).fill(0);
    for (const [p, i] of order) {
      if (before < topP) kept[i] = p;
      before += p;
    }
    const total = kept.reduce((a, b) => a + b, 0);
    probs = kept.map(p => p / total);
  }
  return probs;
}

function seededRandom(seed) {
  // Marsaglia's xorshift32, a number in [0, 1) per call: a seed repeats the page's own draws, not torch's.
  let state = (Math.abs(Math.floor(seed)) % 4294967295) + 1;
  return () => {
    state ^= state << 13; state >>>= 0;
    state ^= state >>> 17;
    state ^= state << 5; state >>>= 0;
    return (state - 1) / 4294967296;
  };
}

function drawCharacter(probs, random) {  // the first whose running total passes a uniform number
  const u = random();
  let total = 0;
  for (let i = 0; i < probs.length; i++) {
    total += probs[i];
    if (u < total) return i;
  }
  return probs.findLastIndex(p => p > 0);
}
