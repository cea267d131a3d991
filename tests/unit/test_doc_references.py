"""Every module, file and name that a doc, comment or docstring cites exists.

The checker (``support/doc_references.py``) reads every Markdown file but the changelog
and ``results/``, and the comments and docstrings of the code, and checks each
``vase_sglang.<module>[.<name>]``, name in a file (``name`` in path.py, path.py::name),
repository path, Markdown link and anchor, and ``python -m vase_sglang.<module>`` against
the checkout. The planted cases below prove it reports what it should: among them the
comment ``kernels/_common.py`` once had, which cited a module that never existed.
"""

from __future__ import annotations

from support import doc_references
from support.doc_references import Checker, Prose, check_text, python_prose


def test_every_citation_in_the_docs_comments_and_docstrings_exists() -> None:
    findings = doc_references.check()
    assert not findings, "false citations:\n" + "\n".join(map(str, findings))


def test_the_checker_reads_every_kind_of_prose() -> None:
    sources = {prose.source for prose in doc_references.Checkout().scanned()}
    for expected in ("README.md", "docs/hooks.md", "kernels/_common.py", "patches/manifest.py",
                     "vase_sglang/plugin/scheduler.py", "scripts/setup.sh", "tests/conftest.py",
                     "loadtest/locustfile.py"):
        assert expected in sources
    assert "CHANGELOG.md" not in sources
    assert not any(source.startswith(("results/", "vase_sglang/kernels/", "vase_sglang/patches/"))
                   for source in sources)


def test_a_planted_module_citation_is_reported() -> None:
    findings = check_text("see vase_sglang.warmup for the variants")
    assert [f.cited for f in findings] == ["vase_sglang.warmup"]
    assert str(findings[0]) == "<text>:1: cites vase_sglang.warmup, which does not exist"


def test_the_old_kernels_common_comment_is_reported_at_its_line() -> None:
    # kernels/_common.py as it stood before issue 30 (lines 11-14).
    source = ('"""Small helpers shared by the Triton kernels (tensor facts only, no SGLang)."""\n'
              + "\n" * 9
              + "# a key first seen while serving is a JIT compile in the middle of a decode step; the\n"
              + "# start-up warm-up (``vase_sglang.warmup``) launches every key serving can need.\n"
              + "LAUNCHED: set = set()\n")
    findings = Checker().check(python_prose(source, "kernels/_common.py"))
    assert [str(f) for f in findings] == ["kernels/_common.py:12: cites vase_sglang.warmup, which does not exist"]


def test_planted_names_members_paths_links_and_commands_are_reported() -> None:
    text = "\n".join([
        "vase_sglang.config.PolicyConfig and vase_sglang.kernels.ops exist;",   # 1
        "vase_sglang.config.NoSuchThing does not, nor vase_sglang.plugin.nowhere.",  # 2
        "patches/manifest.py, plugin/cpu_mode.py and tests/unit/ exist; patches/warmup.py does not.",  # 3
        "`python -m vase_sglang.calibrate` runs; `python -m",  # 4
        "vase_sglang.plugin` does not (a package without __main__).",  # 5
        "[hooks](docs/hooks.md), [here](#a-heading), [there](docs/hooks.md#four-layers);",  # 6
        "[gone](docs/warmup.md), [bad anchor](docs/hooks.md#no-such-section).",  # 7
        "Not citations: https://github.com/x/patches/none.py, Qwen/Qwen3-8B, sglang/srt/nowhere.py,",  # 8
        "results/<run>/results.md, --out results/new-run, vase_sglang.<tool>.",  # 9
        "## A heading",  # 10
        "``PolicyConfig.to_dict`` in vase_sglang/config.py exists, vase_sglang.config.PolicyConfig.budget too;",  # 11
        "``PolicyConfig.no_such`` in vase_sglang/config.py does not, nor vase_sglang.config.PolicyConfig.nope,",  # 12
        "nor tests/unit/test_doc_references.py::no_such_test.",  # 13
    ])
    findings = check_text(text, source="README.md")
    assert sorted((f.line, f.cited) for f in findings) == [
        (2, "vase_sglang.config.NoSuchThing"),
        (2, "vase_sglang.plugin.nowhere"),
        (3, "patches/warmup.py"),
        (4, "python -m vase_sglang.plugin"),
        (7, "docs/hooks.md#no-such-section"),
        (7, "docs/warmup.md"),
        (12, "PolicyConfig.no_such in vase_sglang/config.py"),
        (12, "vase_sglang.config.PolicyConfig.nope"),
        (13, "no_such_test in tests/unit/test_doc_references.py"),
    ]


def test_markdown_links_resolve_from_the_page_folder() -> None:
    checker = Checker()
    ok = Prose("docs/gpu.md", 1, "[manifest](../patches/manifest.py), [kernels](kernels.md)", markdown=True)
    bad = Prose("docs/gpu.md", 1, "[manifest](patches/manifest.py)", markdown=True)
    assert list(checker.check_prose(ok)) == []
    assert [f.cited for f in checker.check_prose(bad)] == ["patches/manifest.py"]
