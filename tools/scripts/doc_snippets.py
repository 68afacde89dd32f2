#!/usr/bin/env python3
"""Turns the C++ blocks of a Markdown guide that start with `// test: NAME` into GoogleTest
cases, so the guide's code is compiled and run by the suite (tests/CMakeLists.txt: test_api_docs).
Each block becomes the body of TEST(ApiDoc, NAME), with #line pointing back into the guide, so a
compiler error names the guide's line.
  doc_snippets.py GUIDE.md OUT.cpp
"""
import re
import sys

HEADER = """// Generated from {guide} by tools/scripts/doc_snippets.py: edit the guide, not this file.
#include <gtest/gtest.h>

#include <chrono>
#include <future>
#include <iostream>
#include <map>
#include <memory>
#include <span>
#include <stdexcept>
#include <string>

#include "actors/tandem.h"

"""


def snippets(text):
    lines = text.split("\n")
    i = 0
    while i < len(lines):
        if lines[i].strip() == "```cpp":
            start = i + 1
            j = start
            while j < len(lines) and lines[j].strip() != "```":
                j += 1
            if j == len(lines):
                sys.exit(f"doc_snippets: the block at line {i + 1} is not closed")
            m = re.match(r"//\s*test:\s*([A-Za-z_][A-Za-z0-9_]*)\s*$", lines[start]) if start < j else None
            if m:
                yield m.group(1), start + 2, lines[start + 1:j]  # 1-based line of the body's first line
            i = j
        i += 1


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    guide, out = sys.argv[1], sys.argv[2]
    with open(guide, encoding="utf-8") as f:
        text = f.read()
    names, parts = set(), [HEADER.format(guide=guide)]
    for name, line, body in snippets(text):
        if name in names:
            sys.exit(f"doc_snippets: two blocks are named {name}")
        names.add(name)
        parts.append(f"TEST(ApiDoc, {name}) {{\n#line {line} \"{guide}\"\n" + "\n".join(body) + "\n}\n\n")
    if not names:
        sys.exit(f"doc_snippets: {guide} has no `// test:` block")
    with open(out, "w", encoding="utf-8") as f:
        f.write("".join(parts))


if __name__ == "__main__":
    main()
