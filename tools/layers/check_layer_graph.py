#!/usr/bin/env python3
"""Checks the CMake target graph and the includes of src/ against the layer order.

    check_layer_graph.py GRAPH.dot [--src SRC_DIR] [--markdown]

GRAPH.dot is `cmake --graphviz=GRAPH.dot BUILD_DIR`'s output. Every m3_* library belongs to a layer;
a library may link only libraries of its own layer or of layers below it. With --src, every
`#include "<folder>/..."` of a file in src/<layer>/ must name its own layer or one below. An edge
up the order (the model linking the engine, the engine including a concrete model, the engine
linking the server) fails the check with exit status 1. So does CUDA outside src/backend/cuda: a
CUDA, cuBLAS, CUB, NCCL or CUPTI header included, a raw CUDA runtime, cuBLAS or NCCL call, or a
.cu/.cuh file (the model reaches the GPU through the backend's kernel and runtime headers). With --markdown the target graph is
printed as the table docs/design/layers.md holds.
"""
import os
import re
import sys

# Bottom to top. A layer may use the layers before it in this list.
LAYERS = [
    ("core", ["m3_core"]),
    ("quant", ["m3_quant"]),
    ("loader", ["m3_loader"]),
    ("backend", ["m3_backend", "m3_comm", "m3_backend_cuda"]),
    ("kv", ["m3_kv"]),
    ("sched", ["m3_sched"]),
    ("sample", ["m3_sample"]),
    ("model", ["m3_model_api", "m3_model", "m3_model_cuda_plan", "m3_model_cuda"]),
    ("engine", ["m3_engine"]),
    ("tokenizer", ["m3_tokenizer"]),
    ("chat", ["m3_chat_parsers", "m3_chat"]),
    ("server", ["m3_server"]),
    ("serving", ["m3_serving"]),
    ("app", ["m3_app"]),
    ("bench", ["m3_bench"]),
    ("router", ["m3_router"]),  # `m3serve router`: the server's listener, bench's URLs
    ("cli", ["m3serve"]),
    ("tools", ["m3_cuda_trace"]),  # tools/trace: a CUPTI tracer preloaded into benchmarks
]
LEVEL = {t: i for i, (_, targets) in enumerate(LAYERS) for t in targets}
LAYER_OF = {t: name for name, targets in LAYERS for t in targets}


def read_graph(path):
    text = open(path, encoding="utf-8").read()
    names = dict(re.findall(r'"(node\d+)" \[ label = "([^"]+)"', text))
    edges = {}
    for a, b in re.findall(r'"(node\d+)" -> "(node\d+)"', text):
        edges.setdefault(names[a], set()).add(names[b])
    return set(names.values()), edges


# Source folders of src/ and their layers (a folder's subfolders are in its layer).
FOLDERS = {name: name for name, _ in LAYERS}
FOLDERS["cli"] = "cli"


def include_problems(src_dir):
    level = {name: i for i, (name, _) in enumerate(LAYERS)}
    problems = []
    include = re.compile(r'^\s*#\s*include\s*"([A-Za-z0-9_]+)/')
    for folder in sorted(os.listdir(src_dir)):
        if folder not in level:
            continue
        for root, _, files in os.walk(os.path.join(src_dir, folder)):
            for f in sorted(files):
                if not f.endswith((".h", ".cpp", ".cu", ".cuh")):
                    continue
                path = os.path.join(root, f)
                for n, line in enumerate(open(path, encoding="utf-8", errors="replace"), 1):
                    m = include.match(line)
                    if m and m.group(1) in level and level[m.group(1)] > level[folder]:
                        rel = os.path.relpath(path, os.path.dirname(src_dir.rstrip("/")))
                        problems.append(f"{rel}:{n}: the {folder} layer includes "
                                        f"{m.group(1)}/, a layer above it")
    return problems


CUDA_HEADER = re.compile(r'^\s*#\s*include\s*<(cuda|cublas|cub/|nccl|cupti|thrust/|curand|cusparse)')
CUDA_CALL = re.compile(r'\b(cuda[A-Z]\w*|cublas[A-Z]\w*|cublasLt[A-Z]\w*|nccl[A-Z]\w*|cu[A-Z][a-z]\w*)\s*\(')


def cuda_problems(src_dir):
    """CUDA used directly outside src/backend/cuda (comments are not read)."""
    problems = []
    allowed = os.path.join(src_dir, "backend", "cuda")
    for root, _, files in os.walk(src_dir):
        if os.path.commonpath([root, allowed]) == allowed:
            continue
        for f in sorted(files):
            path = os.path.join(root, f)
            rel = os.path.relpath(path, os.path.dirname(src_dir.rstrip("/")))
            if f.endswith((".cu", ".cuh")):
                problems.append(f"{rel}: a CUDA source outside src/backend/cuda")
                continue
            if not f.endswith((".h", ".hpp", ".cpp", ".cc")):
                continue
            for n, line in enumerate(open(path, encoding="utf-8", errors="replace"), 1):
                code = line.split("//", 1)[0]
                if CUDA_HEADER.match(code):
                    problems.append(f"{rel}:{n}: includes a CUDA header outside src/backend/cuda")
                elif (m := CUDA_CALL.search(code)) is not None:
                    problems.append(f"{rel}:{n}: calls {m.group(1)} outside src/backend/cuda "
                                    "(use backend/cuda/runtime)")
    return problems


def main():
    argv = sys.argv[1:]
    src_dir = None
    if "--src" in argv:
        i = argv.index("--src")
        src_dir = argv[i + 1]
        del argv[i:i + 2]
    args = [a for a in argv if not a.startswith("--")]
    if len(args) != 1:
        print(__doc__, file=sys.stderr)
        return 2
    nodes, edges = read_graph(args[0])
    ours = sorted(n for n in nodes if n.startswith("m3_") or n == "m3serve")
    unknown = [n for n in ours if n not in LEVEL]
    problems = [f"{n}: not assigned to a layer in {sys.argv[0]}" for n in unknown]
    for src in ours:
        for dst in sorted(edges.get(src, ())):
            if dst in LEVEL and src in LEVEL and LEVEL[dst] > LEVEL[src]:
                problems.append(f"{src} ({LAYER_OF[src]}) links {dst} ({LAYER_OF[dst]}), a layer "
                                "above it")
    if src_dir:
        problems += include_problems(src_dir)
        problems += cuda_problems(src_dir)
    if "--markdown" in sys.argv:
        print("| layer | target | links (project libraries) |")
        print("| --- | --- | --- |")
        for name, targets in LAYERS:
            for t in targets:
                if t in nodes:
                    deps = sorted(d for d in edges.get(t, ()) if d in LEVEL)
                    print(f"| {name} | `{t}` | {', '.join(f'`{d}`' for d in deps) or '-'} |")
    for p in problems:
        print(f"layer check: {p}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
