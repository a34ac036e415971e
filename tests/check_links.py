#!/usr/bin/env python3
"""Checks that every relative link in README.md and docs/*.md resolves: the file (or folder)
exists, and a #anchor names a heading of the target Markdown file (GitHub's slugs).

  check_links.py ROOT        check ROOT/README.md and ROOT/docs/**/*.md; exit 1 naming each broken link
  check_links.py --self-test  check the checker on a small tree with known good and broken links

Links inside code (fenced blocks, `inline code`) are not links and are skipped; so are absolute
URLs (http:, https:, mailto:). ctest runs both forms (tests/CMakeLists.txt: docs.links).
"""
import os
import re
import sys
import tempfile

LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
FENCE = re.compile(r"^\s*(```|~~~)")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
HTML_ANCHOR = re.compile(r"<a\s+(?:name|id)=\"([^\"]+)\"")


def prose_lines(text):
    """(line number, line) outside fenced code blocks, inline code blanked out."""
    fenced = False
    for n, line in enumerate(text.splitlines(), 1):
        if FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            yield n, re.sub(r"`+[^`]*`+", "", line)


def slug(heading):
    """GitHub's anchor for a heading: lower case, markup and punctuation dropped, spaces to '-'."""
    s = re.sub(r"`([^`]*)`", r"\1", heading)
    s = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", s)  # a link keeps its text
    s = re.sub(r"[*_]{1,3}([^*_]+)[*_]{1,3}", r"\1", s)
    s = s.strip().lower()
    s = re.sub(r"[^\w\- ]", "", s)
    return s.replace(" ", "-")


def anchors(path):
    found, seen = set(), {}
    with open(path, encoding="utf-8") as f:
        text = f.read()
    for _, line in prose_lines(text):
        found.update(HTML_ANCHOR.findall(line))
    fenced = False
    for line in text.splitlines():
        if FENCE.match(line):
            fenced = not fenced
            continue
        m = None if fenced else HEADING.match(line)
        if m:
            base = slug(m.group(2))
            n = seen.get(base, 0)
            seen[base] = n + 1
            found.add(base if n == 0 else f"{base}-{n}")
    return found


def check_file(path, root):
    broken = []
    with open(path, encoding="utf-8") as f:
        text = f.read()
    for n, line in prose_lines(text):
        for target in LINK.findall(line):
            if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I):
                continue  # http:, https:, mailto:
            file_part, _, anchor = target.partition("#")
            dest = os.path.normpath(os.path.join(os.path.dirname(path), file_part)) if file_part else path
            where = f"{os.path.relpath(path, root)}:{n}: {target}"
            if not os.path.exists(dest):
                broken.append(f"{where}: no such file {os.path.relpath(dest, root)}")
            elif anchor and dest.endswith(".md") and anchor not in anchors(dest):
                broken.append(f"{where}: no heading #{anchor} in {os.path.relpath(dest, root)}")
    return broken


def check_tree(root):
    files = [os.path.join(root, "README.md")]
    docs = os.path.join(root, "docs")
    if os.path.isdir(docs):
        files += sorted(os.path.join(d, f) for d, _, names in os.walk(docs) for f in names
                        if f.endswith(".md"))
    broken = []
    for f in files:
        if os.path.exists(f):
            broken += check_file(f, root)
    return files, broken


def self_test():
    with tempfile.TemporaryDirectory() as root:
        os.makedirs(os.path.join(root, "docs"))
        os.makedirs(os.path.join(root, "bench"))
        open(os.path.join(root, "bench", "r.md"), "w").close()
        with open(os.path.join(root, "README.md"), "w") as f:
            f.write("# Top\n## Build on a GPU (CUDA)\n## Top\n"
                    "[ok](docs/a.md) [ok](docs/a.md#the-a-page) [ok](#build-on-a-gpu-cuda) "
                    "[ok](#top-1) [ok](bench/) [ok](bench/r.md) [web](https://example.com/x)\n"
                    "[bad file](docs/missing.md) [bad anchor](docs/a.md#nope)\n"
                    "`[code](docs/missing-in-code.md)`\n```\n[fenced](docs/missing-fenced.md)\n```\n")
        with open(os.path.join(root, "docs", "a.md"), "w") as f:
            f.write("# The `a` page\n[ok](../README.md#top) [bad](../README.md#gone) [bad](b.md)\n")
        _, broken = check_tree(root)
        expect = ["README.md:5: docs/missing.md", "README.md:5: docs/a.md#nope",
                  "docs/a.md:2: ../README.md#gone", "docs/a.md:2: b.md"]
        got = [b.split(": no ")[0] for b in broken]
        if got != expect:
            print("check_links self-test failed:\n  expected " + repr(expect) + "\n  got      " + repr(got))
            return 1
        print("check_links self-test: the 4 broken links found, the good ones and code skipped")
        return 0


def main(argv):
    if argv[1:] == ["--self-test"]:
        return self_test()
    if len(argv) != 2:
        print(__doc__)
        return 2
    files, broken = check_tree(argv[1])
    for b in broken:
        print("broken link: " + b)
    print(f"check_links: {len(files)} files, {len(broken)} broken links")
    return 1 if broken else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
