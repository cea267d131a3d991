"""One registry of policies: every class, tool and list derives from it.

A list anywhere that names three or more registered policies by hand is a second registry
that the next policy will miss (two are a comparison, such as none against vase); so is a
tool list that differs from what the registry says. Both fail here.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from vase_sglang import registry
from vase_sglang.config import POLICY_NAMES
from vase_sglang.policies import PILOT_POLICIES, POLICIES

ROOT = Path(__file__).resolve().parents[2]
# Product code and the test support, where a list of policies would be a second registry.
# (Tests pick the cases they check by name; that is not a list of all policies.)
SCANNED = ["vase_sglang", "patches", "kernels", "loadtest", "scripts", "tests/support"]


def test_every_registered_policy_has_one_class_with_its_flags() -> None:
    assert tuple(POLICIES) == registry.POLICY_NAMES == POLICY_NAMES
    for name, cls in POLICIES.items():
        spec = registry.REGISTRY[name]
        assert cls.name == name and spec.summary
        assert (cls.needs_queries, cls.draws_noise, cls.stateful, cls.evicts) == (
            spec.reads_queries, spec.draws_noise, spec.stateful, spec.evicts)
        # Noise drawn each round makes a policy stochastic; state is scored from queries here.
        assert not spec.draws_noise or spec.stochastic
    assert set(PILOT_POLICIES) == set(registry.PILOT_REGISTRY)
    assert not set(registry.PILOT_REGISTRY) & set(registry.REGISTRY)


def test_the_tools_lists_are_the_registrys() -> None:
    from vase_sglang.calibrate import analysis
    from vase_sglang.eval import __main__ as eval_main
    from vase_sglang.fidelity import sweep
    from vase_sglang.plugin.planning import reachable_policies

    assert sweep.SWEEP_POLICIES == registry.EVICTING and sweep.SEEDED == registry.STOCHASTIC
    served = [changes["policy"] for changes in analysis.CANDIDATES.values()]
    assert set(served) == set(registry.EVICTING)  # every policy, and variants of known ones only
    assert set(analysis.STOCHASTIC) == {label for label, changes in analysis.CANDIDATES.items()
                                        if registry.spec(changes["policy"]).stochastic}
    assert eval_main.POLICY_NAMES == registry.POLICY_NAMES
    from vase_sglang.config import PolicyConfig

    vase = PolicyConfig(policy="vase", budget=64, recent=16)
    assert reachable_policies(vase, telemetry=True) == list(registry.EVICTING)
    assert reachable_policies(vase.replace(policy="curdkv")) == [
        n for n in registry.EVICTING if not registry.REGISTRY[n].reads_queries]


def test_the_fuzz_draws_every_registered_policy() -> None:
    from hypothesis import HealthCheck, given, settings
    from support import fuzz_fields

    seen: set[str] = set()

    # What is drawn matters here, not how fast: the first draw builds the strategies and
    # took 1.5 s on a busy CI core, which Hypothesis's too_slow check fails.
    @settings(max_examples=600, database=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
    @given(fuzz_fields.kv_fields)
    def draw(fields: dict) -> None:
        value = fields.get("kv_policy")
        if isinstance(value, str):
            seen.add(value)

    draw()
    assert set(registry.POLICY_NAMES) <= seen and {"auto", "bogus"} <= seen


def _hand_lists(path: Path) -> list[tuple[int, list[str]]]:
    """Literal lists, tuples, sets and dict keys in ``path`` naming three or more policies."""
    names = set(registry.POLICY_NAMES) | set(registry.PILOT_REGISTRY)
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        items = node.elts if isinstance(node, (ast.List, ast.Tuple, ast.Set)) else (
            node.keys if isinstance(node, ast.Dict) else [])
        named = [e.value for e in items if isinstance(e, ast.Constant) and e.value in names]
        if len(named) >= 3:
            found.append((node.lineno, named))
    return found


def test_no_hand_written_list_of_policies_outside_the_registry() -> None:
    offenders = []
    for folder in SCANNED:
        for path in sorted((ROOT / folder).rglob("*.py")):
            if path.name == "registry.py" or "bundled" in path.parts and path.name.startswith("train"):
                continue
            offenders += [f"{path.relative_to(ROOT)}:{line}: {named}" for line, named in _hand_lists(path)]
    assert not offenders, "derive these from vase_sglang.registry:\n" + "\n".join(offenders)


def test_the_scan_finds_a_hand_written_list(tmp_path: Path) -> None:
    code = tmp_path / "x.py"
    code.write_text('P = ("vase", "snapkv", "rkv")\nPAIR = ["none", "vase"]\nD = {"h2o": 1, "tova": 2, "gkv": 3}\n')
    assert [line for line, _ in _hand_lists(code)] == [1, 3]


@pytest.mark.parametrize("doc", ["README.md", "docs/algorithm.md"])
def test_the_docs_policy_tables_list_every_policy(doc: str) -> None:
    text = (ROOT / doc).read_text()
    rows = set(re.findall(r"^\| `([a-z0-9-]+)` \|", text, flags=re.MULTILINE))
    assert set(registry.POLICY_NAMES) <= rows, f"{doc} lacks {sorted(set(registry.POLICY_NAMES) - rows)}"
