#!/usr/bin/env bash
# The layer checker on made-up graphs and source trees: it passes a downward edge and fails an
# upward one, in the CMake graph and in the includes.
set -euo pipefail
checker="$1"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
graph() {  # graph FROM TO: a two-node graph with one edge
  printf 'digraph G {\n"node0" [ label = "%s" ];\n"node1" [ label = "%s" ];\n"node0" -> "node1"\n}\n' "$1" "$2" >"$tmp/g.dot"
}
graph m3_engine m3_model_api
python3 "$checker" "$tmp/g.dot" || { echo "FAIL: engine -> model_api refused"; exit 1; }
graph m3_model m3_engine
if python3 "$checker" "$tmp/g.dot" 2>/dev/null; then echo "FAIL: model -> engine passed"; exit 1; fi
graph m3_server m3_serving
if python3 "$checker" "$tmp/g.dot" 2>/dev/null; then echo "FAIL: server -> serving passed"; exit 1; fi
graph m3_engine m3_model_api
mkdir -p "$tmp/src/engine" "$tmp/src/model"
echo '#include "model/model.h"' >"$tmp/src/engine/a.cpp"
python3 "$checker" "$tmp/g.dot" --src "$tmp/src" || { echo "FAIL: engine including model/ refused"; exit 1; }
echo '#include "engine/engine.h"' >"$tmp/src/model/b.h"
if python3 "$checker" "$tmp/g.dot" --src "$tmp/src" 2>/dev/null; then
  echo "FAIL: model including engine/ passed"; exit 1
fi
rm "$tmp/src/model/b.h"
mkdir -p "$tmp/src/backend/cuda/runtime"
echo '#include <cuda_runtime.h>' >"$tmp/src/backend/cuda/runtime/c.cpp"
echo 'void f() { cudaDeviceSynchronize(); }  // cudaFree(p) in a comment' >>"$tmp/src/backend/cuda/runtime/c.cpp"
echo 'void g() { sync(); }  // not cudaMemcpy(a, b) here' >"$tmp/src/model/ok.cpp"
python3 "$checker" "$tmp/g.dot" --src "$tmp/src" || { echo "FAIL: CUDA in backend/cuda refused"; exit 1; }
echo '#include <cuda_runtime.h>' >"$tmp/src/model/c.h"
if python3 "$checker" "$tmp/g.dot" --src "$tmp/src" 2>/dev/null; then
  echo "FAIL: model including cuda_runtime.h passed"; exit 1
fi
echo 'void f() { cudaMemcpy(a, b, n, k); }' >"$tmp/src/model/c.h"
if python3 "$checker" "$tmp/g.dot" --src "$tmp/src" 2>/dev/null; then
  echo "FAIL: a raw cudaMemcpy in the model passed"; exit 1
fi
rm "$tmp/src/model/c.h"
touch "$tmp/src/model/k.cu"
if python3 "$checker" "$tmp/g.dot" --src "$tmp/src" 2>/dev/null; then
  echo "FAIL: a .cu file in the model passed"; exit 1
fi
echo "layer checker: 9 passed, 0 failed"
