#!/usr/bin/env python3
"""Checks libsupervisor's layering (docs/architecture.md, "Layers"): every #include of a trainsup
header in libsupervisor/<layer>/ names a layer that <layer> may use, and no public header
(<layer>/include/trainsup/*.h) includes an internal one ("<layer>/name.h"), which an installed
consumer could not find. Prints each violation as file:line and exits 1 if there is any.

The compiler already refuses a public header of a layer not on a layer's include path; this
also covers the internal headers, which share one include root."""
import pathlib
import re
import sys

# What each layer may include (itself implied). Keep in step with docs/architecture.md.
MAY_USE = {
    "base": set(),
    "device": {"base"},
    "checkpoint": {"base", "device"},
    "telemetry": {"base"},
    "rank": {"base", "device", "checkpoint", "telemetry"},
    "agent": {"base", "telemetry"},
    "torch": {"base", "device", "checkpoint", "telemetry", "rank"},
}
# Ours are quoted ("trainsup/x.h", "telemetry/x.h"); <torch/torch.h> and the like are libraries'.
INCLUDE = re.compile(r'^\s*#\s*include\s*"([a-z_]+)/([a-z_0-9]+\.h)"')


def main(root: pathlib.Path) -> int:
    lib = root / "libsupervisor"
    public_home = {}  # "supervisor.h" -> "rank"
    for layer in MAY_USE:
        for header in (lib / layer / "include" / "trainsup").glob("*.h*"):
            public_home[header.name.replace(".in", "")] = layer
    problems = []
    for layer, allowed in MAY_USE.items():
        for path in sorted((lib / layer).rglob("*")):
            if path.suffix not in (".h", ".cc", ".in"):
                continue
            is_public = "include" in path.relative_to(lib / layer).parts
            for number, line in enumerate(path.read_text().splitlines(), 1):
                m = INCLUDE.match(line)
                if not m:
                    continue
                folder, name = m.groups()
                where = f"{path.relative_to(root)}:{number}"
                if folder == "trainsup":
                    used = public_home.get(name)
                    if used is None:
                        problems.append(f"{where}: trainsup/{name} is no public header of any layer")
                        continue
                elif folder in MAY_USE:
                    used = folder
                    if is_public:
                        problems.append(f"{where}: public header includes internal {folder}/{name}")
                    if not (lib / folder / name).exists():
                        problems.append(f"{where}: {folder}/{name} does not exist")
                else:
                    continue  # a system or third-party header
                if used != layer and used not in allowed:
                    problems.append(f"{where}: layer {layer} may not include {used}'s {folder}/{name} "
                                    f"(it may use: {', '.join(sorted(allowed)) or 'nothing'})")
    for p in problems:
        print(p)
    print(f"check_layers: {len(problems)} violation(s) in {len(MAY_USE)} layers")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else pathlib.Path(__file__).parents[2])))
