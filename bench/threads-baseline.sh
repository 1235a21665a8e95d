#!/bin/sh
# Builds the engine (addon and dist/) of another commit into a folder of its own, as the
# "before" of bench/threads-contention.js --baseline DIR. Run from the repository root.
# Usage: sh bench/threads-baseline.sh [REF (default main)] [DIR (default models/bench/baseline-REF)]
set -e
REF=${1:-main}
DIR=${2:-models/bench/baseline-$(echo "$REF" | tr '/' '-')}
rm -rf "$DIR"
mkdir -p "$DIR"
git archive "$REF" | tar -x -C "$DIR"
ln -s "$(pwd)/node_modules" "$DIR/node_modules"
# The scripts that npm runs find node-gyp (npm's own) and the Node headers (npm's nodedir).
(cd "$DIR" && npm run build --silent)
git rev-parse "$REF" > "$DIR/COMMIT"
echo "$DIR: $(cat "$DIR/COMMIT")"
