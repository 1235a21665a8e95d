#include "sampler.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <string>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include "common.h"

namespace dki {

namespace {
uint64_t splitmix64(uint64_t& x) {
  uint64_t z = (x += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}
uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

// The first id of the largest logit, NaNs never chosen (0 when every logit is NaN). Greedy
// decoding calls this once a token over the whole vocabulary: std::max_element's compare chain
// took 71 us for 49152 logits, the two vector passes below (the max, then its first position)
// 5 us. SSE2 is part of x86-64, so no run-time dispatch is needed.
int argmax(const float* x, int n) {
  float m = -INFINITY;
  int i = 0;
#if defined(__SSE2__)
  // _mm_max_ps(x, acc) keeps acc where x is NaN, as `x > m ? x : m` does.
  __m128 acc[4] = {_mm_set1_ps(-INFINITY), _mm_set1_ps(-INFINITY), _mm_set1_ps(-INFINITY), _mm_set1_ps(-INFINITY)};
  for (; i + 16 <= n; i += 16)
    for (int j = 0; j < 4; j++) acc[j] = _mm_max_ps(_mm_loadu_ps(x + i + 4 * j), acc[j]);
  float lanes[4];
  _mm_storeu_ps(lanes, _mm_max_ps(_mm_max_ps(acc[0], acc[1]), _mm_max_ps(acc[2], acc[3])));
  for (float v : lanes) m = v > m ? v : m;
#endif
  for (; i < n; i++) m = x[i] > m ? x[i] : m;
  int j = 0;
#if defined(__SSE2__)
  const __m128 target = _mm_set1_ps(m);
  for (; j + 16 <= n; j += 16) {
    int hit = 0;
    for (int k = 0; k < 4; k++) hit |= _mm_movemask_ps(_mm_cmpeq_ps(_mm_loadu_ps(x + j + 4 * k), target)) << (4 * k);
    if (hit) return j + __builtin_ctz(unsigned(hit));
  }
#endif
  for (; j < n; j++)
    if (x[j] == m) return j;
  return 0;
}
}  // namespace

Sampler::Sampler(const SamplingParams& p) : p_(p) {
  if (!(p.temperature >= 0) || !std::isfinite(p.temperature)) throw Error("temperature must be a finite number >= 0");
  if (p.top_k < 0) throw Error("top_k must be >= 0");
  if (!(p.top_p > 0 && p.top_p <= 1)) throw Error("top_p must be in (0, 1]");
  if (!(p.repetition_penalty > 0) || !std::isfinite(p.repetition_penalty)) throw Error("repetition_penalty must be a positive number");
  uint64_t s = p.seed;
  for (auto& x : state_) x = splitmix64(s);
}

// xoshiro256** → 53-bit double
double Sampler::uniform() {
  const uint64_t result = rotl(state_[1] * 5, 7) * 9;
  const uint64_t t = state_[1] << 17;
  state_[2] ^= state_[0];
  state_[3] ^= state_[1];
  state_[1] ^= state_[2];
  state_[0] ^= state_[3];
  state_[2] ^= t;
  state_[3] = rotl(state_[3], 45);
  return double(result >> 11) * (1.0 / 9007199254740992.0);
}

int Sampler::sample(const float* logits, int vocab, const int32_t* recent, int n_recent) {
  // The logits as penalised: a copy only when the penalty changes some.
  const float* w = logits;
  if (p_.repetition_penalty != 1.f) {
    work_.assign(logits, logits + vocab);
    for (int i = 0; i < n_recent; i++) {
      const int id = recent[i];
      if (id < 0 || id >= vocab) continue;
      float& l = work_[id];
      // Penalise each distinct token once, even if it occurred many times.
      if (std::find(recent, recent + i, id) != recent + i) continue;
      l = l > 0 ? l / p_.repetition_penalty : l * p_.repetition_penalty;
    }
    w = work_.data();
  }
  const int best = argmax(w, vocab);
  if (p_.temperature == 0.f) return best;
  // Each id's unnormalised probability, computed once: every draw below reads these.
  const float mx = w[best];
  weight_.resize(vocab);
  double total = 0;
  for (int i = 0; i < vocab; i++) total += weight_[i] = std::exp(double(w[i] - mx) / p_.temperature);

  // Neither top-k nor top-p cuts anything: one draw over the whole distribution, no sorting (a
  // sort that grows until it holds all the mass sorted all 49152 ids: 14 ms a token).
  if ((p_.top_k == 0 || p_.top_k >= vocab) && p_.top_p >= 1.f) {
    double r = uniform() * total;
    for (int i = 0; i < vocab; i++) {
      r -= weight_[i];
      if (r < 0) return i;
    }
    return best;  // r lost to rounding
  }

  // Candidates sorted by logit, best first. Only as many are sorted as top-k/top-p can keep:
  // the prefix is grown until it holds the top-p mass, which keeps this fast on large vocabularies.
  order_.resize(vocab);
  std::iota(order_.begin(), order_.end(), 0);
  const int k_limit = p_.top_k > 0 ? std::min(p_.top_k, vocab) : vocab;
  auto by_logit = [&](int a, int b) { return w[a] > w[b] || (w[a] == w[b] && a < b); };
  int sorted = std::min(k_limit, 64);
  int keep = 0;
  for (;;) {
    std::partial_sort(order_.begin(), order_.begin() + sorted, order_.end(), by_logit);
    double mass = 0;
    keep = 0;
    while (keep < sorted) {
      mass += weight_[order_[keep]] / total;
      keep++;
      if (mass >= p_.top_p) break;
    }
    if (mass >= p_.top_p || sorted == k_limit) break;
    sorted = std::min(k_limit, sorted * 4);
  }
  double kept_mass = 0;
  for (int i = 0; i < keep; i++) kept_mass += weight_[order_[i]];
  double r = uniform() * kept_mass;
  for (int i = 0; i < keep; i++) {
    r -= weight_[order_[i]];
    if (r < 0) return order_[i];
  }
  return order_[keep - 1];
}

}  // namespace dki
