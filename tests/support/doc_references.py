"""Citations in the docs, comments and docstrings that name nothing in the checkout.

A sentence such as "see vase_sglang.<module> for the variants" is false from the day the
module it names goes (or if it never existed). This module finds five kinds of citation
in prose and checks each against the checkout, reading its source rather than importing
it wherever the source answers (the tests import the installed copy; the prose describes
this one):

* dotted names ``vase_sglang.<module>[.<name>...]``: the longest prefix that is a module
  (a ``.py`` file or a package folder under ``vase_sglang/``, or under a folder that
  pyproject.toml's ``[tool.setuptools.package-dir]`` ships as a subpackage:
  ``vase_sglang.kernels`` is ``kernels/``), then each further name defined in it (a top-level
  definition, assignment or import, a class member); the module is imported only when its
  source cannot say (a name it imports, a member a base class may define);
* a name in a file: ``name`` in path.py, path.py::name, path.py:name, where path.py is a
  Python file of the checkout (a bare file name when only one file has it);
* repository paths (``patches/hooks.py``, ``tests/unit/``, ``results/chain-eval/results.md``,
  globs too), resolved from the repository root, from the citing file's folder, or from
  the parent of any folder with the path's first name (so ``plugin/cpu_mode.py`` is
  ``vase_sglang/plugin/cpu_mode.py``); a path counts only when its first name is a folder
  of the checkout outside ``results/``, so URLs, model ids, SGLang's own paths and a run's
  ``logs/`` are left alone, and a path a command is told to write (``--out results/x``,
  ``> out.json``) is not a citation; the few outputs that prose names as to be committed,
  and no run has written yet, are listed in ``GENERATED`` with the reason;
* relative Markdown links, resolved from the page's folder, and their ``#anchors``, which
  must name a heading (GitHub's slug of it) of the page they point to;
* ``python -m vase_sglang.<module>`` commands, whose module must exist and be runnable.

Names and paths followed by a placeholder (``vase_sglang.<tool>``, ``results/<run>/``) are
templates, not citations. SGLang names are not checked here: ``patches/manifest.py`` and
``vase_sglang/plugin/contract.py`` pin those, checked by ``tests/unit/test_manifest.py``.

The prose scanned (``Checkout.scanned``): every Markdown file except ``CHANGELOG.md``,
whose entries describe the past, and those under ``results/``, which each run wrote about
the checkout it ran from; the comments and docstrings (any string statement) of the Python
files under ``vase_sglang/``, ``kernels/``, ``patches/``, ``scripts/``, ``tests/`` and
``loadtest/``, and of ``setup.py``; the comment
lines of the shell scripts, ``.ci/run`` and ``pyproject.toml``.

The same prose is read for claims (``check_claims``): sentences known to be false
(``FALSE_CLAIMS``), anywhere in it, and history (``HISTORY``) in the comments and
docstrings of Python files, which should say what the code is, not what it was or which
issue changed it: that belongs in ``CHANGELOG.md`` and the commit messages. The patterns
live in code, not in prose, so this module's own lists are not read as claims.
"""

from __future__ import annotations

import ast
import fnmatch
import importlib
import io
import posixpath
import re
import subprocess
import tokenize
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = "vase_sglang"

PYTHON_TREES = ("vase_sglang", "kernels", "patches", "scripts", "tests", "loadtest")
# Paths a command writes when it runs, which a checkout does not hold: pattern -> why.
GENERATED: dict[str, str] = {
    "results/gpu/": "where README.md and docs/gpu.md say to commit a GPU run's gpu_check.json and "
                    "gpu_e2e.json; no run on a GPU has been committed yet",
}

# vase_sglang.<module>[.<name>...], not inside a longer dotted name.
DOTTED = re.compile(r"(?<![\w.])" + PACKAGE + r"(?:\.[A-Za-z_]\w*)+")
# python -m vase_sglang.<module> (python3, .venv/bin/python, ... too), across a line break.
RUN = re.compile(r"\bpython[\d.]*\s+-m\s+(" + PACKAGE + r"(?:\.[A-Za-z_]\w*)*)")
# A relative path with at least one slash, not part of a URL or an absolute path.
PATH = re.compile(r"(?<![\w/.:~$@%-])((?:\.\.?/)*[\w.-]+(?:/[\w.*-]+)+/?|(?:\.\.?/)*[\w.-]+/)")
# ``name`` in path.py, ``Class.member`` in `dir/path.py`, path.py::name, path.py:name.
NAME_IN_FILE = re.compile(
    r"`+(?P<name>[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*)(?:\(\))?`+\s+in\s+`*(?P<path>(?:[\w.-]+/)*[\w-]+\.py)\b"
    r"|(?<![\w/.-])(?P<path2>(?:[\w.-]+/)*[\w-]+\.py)::?(?P<name2>[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*)")
# Text just before a path that a command writes: --out X, --output-file X, -o X, > X, tee X.
OUTPUT_FLAG = re.compile(r"(?:--out[\w-]*|--output[\w-]*|\s-o|>>?|\btee)[\s=]+$")
# A Markdown link's target: [text](target) or [text](target "title").
LINK = re.compile(r"\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
# Names every module has, which its source does not define.
MODULE_DUNDERS = {"__name__", "__file__", "__doc__", "__path__", "__spec__", "__loader__", "__package__", "__dict__"}


@dataclass(frozen=True)
class Finding:
    source: str
    line: int
    cited: str
    note: str = ""

    def __str__(self) -> str:
        note = f" ({self.note})" if self.note else ""
        return f"{self.source}:{self.line}: cites {self.cited}, which does not exist{note}"


@dataclass(frozen=True)
class ClaimFinding:
    source: str
    line: int
    said: str
    why: str

    def __str__(self) -> str:
        return f"{self.source}:{self.line}: says {self.said!r}: {self.why}"


@dataclass(frozen=True)
class Prose:
    """A run of prose from one file: a Markdown file, a docstring, adjacent comments."""

    source: str  # the file, relative to the root (posix)
    line: int  # the line of the text's first line
    text: str
    markdown: bool = False


def _phrase(words: str) -> re.Pattern[str]:
    """A phrase matched case-blind, across line breaks and a comment's or docstring's indent."""
    return re.compile(r"\b" + r"\s+".join(map(re.escape, words.split())) + r"\b", re.IGNORECASE)


# Sentences that are false of this checkout, in any prose: pattern -> why.
FALSE_CLAIMS: dict[re.Pattern[str], str] = {
    _phrase("each layer knows only the one below"):
        "a layer may import every layer below it (tests/unit/test_import_graph.py): patches/memory.py "
        "imports vase_sglang.kernels and vase_sglang.sharding past the adapter",
    _phrase("one short call"):
        "not every hook is one short call: patches/memory.py re-implements SGLang's "
        "_create_buffers_normal, and the guards check and normalise request bodies",
}
# An issue number of this project's tracker (the word, singular or plural, then the
# number, with or without a hash sign), which dates the code instead of describing it.
ISSUE = re.compile(r"\bissues?\s*#?\d+", re.IGNORECASE)
# The same words after another project's name are a fact about that dependency, not
# this checkout's past (an issue URL, a path ending in the number, is no match at all).
UPSTREAM_ISSUE = re.compile(r"\b(?:sglang|triton|torch|pytorch|transformers|upstream)(?:'s)?\s+$", re.IGNORECASE)
# History in the comments and docstrings of Python files: pattern -> why. Precise on
# purpose: the words of a change ("no longer", "used to", "previously") also say what code
# does today (a target that no longer matches, the key used to sort, a previously kept
# token), so they are left to review.
HISTORY: dict[re.Pattern[str], str] = {
    ISSUE: "names the issue behind the code; say what the code does (history goes in CHANGELOG.md)",
    # The definite article, the word for a loan, then a GPU's model, "GPU" or "machine":
    # one loan of a device machine, not the machine.
    re.compile(r"\bthe\s+lent\s+(?:[A-Z]\d+|GPU|machine)", re.IGNORECASE):
        "names one loan of a machine; name the machine (its image, its versions)",
}


def claims_in(prose: Prose) -> Iterator[ClaimFinding]:
    """The false claims in one run of prose: ``FALSE_CLAIMS`` anywhere, ``HISTORY`` in the
    comments and docstrings of a Python file."""
    patterns = list(FALSE_CLAIMS.items())
    if prose.source.endswith(".py") and not prose.markdown:
        patterns += HISTORY.items()
    for pattern, why in patterns:
        for m in pattern.finditer(prose.text):
            if pattern is ISSUE and UPSTREAM_ISSUE.search(prose.text, max(0, m.start() - 24), m.start()):
                continue
            line = prose.line + prose.text.count("\n", 0, m.start())
            yield ClaimFinding(prose.source, line, " ".join(m.group().split()), why)


class Checkout:
    """The files of a checkout (tracked or not ignored), links to folders followed."""

    def __init__(self, root: Path = ROOT) -> None:
        self.root = root

    @cached_property
    def files(self) -> frozenset[str]:
        try:
            out = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                                 cwd=self.root, capture_output=True, check=True, timeout=60).stdout
            listed = {name for name in out.decode().split("\0") if name}
        except (OSError, subprocess.SubprocessError):  # not a git checkout: every file but caches
            skip = {".git", ".venv", "__pycache__", "build", "dist", ".mypy_cache", ".ruff_cache", ".pytest_cache"}
            listed = {p.relative_to(self.root).as_posix() for p in self.root.rglob("*")
                      if (p.is_file() or p.is_symlink()) and not skip & set(p.relative_to(self.root).parts)}
        files = {name for name in listed if (self.root / name).exists()}
        for link in [name for name in files if (self.root / name).is_symlink() and (self.root / name).is_dir()]:
            target = (self.root / link).resolve().relative_to(self.root).as_posix() + "/"
            files.discard(link)
            files |= {link + "/" + name[len(target):] for name in listed if name.startswith(target)}
        return frozenset(files)

    @cached_property
    def folders(self) -> frozenset[str]:
        folders = {"."}
        for name in self.files:
            while "/" in name:
                name = posixpath.dirname(name)
                folders.add(name)
        return frozenset(folders)

    @cached_property
    def parents_by_name(self) -> dict[str, set[str]]:
        """Folder name -> the folders holding a folder of that name."""
        parents: dict[str, set[str]] = {}
        for folder in self.folders - {"."}:
            if folder.startswith("results/"):
                continue  # results/<run>/logs/ is not where a bare logs/ path points
            parent, name = posixpath.split(folder)
            parents.setdefault(name, set()).add(parent or ".")
        return parents

    def exists(self, path: str) -> bool:
        """A file or folder of the checkout, ``path`` relative to its root (globs allowed)."""
        path = path.rstrip("/") or "."
        if any(c in path for c in "*?["):
            return any(fnmatch.fnmatchcase(name, path) for name in self.files | self.folders)
        return path in self.files or path in self.folders

    def scanned(self) -> Iterator[Prose]:
        """Every run of prose this checker reads (see the module docstring)."""
        for name in sorted(self.files):
            top, _, rest = name.partition("/")
            suffix = posixpath.splitext(name)[1]
            if suffix == ".md" and name != "CHANGELOG.md" and top != "results":
                yield Prose(name, 1, (self.root / name).read_text(encoding="utf-8"), markdown=True)
            elif suffix == ".py" and (rest and top in PYTHON_TREES or name == "setup.py"):
                yield from python_prose((self.root / name).read_text(encoding="utf-8"), name)
            elif suffix == ".sh" or name in ("pyproject.toml", ".ci/run"):
                yield from hash_comments((self.root / name).read_text(encoding="utf-8"), name)


def python_prose(source: str, name: str = "<text>") -> Iterator[Prose]:
    """The docstrings (any string statement) and the comments of Python source, adjacent
    comment lines as one run, so a citation may cross a line break."""
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
            yield Prose(name, node.lineno, node.value.value)
    comments = [(tok.start[0], tok.string.lstrip("#")) for tok in tokenize.generate_tokens(io.StringIO(source).readline)
                if tok.type == tokenize.COMMENT]
    yield from _runs(comments, name)


def hash_comments(source: str, name: str) -> Iterator[Prose]:
    """Whole-line ``#`` comments of a shell script or TOML file (not the ``#!`` line)."""
    lines = [(n, line.strip()[1:]) for n, line in enumerate(source.splitlines(), 1)
             if line.strip().startswith("#") and not line.startswith("#!")]
    yield from _runs(lines, name)


def _runs(lines: list[tuple[int, str]], name: str) -> Iterator[Prose]:
    start = 0
    for i in range(1, len(lines) + 1):
        if i == len(lines) or lines[i][0] != lines[i - 1][0] + 1:
            yield Prose(name, lines[start][0], "\n".join(text for _, text in lines[start:i]))
            start = i


class Checker:
    """Checks citations against a checkout, parsing each module it looks into once."""

    def __init__(self, checkout: Checkout | None = None) -> None:
        self.checkout = checkout or Checkout()
        self._trees: dict[str, ast.Module | None] = {}

    def check(self, prose: Iterable[Prose] | None = None) -> list[Finding]:
        """Every false citation in ``prose`` (default: all this checker scans), in order."""
        found: dict[tuple[str, int, str], Finding] = {}
        for run in self.checkout.scanned() if prose is None else prose:
            for finding in self.check_prose(run):
                found.setdefault((finding.source, finding.line, finding.cited), finding)
        return list(found.values())

    def check_prose(self, prose: Prose) -> Iterator[Finding]:
        text = prose.text
        folder = posixpath.dirname(prose.source)

        def line(pos: int) -> int:
            return prose.line + text.count("\n", 0, pos)

        for m in DOTTED.finditer(text):
            if not self.dotted_exists(m.group()):
                yield Finding(prose.source, line(m.start()), m.group())
        for m in NAME_IN_FILE.finditer(text):
            name, path = m.group("name") or m.group("name2"), m.group("path") or m.group("path2")
            file = self.python_file(path, folder)
            if file is not None and not self.defined_in_file(file, name):
                yield Finding(prose.source, line(m.start()), f"{name} in {path}")
        for m in RUN.finditer(text):
            if _is_template(text, m.end(1)):
                continue
            module = m.group(1)
            if self.dotted_exists(module) and not self.runnable(module):
                yield Finding(prose.source, line(m.start()), f"python -m {module}", f"{module} has no __main__")
        if prose.markdown:
            for m in LINK.finditer(text):
                target, _, anchor = m.group(1).partition("#")
                if re.match(r"[a-z][a-z0-9+.-]*:", target) or target.startswith("/"):
                    continue  # a URL, mailto:
                page = posixpath.normpath(posixpath.join(folder, target)) if target else prose.source
                if target and not self._exists_from(page):
                    yield Finding(prose.source, line(m.start(1)), target)
                elif anchor and page.endswith(".md") and anchor not in self.anchors(page, text if not target else None):
                    yield Finding(prose.source, line(m.start(1)), m.group(1), "no such heading")
        for m in PATH.finditer(text):
            path = m.group(1).rstrip(".")
            if (_is_template(text, m.end(1)) or not self._is_repo_path(path) or self._generated(path)
                    or OUTPUT_FLAG.search(text, max(0, m.start(1) - 40), m.start(1))):
                continue
            if not self.path_exists(path, folder):
                yield Finding(prose.source, line(m.start(1)), path)

    # -- paths ---------------------------------------------------------------------------

    def _is_repo_path(self, path: str) -> bool:
        first = next((part for part in path.split("/") if part not in (".", "..")), "")
        return first in self.checkout.parents_by_name and "/" in path.strip("/")

    def _exists_from(self, joined: str) -> bool:
        norm = posixpath.normpath(joined)
        return not norm.startswith("..") and self.checkout.exists(norm)

    def path_exists(self, path: str, folder: str = ".") -> bool:
        """``path`` names a file or folder from the root, from ``folder``, or from a folder
        holding a folder of the path's first name."""
        first = next(part for part in path.split("/") if part not in (".", ".."))
        bases = {".", folder or "."} | self.checkout.parents_by_name.get(first, set())
        return any(self._exists_from(posixpath.join(base, path)) for base in bases)

    @staticmethod
    def _generated(path: str) -> bool:
        return any(fnmatch.fnmatchcase(path.rstrip("/"), pattern.rstrip("/")) for pattern in GENERATED)

    def python_file(self, path: str, folder: str = ".") -> str | None:
        """The checkout's Python file that ``path`` names (a bare name when only one file
        has it), or None when there is none: then the path check reports it, or it names
        a file outside the checkout (SGLang's)."""
        if "/" not in path:
            matches = [name for name in self.checkout.files
                       if posixpath.basename(name) == path and not name.startswith("results/")]
            return matches[0] if len(matches) == 1 else None
        first = next(part for part in path.split("/") if part not in (".", ".."))
        for base in sorted({".", folder or "."} | self.checkout.parents_by_name.get(first, set())):
            norm = posixpath.normpath(posixpath.join(base, path))
            if norm in self.checkout.files:
                return norm
        return None

    def anchors(self, page: str, text: str | None = None) -> set[str]:
        """The ``#anchors`` of a Markdown page (of ``text`` when given): its headings'
        GitHub slugs, numbered from -1 when repeated, and explicit ``id``/``name``s."""
        if text is None:
            text = (self.checkout.root / page).read_text(encoding="utf-8")
        found: set[str] = set(re.findall(r"<a\s+(?:id|name)=\"([^\"]+)\"", text))
        fenced = False
        for raw in text.splitlines():
            if raw.lstrip().startswith("```"):
                fenced = not fenced
            heading = re.match(r" {0,3}#{1,6}\s+(.*?)\s*#*\s*$", raw)
            if heading and not fenced:
                slug = re.sub(r"[^\w\- ]", "", heading.group(1).lower()).replace(" ", "-")
                n, unique = 0, slug
                while unique in found:
                    n += 1
                    unique = f"{slug}-{n}"
                found.add(unique)
        return found

    # -- dotted names -----------------------------------------------------------------------

    @cached_property
    def package_dirs(self) -> dict[str, str]:
        """pyproject.toml's ``[tool.setuptools.package-dir]``: package -> its folder."""
        file = self.checkout.root / "pyproject.toml"
        if not file.is_file():
            return {}
        dirs = tomllib.loads(file.read_text(encoding="utf-8")).get("tool", {}).get("setuptools", {})
        return {package: folder for package, folder in dirs.get("package-dir", {}).items() if package}

    def module_path(self, dotted: str) -> str | None:
        """The file (or namespace folder) of module ``dotted`` in the checkout, or None."""
        base = dotted.replace(".", "/")
        shipped = [package for package in self.package_dirs if dotted == package or dotted.startswith(package + ".")]
        if shipped:
            package = max(shipped, key=len)
            base = self.package_dirs[package] + dotted[len(package):].replace(".", "/")
        for candidate in (f"{base}.py", f"{base}/__init__.py"):
            if candidate in self.checkout.files:
                return candidate
        return base if base in self.checkout.folders else None

    def runnable(self, module: str) -> bool:
        path = self.module_path(module) or ""
        runs_itself = path.endswith(".py") and not path.endswith("/__init__.py")
        return runs_itself or self.module_path(module + ".__main__") is not None

    def dotted_exists(self, dotted: str) -> bool:
        parts = dotted.split(".")
        for i in range(len(parts), 0, -1):
            module = ".".join(parts[:i])
            if self.module_path(module) is not None:
                break
        else:
            return False
        names = parts[i:]
        if not names:
            return True
        path = self.module_path(module)
        assert path is not None
        known = self._static_lookup(path, names)
        return known if known is not None else _import_lookup(module, names)

    def defined_in_file(self, path: str, dotted: str) -> bool:
        """``dotted`` (``name`` or ``Class.member``) is defined in the Python file ``path``:
        at its top level or, for a single name, anywhere in it (a class member, a field)."""
        names = dotted.split(".")
        known = self._static_lookup(path, names)
        if known is False and len(names) == 1:
            tree = self._tree(path)
            known = tree is not None and any(names[0] in _names(node) for node in ast.walk(tree)
                                             if isinstance(node, ast.stmt))
        module = _module_name(path)
        if known is None and module is not None:
            return _import_lookup(module, names)
        return known is not False

    def _tree(self, path: str) -> ast.Module | None:
        if path not in self._trees:
            file = self.checkout.root / path
            self._trees[path] = ast.parse(file.read_text(encoding="utf-8")) if file.is_file() else None
        return self._trees[path]

    def _static_lookup(self, path: str, names: list[str]) -> bool | None:
        """Whether the module at ``path`` defines the chain ``names``; None when its source
        cannot say."""
        tree = self._tree(path)
        if tree is None:  # a namespace folder: only submodules, found above
            return names[0] in MODULE_DUNDERS
        if names[0] in MODULE_DUNDERS:
            return len(names) == 1 or None
        found = _defined(tree.body, names[0], module_level=True)
        if found is not True or len(names) == 1:
            return found
        cls = self._class(path, names[0])
        for depth, name in enumerate(names[1:], 2):
            if cls is None:
                return None  # a member of a value, or of a class defined elsewhere: ask the import
            found = self._member(*cls, name)
            if found is not True or depth == len(names):
                return found
            cls = self._class(cls[0], name, cls[1].body)
        return True

    def _class(self, path: str, name: str, body: list[ast.stmt] | None = None,
               depth: int = 0) -> tuple[str, ast.ClassDef] | None:
        """The class ``name`` is in the module at ``path`` (or ``body``): defined there, or
        imported from a module of the checkout; None when it is not a class found here."""
        tree = self._tree(path)
        node = _definition(body if body is not None else tree.body if tree else [], name)
        if isinstance(node, ast.ClassDef):
            return path, node
        if isinstance(node, ast.ImportFrom) and body is None and depth < 5:
            source = self._import_source(path, node)
            alias = next(a for a in node.names if (a.asname or a.name) == name)
            if source is not None:
                return self._class(source, alias.name, None, depth + 1)
        return None

    def _import_source(self, path: str, node: ast.ImportFrom) -> str | None:
        """The checkout file that ``from <module> import ...`` in ``path`` reads."""
        if node.level:
            base = posixpath.dirname(path)
            for _ in range(node.level - 1):
                base = posixpath.dirname(base)
            base = posixpath.join(base, *(node.module or "").split(".")) if node.module else base
            for candidate in (f"{base}.py", f"{base}/__init__.py"):
                if candidate in self.checkout.files:
                    return candidate
            return None
        if node.module and node.module.split(".")[0] == PACKAGE:
            found = self.module_path(node.module)
            return found if found and found.endswith(".py") else None
        return None

    def _member(self, path: str, cls: ast.ClassDef, name: str, depth: int = 0) -> bool | None:
        """Whether class ``cls`` (in ``path``) or a base of it has member ``name``; None when
        a base is not a class of the checkout (SGLang's, a generic), so it cannot say."""
        if _defined(cls.body + _self_assignments(cls), name, module_level=False):
            return True
        answer: bool | None = False
        for base in cls.bases:
            if isinstance(base, ast.Name) and base.id == "object":
                continue
            found = self._class(path, base.id) if isinstance(base, ast.Name) and depth < 10 else None
            if found is None:
                answer = None
            elif (member := self._member(*found, name, depth + 1)) is not False:
                if member:
                    return True
                answer = None
        return answer


def _is_template(text: str, end: int) -> bool:
    """A name or path continued by a placeholder: ``vase_sglang.<tool>``, ``results/<run>/``."""
    rest = text[end:end + 2]
    return rest[:1] in ("<", "{", "$", "%") or rest in (".<", ".{", "/<", "/{", "/$")


def _flat(body: list[ast.stmt]) -> Iterator[ast.stmt]:
    """Statements of a body, those under if/try/with included (conditional definitions)."""
    for stmt in body:
        yield stmt
        if isinstance(stmt, (ast.If, ast.Try, ast.With)):
            yield from _flat(stmt.body + getattr(stmt, "orelse", []) + getattr(stmt, "finalbody", []))
            for handler in getattr(stmt, "handlers", []):
                yield from _flat(handler.body)


def _targets(target: ast.expr) -> Iterator[str]:
    if isinstance(target, ast.Name):
        yield target.id
    elif isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name) and target.value.id == "self":
        yield target.attr
    elif isinstance(target, (ast.Tuple, ast.List)):
        for elt in target.elts:
            yield from _targets(elt)


def _names(stmt: ast.stmt) -> Iterator[str]:
    if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        yield stmt.name
    elif isinstance(stmt, ast.Assign):
        for target in stmt.targets:
            yield from _targets(target)
    elif isinstance(stmt, (ast.AnnAssign, ast.AugAssign)):
        yield from _targets(stmt.target)
    elif isinstance(stmt, (ast.Import, ast.ImportFrom)):
        for alias in stmt.names:
            yield alias.asname or alias.name.split(".")[0]


def _defined(body: list[ast.stmt], name: str, module_level: bool) -> bool | None:
    for stmt in _flat(body):
        if name in _names(stmt):
            return True
        if isinstance(stmt, ast.ImportFrom) and any(alias.name == "*" for alias in stmt.names):
            return None
        if module_level and isinstance(stmt, ast.FunctionDef) and stmt.name == "__getattr__":
            return None
    return False


def _definition(body: list[ast.stmt], name: str) -> ast.stmt | None:
    return next((stmt for stmt in _flat(body) if name in _names(stmt)), None)


def _self_assignments(cls: ast.ClassDef) -> list[ast.stmt]:
    """``self.<name> = ...`` in the class's methods: instance attributes."""
    return [node for method in cls.body if isinstance(method, (ast.FunctionDef, ast.AsyncFunctionDef))
            for node in ast.walk(method) if isinstance(node, (ast.Assign, ast.AnnAssign))]


def _module_name(path: str) -> str | None:
    """The module a checkout file is imported as (``kernels/ops.py``: ``vase_sglang.kernels.ops``)."""
    if not path.endswith(".py") or path.split("/")[0] not in (PACKAGE, "kernels", "patches"):
        return None
    module = path[:-3].replace("/", ".").removesuffix(".__init__")
    return module if module.startswith(PACKAGE) else f"{PACKAGE}.{module}"


def _import_lookup(module: str, names: list[str]) -> bool:
    try:
        obj = importlib.import_module(module)
    except Exception:  # a module that cannot import cannot be cited as working
        return False
    for name in names:
        if not hasattr(obj, name):
            return False
        obj = getattr(obj, name)
    return True


def check(root: Path = ROOT) -> list[Finding]:
    """Every false citation in the prose of the checkout at ``root``."""
    return Checker(Checkout(root)).check()


def check_text(text: str, source: str = "<text>", markdown: bool = True, root: Path = ROOT) -> list[Finding]:
    """The false citations in ``text``, read as a Markdown file at ``source``."""
    return Checker(Checkout(root)).check([Prose(source, 1, text, markdown=markdown)])


def check_claims(root: Path = ROOT) -> list[ClaimFinding]:
    """Every false claim and every history note in the prose of the checkout at ``root``."""
    return [finding for prose in Checkout(root).scanned() for finding in claims_in(prose)]
