#!/usr/bin/env python3
"""Checks that every #include in the engine points down the layers (docs/ARCHITECTURE.md).

usage: scripts/check_layers.py ENGINE_DIR

A file in engine/<folder>/ may include headers of its own folder and of the folders below it in
LAYERS; ctx/plugin.h (the public ABI) and the generated build_info.h go anywhere. Run by every
build (CMake target ctx_check_layers); exits 1 listing each include that points up.
"""
import os
import re
import sys

# Bottom first; each layer's CMake target (ctx_<folder>) links only the ones before it.
LAYERS = ["core", "backend", "parallel", "data", "plugin", "model", "io", "eval", "session", "lua", "cli"]
ANYWHERE = {"include", "ctx", "build_info.h"}
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"')


def main():
    engine = sys.argv[1] if len(sys.argv) > 1 else os.path.join(
        os.path.dirname(os.path.abspath(__file__)), "..", "engine")
    rank = {name: i for i, name in enumerate(LAYERS)}
    problems = []
    for folder in LAYERS:
        for root, _, files in os.walk(os.path.join(engine, folder)):
            for f in sorted(files):
                if not f.endswith((".h", ".cpp", ".cu", ".cuh")):
                    continue
                path = os.path.join(root, f)
                with open(path, encoding="utf-8", errors="replace") as src:
                    for n, line in enumerate(src, 1):
                        m = INCLUDE.match(line)
                        if not m:
                            continue
                        target = m.group(1).split("/")[0]
                        if target in ANYWHERE or target not in rank:
                            continue  # its own folder's files by bare name, system headers
                        if rank[target] > rank[folder]:
                            rel = os.path.relpath(path, engine)
                            problems.append(f"engine/{rel}:{n}: {folder}/ includes "
                                            f"\"{m.group(1)}\" from the higher layer {target}/")
    if problems:
        print("upward includes (layers, bottom first: " + " < ".join(LAYERS) + "):")
        print("\n".join(problems))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
