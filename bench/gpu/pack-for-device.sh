#!/usr/bin/env bash
# Packs what bench/gpu/run.sh needs on a GPU host that has CUDA but neither Node nor network (the
# project's lent H100, see the brief) into .gpu-host/ (git-ignored), under the 64 MiB a call
# may carry: Node 20 and its headers (from ../shared/gpu-host), node_modules without llama.cpp and
# TypeScript, and the compiled dist/. Then, with the device tool:
#
#   carry [".gpu-host", "dist"], command:
#   bash .gpu-host/setup.sh && tar -xJf .gpu-host/node_modules.tar.xz && CUDA_ARCH=90 bench/gpu/run.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
src="${GPU_HOST_FILES:-../shared/gpu-host}"
npx tsc -p tsconfig.json
mkdir -p .gpu-host
cp "$src"/setup.sh "$src"/node-v20-linux-x64.xz "$src"/node-v20-include.tar.xz .gpu-host/
# Left out to fit (the checkout and these travel in 64 MiB): llama.cpp (bench comparisons only),
# TypeScript (dist/ comes along compiled), and what only the memory, RAG and chart layers load
# (the ONNX embedder, the PDF reader and its canvas, LMDB, jieba, hnswlib, cheerio, vega): the GPU
# tests and benchmarks import the engine, the K/V blocks and the cache alone.
exclude=(node-llama-cpp @node-llama-cpp typescript onnxruntime-node pdfjs-dist @napi-rs lmdb @lmdb @node-rs hnswlib-node
  cheerio 'vega*' 'd3-*' @resvg .cache)
tar -cJf .gpu-host/node_modules.tar.xz "${exclude[@]/#/--exclude=node_modules/}" node_modules
du -sh .gpu-host dist
