#!/usr/bin/env bash
# Packs what bench/gpu/run.sh needs on a GPU host that has CUDA but neither Node nor network (the
# project's lent H100, see the brief) into .gpu-host/ (git-ignored), under the 64 MiB a call
# may carry: Node 20 and its headers (from ../shared/gpu-host), the node_modules packages the GPU
# tests and benchmarks load (module-closure.mjs), and the compiled dist/ (compressed: with the
# checkout's 34 MB, dist/ as it is would take a call past the limit). Then, with the device tool:
#
#   carry [".gpu-host"], command:
#   bash .gpu-host/setup.sh && tar -xJf .gpu-host/node_modules.tar.xz && tar -xJf .gpu-host/dist.tar.xz && CUDA_ARCH=90 bench/gpu/run.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
src="${GPU_HOST_FILES:-../shared/gpu-host}"
npx tsc -p tsconfig.json
mkdir -p .gpu-host
cp "$src"/setup.sh "$src"/node-v20-linux-x64.xz "$src"/node-v20-include.tar.xz .gpu-host/
# Only what the GPU steps load, to fit the 64 MiB a call carries with the checkout: the tests'
# runner (vitest), the benchmarks' timer (tinybench), the tokenizers' packages and the addon's C++
# headers (node-addon-api), with everything
# they depend on; dist/ comes along compiled.
node bench/gpu/module-closure.mjs vitest tinybench @huggingface/jinja @huggingface/tokenizers node-addon-api > .gpu-host/modules.txt
tar -cJf .gpu-host/node_modules.tar.xz node_modules/.bin/vitest -T .gpu-host/modules.txt
tar -cJf .gpu-host/dist.tar.xz dist
# What a call carries: the checkout's tracked files and .gpu-host.
echo "carried: $(du -cb .gpu-host | tail -1 | cut -f1) bytes of .gpu-host + $(git ls-files -z | xargs -0 du -cb | tail -1 | cut -f1) of the checkout (at most 67108864)"
