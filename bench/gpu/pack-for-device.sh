#!/usr/bin/env bash
# Packs what bench/gpu/run.sh needs on a GPU host that has CUDA but neither Node nor network (the
# project's lent H100, see the brief) into .gpu-host/ (git-ignored), under the 64 MiB a call
# may carry: Node 20 and its headers (from ../shared/gpu-host), the node_modules packages the GPU
# tests and benchmarks load (module-closure.mjs), and the compiled dist/ (compressed: dist/ as it is
# would take a call past the limit). `--slim` also leaves out what the GPU steps never read (below).
# Then, with the device tool:
#
#   carry [".gpu-host"], command:
#   bash .gpu-host/setup.sh && tar -xJf .gpu-host/node_modules.tar.xz && tar -xJf .gpu-host/dist.tar.xz && CUDA_ARCH=90 bench/gpu/run.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
slim=0 harness=0
for a in "$@"; do
  case "$a" in
    --slim) slim=1 ;;
    --harness) slim=1 harness=1 ;;
    *) echo "pack-for-device.sh: unknown argument $a (--slim, --harness)" >&2; exit 2 ;;
  esac
done
src="${GPU_HOST_FILES:-../shared/gpu-host}"
npx tsc -p tsconfig.json
mkdir -p .gpu-host
cp "$src"/setup.sh "$src"/node-v20-linux-x64.xz "$src"/node-v20-include.tar.xz .gpu-host/
# Only what the GPU steps load, to fit the 64 MiB a call carries with the checkout: the tests'
# runner (vitest), the benchmarks' timer (tinybench), the tokenizers' packages and the addon's C++
# headers (node-addon-api), with everything
# they depend on; dist/ comes along compiled.
# --harness adds what `dki eval memory` loads (the memory store's LMDB and HNSW index, jieba for
# Chinese, the CLI's parser and progress bar) for `--device cuda` runs of the harness; of LMDB's
# prebuilt addons only Node 20's (ABI 115) and the N-API glibc one come along. onnxruntime-node
# does not fit: such runs route with the hashing search (no --rerank-model).
extra=()
[ "$harness" = 1 ] && extra=(lmdb hnswlib-node @node-rs/jieba commander cli-progress cheerio fastify prom-client)
node bench/gpu/module-closure.mjs vitest tinybench @huggingface/jinja @huggingface/tokenizers node-addon-api "${extra[@]}" > .gpu-host/modules.txt
tar -cJf .gpu-host/node_modules.tar.xz --exclude='node.abi127.*' --exclude='*.musl.node' node_modules/.bin/vitest -T .gpu-host/modules.txt
tar -cJf .gpu-host/dist.tar.xz dist
# What a call carries: the files of the checkout that are on disk (tracked or not ignored) and
# .gpu-host. With the trained memory-QA models the checkout alone is ~52 MB, so --slim leaves out of
# the working tree, with git's sparse checkout, the folders no GPU step reads (the plain memory-QA
# model and the trained Q8 fixtures): they stay in the index and in every commit, `git status`
# stays clean, and `git sparse-checkout disable` brings them back after the GPU calls. A --harness
# pack is for the memory-QA check alone (`dki eval memory --device cuda`): its checkout also leaves
# out the cross-encoder (its runtime is not packed) and every test fixture, so the GPU tests cannot
# run from it.
if [ "$slim" = 1 ]; then
  out=(models/memory-qa-plain test/fixtures/trained)
  [ "$harness" = 1 ] && out=(models/memory-qa-plain models/memory-qa-reranker test/fixtures)
  git sparse-checkout set --no-cone '/*' "${out[@]/#/!/}"
  echo "left out of the working tree until 'git sparse-checkout disable': ${out[*]}"
fi
# (a file left out by the sparse checkout is still listed, but not on disk: stat skips it)
checkout=$( (git ls-files -z --cached --others --exclude-standard | xargs -0 stat -c %s 2> /dev/null || true) | awk '{ s += $1 } END { print s + 0 }')
packed=$(du -cb .gpu-host | tail -1 | cut -f1)
echo "carried: $packed bytes of .gpu-host + $checkout of the checkout = $((packed + checkout)) (at most 67108864)"
if [ $((packed + checkout)) -gt 67108864 ]; then
  echo "over the limit$([ "$slim" = 0 ] && echo ": run again with --slim")" >&2
  exit 1
fi
