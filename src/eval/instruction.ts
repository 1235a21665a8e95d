// The one answer instruction every memory-QA mode uses as its system prompt, so that modes differ
// only in how the memory reaches the model. The models in models/memory-qa-* were trained on it.
export const ANSWER_INSTRUCTION =
  'Answer the question about the user in a few words. If it was never mentioned, answer "not mentioned".';
