// Token sampling: repetition penalty, temperature, top-k, top-p, seeded RNG. Greedy when
// temperature is 0.
#pragma once
#include <cstdint>
#include <vector>

namespace dki {

struct SamplingParams {
  float temperature = 0.f;  // 0 = greedy
  int top_k = 0;            // 0 = no limit
  float top_p = 1.f;        // 1 = no limit
  float repetition_penalty = 1.f;  // HF convention: positive logits divided, negative multiplied
  uint64_t seed = 0;
};

class Sampler {
 public:
  explicit Sampler(const SamplingParams& p);
  // recent: the tokens the repetition penalty applies to.
  int sample(const float* logits, int vocab, const int32_t* recent, int n_recent);

 private:
  double uniform();  // [0, 1)
  SamplingParams p_;
  uint64_t state_[4];
  std::vector<float> work_;     // the logits with the repetition penalty applied
  std::vector<double> weight_;  // exp((logit - max) / T) of each id, for the draw
  std::vector<int> order_;
};

}  // namespace dki
