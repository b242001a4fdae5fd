#!/usr/bin/env python3
"""The longest functions of a Rust source tree, counted as clippy's too_many_lines counts
them: the lines between the body's braces, blank lines and lines holding only comments left
out (an async fn's two brace lines count too: clippy sees its body after desugaring). A
function nested in another counts in both.

    python3 benches/function_lengths.py [SRC=src] [--top 15] [--over 70,100]

Prints the longest functions (lines, file:line, name; `test` marks test code: a `mod
tests` block or a tests.rs file), then how many exceed each bound. It agrees with clippy's
own count (`too_many_lines` at a low threshold) function for function, but for what a macro
makes or rewrites (it knows only `#[tokio::test]`), and needs no build, so it measures an old
commit's tree as quickly as the current one.
"""

import argparse
import os
import re
import sys

WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def blank_out(text):
    """The text with comments turned to spaces and the insides of string and character
    literals to 'S', newlines kept and every character in its place, so that every brace
    left is code and an offset in it is one in the text."""
    out = []
    i, n = 0, len(text)

    def keep_lines(chunk, fill):
        return "".join(c if c == "\n" else fill for c in chunk)

    while i < n:
        c = text[i]
        if text.startswith("//", i):
            end = text.find("\n", i)
            end = n if end < 0 else end
            out.append(" " * (end - i))
            i = end
        elif text.startswith("/*", i):
            depth, j = 1, i + 2
            while j < n and depth:
                if text.startswith("/*", j):
                    depth, j = depth + 1, j + 2
                elif text.startswith("*/", j):
                    depth, j = depth - 1, j + 2
                else:
                    j += 1
            out.append(keep_lines(text[i:j], " "))
            i = j
        elif (m := re.match(r'(b|c)?r(#*)"', text[i:])) and not _in_word(text, i):
            close = '"' + m.group(2)
            end = text.find(close, i + m.end())
            end = n if end < 0 else end + len(close)
            out.append(text[i : i + m.end()] + keep_lines(text[i + m.end() : end], "S"))
            i = end
        elif c == '"':
            j = i + 1
            while j < n and text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            out.append('"' + keep_lines(text[i + 1 : j], "S") + '"')
            i = j + 1
        elif c == "'":
            # A character literal ('x', '\n', '\u{1F600}', '{'), or a lifetime ('a), left as is.
            m = re.match(r"'(\\u\{[0-9a-fA-F]+\}|\\.|[^\\'])'", text[i:])
            if m:
                out.append("'" + "S" * (m.end() - 2) + "'")
                i += m.end()
            else:
                out.append(c)
                i += 1
        else:
            out.append(c)
            i += 1
    return "".join(out)


def _in_word(text, i):
    return i > 0 and (text[i - 1].isalnum() or text[i - 1] == "_")


def functions(code):
    """(name, line of `fn`, whether it is async, offsets of its body's braces) of each `fn`
    with a body."""
    found = []
    for m in re.finditer(r"\bfn\s+([A-Za-z_][A-Za-z0-9_]*)", code):
        # The body is the first brace outside parentheses and angle brackets after the name;
        # a `;` first means a declaration without one (a trait's required method).
        depth, j = 0, m.end()
        while j < len(code):
            ch = code[j]
            if ch in "([":
                depth += 1
            elif ch in ")]":
                depth -= 1
            elif depth == 0 and ch == ";":
                j = -1
                break
            elif depth == 0 and ch == "{":
                break
            j += 1
        if j < 0 or j >= len(code):
            continue
        open_at, depth = j, 0
        while j < len(code):
            if code[j] == "{":
                depth += 1
            elif code[j] == "}":
                depth -= 1
                if depth == 0:
                    break
            j += 1
        line_start = code.rfind("\n", 0, m.start()) + 1
        is_async = re.search(r"\basync\b", code[line_start : m.start()]) is not None
        # #[tokio::test] turns an async fn into a plain one that blocks on its body.
        is_async = is_async and "tokio::test" not in attributes(code, line_start)
        found.append((m.group(1), code.count("\n", 0, m.start()) + 1, is_async, open_at, j))
    return found


def attributes(code, line_start):
    """The attribute lines right above the line starting at `line_start` (doc comments, blank
    in `code`, between them are skipped)."""
    found = []
    lines = code[:line_start].split("\n")[:-1]
    for line in reversed(lines):
        if line.strip().startswith("#["):
            found.append(line)
        elif line.strip():
            break
    return "\n".join(found)


def code_lines(body):
    """The lines of `body` that hold code, by clippy's rule: a line counts when something
    other than a comment starts before any `//` or `/*` in it (a `//` inside a string counts
    as a comment's start, as in clippy)."""
    count, in_comment = 0, False
    for line in body.strip().split("\n"):
        code = False
        while True:
            line = line.lstrip()
            if not line:
                break
            if in_comment:
                end = line.find("*/")
                if end >= 0:
                    line, in_comment = line[end + 2 :], False
                    continue
            else:
                block = line.find("/*") if "/*" in line else len(line)
                single = line.find("//") if "//" in line else len(line)
                code |= block > 0 and single > 0
                if block < single:
                    line, in_comment = line[block + 2 :], True
                    continue
            break
        count += code
    return count


def test_spans(code):
    """The line ranges of `mod tests { ... }` blocks."""
    spans = []
    for m in re.finditer(r"\bmod\s+tests\s*\{", code):
        depth, j = 0, m.end() - 1
        while j < len(code):
            depth += {"{": 1, "}": -1}.get(code[j], 0)
            if depth == 0:
                break
            j += 1
        spans.append((code.count("\n", 0, m.start()) + 1, code.count("\n", 0, j) + 1))
    return spans


def measure(root):
    """(lines, path, line, name, is_test) of every function under `root`."""
    rows = []
    for folder, _, files in os.walk(root):
        for file in sorted(files):
            if not file.endswith(".rs"):
                continue
            path = os.path.join(folder, file)
            with open(path, encoding="utf-8") as f:
                text = f.read()
            code = blank_out(text)
            tests = test_spans(code)
            for name, at, is_async, open_at, close_at in functions(code):
                if is_async:
                    counted = code_lines(text[open_at : close_at + 1])
                else:
                    counted = code_lines(text[open_at + 1 : close_at])
                is_test = file == "tests.rs" or any(a <= at <= b for a, b in tests)
                rows.append((counted, path, at, name, is_test))
    return rows


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("src", nargs="?", default="src")
    parser.add_argument("--top", type=int, default=15)
    parser.add_argument("--over", default="70,100", help="bounds to count, comma-separated")
    args = parser.parse_args()
    if not os.path.isdir(args.src):
        sys.exit(f"{args.src}: no such directory")
    rows = sorted(measure(args.src), key=lambda r: (-r[0], r[1], r[2]))
    print(f"{len(rows)} functions under {args.src}; the {args.top} longest:")
    for counted, path, at, name, is_test in rows[: args.top]:
        print(f"{counted:6}  {path}:{at}  {name}{'  test' if is_test else ''}")
    for bound in (int(b) for b in args.over.split(",")):
        over = [r for r in rows if r[0] > bound]
        tests = sum(1 for r in over if r[4])
        print(f"over {bound} lines: {len(over)} ({tests} of them test code)")


if __name__ == "__main__":
    main()
