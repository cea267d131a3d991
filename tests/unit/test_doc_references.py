"""Every module, file and name that a doc, comment or docstring cites exists, and none of
them says a sentence known to be false or carries history.

The checker (``support/doc_references.py``) reads every Markdown file but the changelog
and ``results/``, and the comments and docstrings of the code, and checks each
``vase_sglang.<module>[.<name>]``, name in a file (``name`` in path.py, path.py::name),
repository path, Markdown link and anchor, and ``python -m vase_sglang.<module>`` against
the checkout. In the same prose it looks for the false sentences of ``FALSE_CLAIMS`` and,
in Python comments and docstrings, the history patterns of ``HISTORY``. The planted cases
below prove it reports what it should: among them a ``kernels/_common.py`` comment that
cites a module that does not exist, reported at its line.
"""

from __future__ import annotations

from support import doc_references
from support.doc_references import Checker, ClaimFinding, Prose, check_text, claims_in, python_prose


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


def _claims(source: str, name: str) -> list[ClaimFinding]:
    return [finding for prose in python_prose(source, name) for finding in claims_in(prose)]


def test_no_doc_comment_or_docstring_says_a_false_sentence_or_history() -> None:
    findings = doc_references.check_claims()
    assert not findings, "false claims and history:\n" + "\n".join(map(str, findings))


def test_planted_false_sentences_are_reported_in_docs_and_code() -> None:
    doc = Prose("docs/x.md", 10, "Intro.\nEach layer knows only\nthe one below it. The hooks are one short call.",
                markdown=True)
    assert [(f.line, f.said) for f in claims_in(doc)] == [(11, "Each layer knows only the one below"),
                                                          (12, "one short call")]
    source = '"""The hooks are one short\n    call each."""\n\nX = 1  # each layer knows only the one below\n'
    assert sorted((f.line, f.said) for f in _claims(source, "vase_sglang/x.py")) == [
        (1, "one short call"), (4, "each layer knows only the one below")]
    # The list itself is code: a string that is not a statement is not prose.
    assert list(python_prose('PHRASES = ("one short call",)\n', "tests/support/x.py")) == []


def test_planted_history_is_reported_in_python_comments_and_docstrings_only() -> None:
    # Lines 1 and 2 to 4 are reported; 5 to 7 are other projects' issues, a URL, a lent GPU
    # in general and words of a change that also describe code; line 8 is a value, not prose.
    source = ('"""Reads the pool (issue 30)."""\n'
              "# as it stood before issue 28; see issues #12\n"
              "# triton 3.6, what the lent\n"
              "# H200 has; CI runs it on the lent GPU's Triton.\n"
              "# SGLang issue 1234 and triton's issue #567 are upstream facts;\n"
              "# https://github.com/sgl-project/sglang/issues/1234 too; a lent GPU runs the kit,\n"
              "# a target that no longer matches, the key used to sort.\n"
              'MESSAGE = "issue 30"\n')
    found = sorted(_claims(source, "kernels/x.py"), key=lambda f: (f.line, f.said))
    assert [(f.line, f.said) for f in found] == [(1, "issue 30"), (2, "issue 28"), (2, "issues #12"),
                                                 (3, "the lent H200"), (4, "the lent GPU")]
    assert str(found[0]).startswith("kernels/x.py:1: says 'issue 30': names the issue behind the code")
    # Markdown may say what was measured when, issue and machine included.
    assert list(claims_in(Prose("docs/gpu.md", 1, "issue 29's run on the lent H200", markdown=True))) == []


def test_a_planted_module_citation_is_reported() -> None:
    findings = check_text("see vase_sglang.warmup for the variants")
    assert [f.cited for f in findings] == ["vase_sglang.warmup"]
    assert str(findings[0]) == "<text>:1: cites vase_sglang.warmup, which does not exist"


def test_a_false_kernels_common_comment_is_reported_at_its_line() -> None:
    # A kernels/_common.py whose comment (lines 11-12) cites a module that does not exist.
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
