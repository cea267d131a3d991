"""``results/`` stays small and indexed: summaries committed, raw dumps rewritten by their commands.

Every committed file under ``results/`` is named in the index of ``results/README.md``
(its section ``## Index: every committed file``: a table whose first column holds paths
relative to ``results/`` in backticks, where ``*`` stands for one path component), every
name there matches a committed file, and the committed files take less than
``LIMIT_BYTES`` in all. The files are git's (``git ls-files``): what a run left beside
them and ``.gitignore`` keeps out does not count. Outside a git checkout there is nothing
to check.
"""

from __future__ import annotations

import fnmatch
import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "results"
LIMIT_BYTES = 2_000_000
INDEX_HEADING = "## Index: every committed file"


def tracked() -> list[str]:
    """Committed paths under results/, relative to it (skip: not a git checkout)."""
    try:
        out = subprocess.run(["git", "-C", str(ROOT), "ls-files", "-z", "--", "results"], capture_output=True,
                             text=True, timeout=60)
    except FileNotFoundError:
        pytest.skip("git is not installed")
    if out.returncode != 0:
        pytest.skip(f"not a git checkout: {out.stderr.strip()}")
    return sorted(p[len("results/"):] for p in out.stdout.split("\0") if p)


def index_entries(readme: str) -> list[str]:
    """The backticked names in the first column of the index table."""
    section = readme.split(INDEX_HEADING, 1)
    assert len(section) == 2, f"results/README.md has no '{INDEX_HEADING}' section"
    body = re.split(r"^## ", section[1], maxsplit=1, flags=re.M)[0]
    rows = [line for line in body.splitlines() if line.startswith("|") and not line.startswith("|---")][1:]
    return [name for row in rows for name in re.findall(r"`([^`]+)`", row.split("|")[1])]


def matches(path: str, entry: str) -> bool:
    parts, pattern = path.split("/"), entry.split("/")
    return len(parts) == len(pattern) and all(fnmatch.fnmatchcase(p, q) for p, q in zip(parts, pattern, strict=True))


def test_the_committed_results_take_less_than_2_mb() -> None:
    files = tracked()
    sizes = {p: (RESULTS / p).stat().st_size for p in files if (RESULTS / p).is_file()}
    largest = ", ".join(f"{p} ({n:,})" for p, n in sorted(sizes.items(), key=lambda kv: -kv[1])[:5])
    assert sum(sizes.values()) < LIMIT_BYTES, f"results/ holds {sum(sizes.values()):,} bytes; largest: {largest}"


def test_every_committed_result_is_in_the_readme_index_and_every_entry_is_committed() -> None:
    files = tracked()
    entries = index_entries((RESULTS / "README.md").read_text())
    missing = [p for p in files if not any(matches(p, e) for e in entries)]
    assert not missing, "committed under results/ but not in results/README.md's index: " + ", ".join(missing)
    stale = [e for e in entries if not any(matches(p, e) for p in files)]
    assert not stale, "results/README.md's index names what is not committed: " + ", ".join(stale)


def test_an_index_glob_is_one_path_component() -> None:
    assert matches("calibration/bundled/calibration.json", "calibration/*/calibration.json")
    assert not matches("calibration/a/b/calibration.json", "calibration/*/calibration.json")
    assert not matches("calibration/bundled/calibration.raw.json", "calibration/*/calibration.json")
    assert index_entries(f"x\n{INDEX_HEADING}\n\n| file | by |\n|---|---|\n| `a.json`, `b/*.txt` | `cmd` |\n"
                         "\n## next\n| `c.json` | x |\n") == ["a.json", "b/*.txt"]
