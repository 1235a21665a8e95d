// A context made under environment settings: the engine reads its DKI_CUDA_* settings when a
// context is made, so a benchmark compares kernels by making one context per setting.

/** A context of `model` (`size` tokens) made with the variables of `env` ({ NAME: value }) set. */
export function contextWith(model, env, size) {
  const before = Object.fromEntries(Object.keys(env).map((k) => [k, process.env[k]]));
  Object.assign(process.env, env);
  try {
    return model.createContext(size);
  } finally {
    for (const [k, v] of Object.entries(before)) {
      if (v === undefined) delete process.env[k];
      else process.env[k] = v;
    }
  }
}
