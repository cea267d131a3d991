"""The generated chain task: deterministic, exact, and dependent on far-back steps."""

from __future__ import annotations

import pytest

from vase_sglang.tasks import ChainTask, grade


def test_same_seed_same_problem_and_answers_are_exact() -> None:
    task = ChainTask(steps=60, lookback=30)
    a, b = task.generate(3), task.generate(3)
    assert a == b and task.generate(4) != a
    assert task.solve(a) == a.answer
    assert grade(a.completion, a.answer)
    assert not grade(a.completion.replace(f"answer: {a.answer}", f"answer: {(a.answer + 1) % 100}"), a.answer)
    assert not grade("<think>answer: 5</think> no answer", 5)


def test_every_late_step_reads_a_result_at_least_lookback_back() -> None:
    task = ChainTask(steps=100, lookback=40, n_vars=4)
    problem = task.generate(11)
    for i, far, near, _ in problem.steps:
        assert near == i - 1
        if i - 40 >= 0:
            assert i - far >= 40


def test_chain_text_states_each_step() -> None:
    problem = ChainTask(steps=5, lookback=2).generate(0)
    assert problem.chain.count("=") == 3 * 5 and problem.chain.startswith("s4=")
    assert problem.prompt.startswith("x0=") and problem.prompt.endswith("Compute the chain.")


def test_forgetting_old_steps_breaks_most_answers() -> None:
    task = ChainTask(steps=80, lookback=40)
    wrong = sum(task.solve(p, forget_before=30) != p.answer for p in map(task.generate, range(200)))
    assert wrong >= 150, f"only {wrong}/200 answers depend on steps older than 30"


@pytest.mark.parametrize("kwargs", [{"n_vars": 1}, {"steps": 0}, {"lookback": 0}, {"modulus": 1}])
def test_bad_knobs_are_rejected(kwargs: dict) -> None:
    with pytest.raises(ValueError, match="invalid"):
        ChainTask(**kwargs)
