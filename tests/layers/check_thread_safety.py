#!/usr/bin/env python3
"""Compiles every translation unit of libsupervisor's layers below torch with Clang's
thread-safety analysis as errors (-Wthread-safety -Werror=thread-safety, syntax only), using the
flags CMake recorded in <build dir>/compile_commands.json. TRAINSUP_GUARDED_BY, TRAINSUP_REQUIRES
and the other annotations of trainsup/thread_annotations.h are checked here; GCC ignores them.
The torch layer's two units are left out: each costs ~25 s to parse and they hold one lock each.
Usage: check_thread_safety.py BUILD_DIR [CLANG++]. Exits 1 naming each unit that fails."""
import concurrent.futures
import json
import os
import pathlib
import shlex
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]
LAYERS = ("base", "device", "checkpoint", "telemetry", "rank", "agent")


def clang_command(entry, clang):
    args = entry.get("arguments") or shlex.split(entry["command"])
    out = [clang]
    skip = False
    for a in args[1:]:
        if skip:
            skip = False
            continue
        if a == "-o":
            skip = True
            continue
        if a == "-c":
            continue
        out.append(a)
    return out + ["-fsyntax-only", "-Wthread-safety", "-Werror=thread-safety", "-Wno-unknown-warning-option"]


def main():
    build = pathlib.Path(sys.argv[1])
    clang = sys.argv[2] if len(sys.argv) > 2 else "clang++"
    entries = json.loads((build / "compile_commands.json").read_text())
    units = [e for e in entries
             if any(pathlib.Path(e["file"]).resolve().is_relative_to(ROOT / "libsupervisor" / layer)
                    for layer in LAYERS)]
    if not units:
        print(f"check_thread_safety: no libsupervisor unit in {build}/compile_commands.json")
        return 1

    def check(entry):
        r = subprocess.run(clang_command(entry, clang), cwd=entry["directory"], capture_output=True, text=True)
        return entry["file"], r.returncode, r.stderr

    failed = 0
    with concurrent.futures.ThreadPoolExecutor(max_workers=min(4, os.cpu_count() or 1)) as pool:
        for path, rc, err in pool.map(check, units):
            if rc != 0:
                failed += 1
                print(f"--- {os.path.relpath(path, ROOT)}\n{err}")
    print(f"check_thread_safety: {len(units) - failed} of {len(units)} units pass Clang's thread-safety analysis")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
