#!/usr/bin/env python3
"""The include graph's two rules, checked from the #include "..." lines of the sources.

1. Layers: kernels <- runtime <- transport <- actors <- tools, examples. A file includes files
   of its own layer and of lower ones, never of a higher one (tests/ may include anything).
2. Rooms: runtime/'s folders (runtime/tokenizer/, runtime/engine/, ...) form a DAG. Each room
   is one node; each file at runtime/'s top level (errors.h, kinds.{h,cpp}, ...) is a node of
   its own, by its stem, since the top level holds both what every room uses (errors.h) and
   what is built on rooms (request_types.h on tokenizer/ and engine/). A cycle among these
   nodes (tokenizer/ -> structured/ -> tokenizer/) is an error, named edge by edge.

Also an error: an include of a path under a layer's folder that does not exist (a path left
behind by a move).

Usage: check_includes.py ROOT [--print]
  ROOT     the repository's root
  --print  also print the room graph (edges with the number of #include lines behind each)
           and the includes between layers
Exit status: 0 when both rules hold, 1 when one does not (each offence on a line), 2 on a
usage error. Python 3 standard library only.
"""
import collections
import os
import re
import sys

LAYERS = {"kernels": 0, "runtime": 1, "transport": 2, "actors": 3, "tools": 4, "examples": 4}
SOURCE_EXTS = (".h", ".hpp", ".cpp", ".cc", ".cu", ".cuh")
INCLUDE = re.compile(r'^\s*#\s*include\s*"([^"]+)"')


def sources(root):
    """Every source file of the layers, as a path relative to root with '/' separators."""
    for layer in sorted(LAYERS):
        top = os.path.join(root, layer)
        for dirpath, dirnames, filenames in os.walk(top):
            dirnames[:] = sorted(d for d in dirnames
                                 if not d.startswith(("build", ".")) and d != "node_modules")
            for name in sorted(filenames):
                if name.endswith(SOURCE_EXTS):
                    yield os.path.relpath(os.path.join(dirpath, name), root).replace(os.sep, "/")


def includes(root, path):
    """(line number, included path as written, resolved path relative to root or None)."""
    with open(os.path.join(root, path), encoding="utf-8", errors="replace") as f:
        for number, line in enumerate(f, 1):
            m = INCLUDE.match(line)
            if not m:
                continue
            written = m.group(1)
            if written.split("/", 1)[0] in LAYERS:  # from the root, as the build's -I says
                yield number, written, os.path.normpath(written).replace(os.sep, "/")
                continue
            beside = os.path.normpath(os.path.join(os.path.dirname(path), written))
            if os.path.isfile(os.path.join(root, beside)):  # relative to the including file
                yield number, written, beside.replace(os.sep, "/")
            else:
                yield number, written, None  # a system or third-party header


def node_of(path):
    """A runtime/ file's node: its room ("engine/") or, at the top level, its stem ("kinds")."""
    parts = path.split("/")
    if len(parts) > 2:
        return parts[1] + "/"
    return os.path.splitext(parts[1])[0]


def shortest_cycle_through(graph, component, start):
    """The shortest cycle from start back to start inside one component, as a list of nodes."""
    parent = {}
    queue = collections.deque([start])
    while queue:
        node = queue.popleft()
        for nxt in sorted(graph[node]):
            if nxt not in component or nxt in parent:
                continue
            parent[nxt] = node
            if nxt == start:
                cycle = [start]
                node = parent[start]
                while node != start:
                    cycle.append(node)
                    node = parent[node]
                cycle.append(start)
                return list(reversed(cycle))
            queue.append(nxt)
    return None


def find_cycle(graph, component):
    """The shortest cycle among the nodes of one strongly connected component (it has one)."""
    cycles = (shortest_cycle_through(graph, component, n) for n in sorted(component))
    return min((c for c in cycles if c), key=len)


def strongly_connected(graph):
    """Tarjan's algorithm, iterative: the components with more than one node."""
    index, low, on_stack, stack, result = {}, {}, set(), [], []
    counter = 0
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            advanced = False
            for child in children:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                    advanced = True
                    break
                if child in on_stack:
                    low[node] = min(low[node], index[child])
            if advanced:
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.add(member)
                    if member == node:
                        break
                if len(component) > 1:
                    result.append(component)
    return result


def main(argv):
    args = [a for a in argv[1:] if a != "--print"]
    show = "--print" in argv[1:]
    if len(args) != 1 or args[0].startswith("-") or not os.path.isdir(args[0]):
        print(__doc__.strip(), file=sys.stderr)
        return 2
    root = args[0]
    if not os.path.isdir(os.path.join(root, "runtime")):
        print(f"check_includes: {root} has no runtime/ folder", file=sys.stderr)
        return 2

    errors = []
    room_edges = collections.Counter()  # (from node, to node) -> #include lines
    example = {}                         # (from node, to node) -> the first such include
    layer_edges = collections.Counter()
    graph = collections.defaultdict(set)
    for path in sources(root):
        layer = path.split("/", 1)[0]
        if path.startswith("runtime/"):
            graph[node_of(path)]
        for number, written, target in includes(root, path):
            where = f"{path}:{number}"
            if target is None:
                continue
            target_layer = target.split("/", 1)[0]
            if target_layer not in LAYERS:
                continue  # tests/ or shared/ helpers: no rule
            if not os.path.isfile(os.path.join(root, target)):
                errors.append(f"{where}: includes \"{written}\", which does not exist")
                continue
            if target_layer != layer:
                layer_edges[(layer, target_layer)] += 1
            if LAYERS[target_layer] > LAYERS[layer]:
                errors.append(f"{where}: upward layer import: {layer} -> {target_layer} "
                              f"(includes \"{written}\"; the order is kernels <- runtime <- "
                              f"transport <- actors <- tools, examples)")
            if layer == "runtime" and target_layer == "runtime":
                a, b = node_of(path), node_of(target)
                if a != b:
                    room_edges[(a, b)] += 1
                    example.setdefault((a, b), f"{where} includes \"{written}\"")
                    graph[a].add(b)
                    graph[b]

    for component in strongly_connected(graph):
        cycle = find_cycle(graph, component)
        errors.append("room cycle in runtime/: " + " -> ".join(cycle))
        for a, b in zip(cycle, cycle[1:]):
            errors.append(f"  edge {a} -> {b} ({room_edges[(a, b)]} include(s)), e.g. {example[(a, b)]}")

    if show:
        print("runtime/ room graph (a room is a folder, NAME/; a file at the top level is a node "
              "of its own, by its stem), edges with their #include lines:")
        for (a, b), n in sorted(room_edges.items()):
            print(f"  {a} -> {b}  {n}")
        rooms_only = sorted((a, b, n) for (a, b), n in room_edges.items()
                            if a.endswith("/") and b.endswith("/"))
        print("between rooms alone:")
        for a, b, n in rooms_only:
            print(f"  {a} -> {b}  {n}")
        print("between layers (kernels <- runtime <- transport <- actors <- tools, examples):")
        for (a, b), n in sorted(layer_edges.items(), key=lambda e: (LAYERS[e[0][0]], e[0])):
            print(f"  {a} -> {b}  {n}")

    if errors:
        for e in errors:
            print(e, file=sys.stderr)
        print(f"check_includes: FAILED ({sum(not e.startswith('  ') for e in errors)} problem(s))",
              file=sys.stderr)
        return 1
    if not show:
        print(f"check_includes: ok ({len(graph)} runtime/ nodes, {len(room_edges)} edges, no cycle, "
              f"no upward layer import)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
