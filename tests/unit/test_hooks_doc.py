"""docs/hooks.md's tables are generated from patches/manifest.py and vase_sglang/plugin/contract.py
(``python -m vase_sglang.patches.docgen --write docs/hooks.md``): the document holds
exactly the generated block, so no entry, file, kind, reason or declared attribute is
copied by hand."""

from __future__ import annotations

from pathlib import Path

from vase_sglang.patches import docgen, manifest
from vase_sglang.plugin import contract

DOC = Path(__file__).resolve().parents[2] / "docs" / "hooks.md"


def test_hooks_md_holds_the_generated_tables() -> None:
    block = docgen.markdown()
    assert docgen.generated_block(DOC.read_text()) == block, (
        "docs/hooks.md's tables are out of date: run python -m vase_sglang.patches.docgen --write docs/hooks.md")


def test_the_generated_tables_cover_every_entry_and_every_declared_attribute() -> None:
    block = docgen.markdown()
    for entry in manifest.MANIFEST:
        assert f"`{entry.target.removeprefix('sglang.srt.')}`" in block, entry.target
    for protocol, _ in contract.CONTRACTS:
        row = next(line for line in block.splitlines() if f"| `{protocol.__name__}` |" in line)
        assert all(f"`{name}`" in row for name in contract.members(protocol)), protocol.__name__


def test_write_and_check_rewrite_only_the_block(tmp_path: Path) -> None:
    doc = tmp_path / "hooks.md"
    stale = f"# before\n\n{docgen.DOC_BEGIN}\nold table\n{docgen.DOC_END}\n\n## after\n"
    doc.write_text(stale)
    assert docgen.main(["--check", str(doc)]) == 1
    assert docgen.main(["--write", str(doc)]) == 0
    assert doc.read_text() == "# before\n\n" + docgen.markdown() + "\n## after\n"
    assert docgen.main(["--check", str(doc)]) == 0
    (tmp_path / "none.md").write_text("no markers\n")
    assert docgen.main(["--check", str(tmp_path / "none.md")]) == 1
