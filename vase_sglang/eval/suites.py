"""Problem suites: the generated chain task, and real benchmarks from local JSONL files.

A suite is a list of ``Problem``: an id, the user message, the gold answer as text, and a
grader. The chain task is graded exactly (``vase_sglang.bundled.tasks.chain.grade``). AIME,
MATH-500 and GSM8K are graded with HF ``math-verify`` on the text after ``</think>``
(the whole output when the model never closed it), the usual practice for Qwen3.

JSONL formats (one object per line; the first field found is used):

* ``aime``: ``problem`` or ``question``, and ``answer`` (an integer);
* ``math500``: ``problem``, and ``answer`` (LaTeX, as in HuggingFaceH4/MATH-500);
* ``gsm8k``: ``question``, and ``answer`` ending in ``#### <number>`` (as in openai/gsm8k).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from vase_sglang.bundled.tasks.chain import HELD_OUT_SEED, ChainTask
from vase_sglang.bundled.tasks.chain import grade as grade_chain
from vase_sglang.cli import JSONLineError, json_lines

MATH_SUFFIX = "\nPlease reason step by step, and put your final answer within \\boxed{}."
BENCHMARKS = ("aime", "math500", "gsm8k")
SUITES = ("chain",) + BENCHMARKS


class SuiteError(Exception):
    """A dataset that cannot be read (one line for the user)."""


@dataclass(frozen=True)
class Problem:
    id: str
    prompt: str
    answer: str
    grader: Callable[[str, str], bool]

    def grade(self, output: str) -> bool:
        return self.grader(output, self.answer)


def _grade_chain(output: str, answer: str) -> bool:
    return grade_chain(output, int(answer))


def chain_suite(n: int, steps: int = 125, lookback: int = 24, first_seed: int = HELD_OUT_SEED) -> list[Problem]:
    """Held-out problems of the task the bundled model was trained on (its default graph)."""
    task = ChainTask(steps=steps, lookback=lookback)
    problems = []
    for i in range(n):
        p = task.generate(first_seed + i)
        problems.append(Problem(f"chain-{first_seed + i}", p.prompt, str(p.answer), _grade_chain))
    return problems


def final_part(output: str) -> str:
    """What a reasoning model answered: the text after its last ``</think>``, if any."""
    return output.rsplit("</think>", 1)[-1]


def grade_math(output: str, answer: str) -> bool:
    """math-verify equivalence of the gold answer and the model's final answer."""
    from math_verify import parse, verify

    gold = parse(answer if "$" in answer or "\\boxed" in answer else f"${answer}$")
    pred = parse(final_part(output))
    return bool(gold) and bool(pred) and bool(verify(gold, pred))


def _field(row: dict, names: tuple[str, ...], path: Path, line: int) -> str:
    for name in names:
        if name in row and row[name] not in (None, ""):
            return str(row[name])
    raise SuiteError(f"{path}:{line}: no {' or '.join(repr(n) for n in names)} field")


def _gsm8k_answer(text: str, path: Path, line: int) -> str:
    if "####" not in text:
        raise SuiteError(f"{path}:{line}: GSM8K answer has no '#### <number>' part")
    return text.rsplit("####", 1)[1].strip().replace(",", "")


def load_benchmark(kind: str, path: Path, limit: int | None = None) -> list[Problem]:
    if kind not in BENCHMARKS:
        raise SuiteError(f"unknown benchmark {kind!r}; choose one of {', '.join(BENCHMARKS)}")
    try:
        import math_verify  # noqa: F401
    except ImportError:
        raise SuiteError("grading real benchmarks needs math-verify: pip install 'vase-sglang[eval]'") from None
    if not path.is_file():
        raise SuiteError(f"dataset file not found: {path}")
    problems = []
    with path.open() as f:
        try:
            for line_no, row in json_lines(f):
                if not isinstance(row, dict):
                    raise SuiteError(f"{path}:{line_no}: expected a JSON object")
                question = _field(row, ("problem", "question"), path, line_no)
                raw = _field(row, ("answer",), path, line_no)
                answer = _gsm8k_answer(raw, path, line_no) if kind == "gsm8k" else raw
                pid = str(row.get("id", row.get("unique_id", f"{kind}-{line_no}")))
                problems.append(Problem(pid, question + MATH_SUFFIX, answer, grade_math))
                if limit is not None and len(problems) >= limit:
                    break
        except JSONLineError as e:
            raise SuiteError(f"{path}:{e.line}: not JSON ({e.msg})") from None
    if not problems:
        raise SuiteError(f"dataset file has no problems: {path}")
    return problems
