"""The generated chain task: deterministic, exact, and dependent on far-back steps."""

from __future__ import annotations

import pytest

from vase_sglang.bundled.tasks import ChainTask, grade
from vase_sglang.bundled.tasks.chain import TOKENS_PER_STEP, extract_answer


def test_same_seed_same_problem_and_answers_are_exact() -> None:
    task = ChainTask(steps=60, lookback=30)
    a, b = task.generate(3), task.generate(3)
    assert a == b and task.generate(4) != a
    assert task.solve(a) == a.answer
    assert grade(a.completion, a.answer)
    assert not grade(a.completion.replace(f"answer {a.answer}", f"answer {(a.answer + 1) % 10}"), a.answer)
    assert not grade("<think> answer 5 </think> no answer", 5)
    assert not grade("<think> never closed answer 5", 5) and extract_answer("no think answer 5") is None


def test_every_late_step_reads_a_result_at_least_lookback_back() -> None:
    task = ChainTask(steps=100, lookback=40, n_vars=4)
    problem = task.generate(11)
    for i, far, near in problem.steps:
        assert near == i - 1
        if i - 40 >= 0:
            assert i - far >= 40


def test_chain_text_states_each_step_in_eight_words() -> None:
    task = ChainTask(steps=5, lookback=2)
    problem = task.generate(0)
    words = problem.chain.split()
    assert len(words) == 5 * TOKENS_PER_STEP == task.chain_tokens
    assert words[0] == "S8" and words[3] == "T8" and words[6] == "R8"
    assert problem.prompt.startswith("vars R0 ") and problem.prompt.endswith(" solve")
    # every value written after a name is that name's value
    values = list(problem.initial)
    for _, far, near in problem.steps:
        values.append((values[near] + values[far]) % 10)
    for name, value in zip(words[1:], words[2:], strict=False):
        if name.startswith("R") and value.isdigit():
            assert values[int(name[1:])] == int(value)


def test_default_chains_are_long() -> None:
    # >= 1,000 tokens, and >= 4x the 128-token budget the smoke test and serve.sh use.
    assert len(ChainTask().generate(0).completion.split()) >= 1000


def test_forgetting_old_steps_breaks_most_answers() -> None:
    task = ChainTask(steps=80, lookback=40)
    wrong = sum(task.solve(p, forget_before=30) != p.answer for p in map(task.generate, range(200)))
    assert wrong >= 150, f"only {wrong}/200 answers depend on steps older than 30"


@pytest.mark.parametrize("kwargs", [{"n_vars": 1}, {"steps": 0}, {"lookback": 0}, {"modulus": 1},
                                    {"modulus": 11}, {"steps": 157}])
def test_bad_knobs_are_rejected(kwargs: dict) -> None:
    with pytest.raises(ValueError, match="invalid"):
        ChainTask(**kwargs)


def test_one_graph_per_task_unless_asked_for_one_per_problem() -> None:
    task = ChainTask(steps=40)
    a, b = task.generate(1), task.generate(2)
    assert a.steps == b.steps and a.initial != b.initial  # same graph, other values
    assert "steps" not in a.prompt
    assert ChainTask(steps=40, graph_seed=1).generate(1).steps != a.steps
    free = ChainTask(steps=40, graph_seed=None)
    x, y = free.generate(1), free.generate(2)
    assert x.steps != y.steps and x.prompt.split(" steps ")[1].startswith(f"S8 R7 T8 R{x.steps[0][1]}")
    # a longer chain of the same task starts with the shorter one
    assert ChainTask(steps=80).generate(1).chain.startswith(a.chain)


def test_completion_tokens_counts_the_whole_answer() -> None:
    task = ChainTask(steps=30)
    assert len(task.generate(0).completion.split()) == task.completion_tokens
