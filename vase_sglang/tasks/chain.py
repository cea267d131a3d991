"""A procedural task whose chain of thought must look far back at its own earlier steps.

The prompt defines a few variables. Each step of the chain computes a new value from two
earlier results: one recent, one at least ``lookback`` steps back (hundreds of tokens
earlier in the chain), so a solver that has forgotten an old step gets the answer wrong.
The answer is the last value. Everything is seeded and exact::

    prompt:  "x0=41 x1=7 x2=93 x3=18. Compute the chain."
    chain:   "s4=x1+x3=7+18=25. s5=s4*x0=25*41=25. ..."   (mod 100)
    answer:  "answer: 58"

Difficulty knobs: ``steps`` (chain length), ``lookback`` (minimum distance of the far
operand), ``n_vars`` and ``modulus`` (how many distinct values and digits appear).
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass, field

OPS = ("+", "-", "*")
ANSWER_RE = re.compile(r"answer:\s*(-?\d+)")


@dataclass(frozen=True)
class ChainProblem:
    prompt: str
    chain: str
    answer: int
    # (index, far operand, near operand, op) per step: lets tests and analyses recompute.
    steps: tuple[tuple[int, int, int, str], ...] = field(repr=False)
    initial: tuple[int, ...] = field(repr=False)

    @property
    def completion(self) -> str:
        return f"<think>{self.chain}</think> answer: {self.answer}"


def _name(i: int, n_vars: int) -> str:
    return f"x{i}" if i < n_vars else f"s{i}"


def _apply(op: str, a: int, b: int, modulus: int) -> int:
    if op == "+":
        return (a + b) % modulus
    if op == "-":
        return (a - b) % modulus
    return (a * b) % modulus


@dataclass(frozen=True)
class ChainTask:
    steps: int = 80
    lookback: int = 40
    n_vars: int = 4
    modulus: int = 100

    def __post_init__(self) -> None:
        if self.n_vars < 2:
            raise ValueError(f"invalid n_vars={self.n_vars}: must be >= 2")
        if self.steps < 1:
            raise ValueError(f"invalid steps={self.steps}: must be >= 1")
        if not 1 <= self.lookback:
            raise ValueError(f"invalid lookback={self.lookback}: must be >= 1")
        if self.modulus < 2:
            raise ValueError(f"invalid modulus={self.modulus}: must be >= 2")

    def generate(self, seed: int) -> ChainProblem:
        rng = random.Random(seed)
        values = [rng.randrange(self.modulus) for _ in range(self.n_vars)]
        prompt = " ".join(f"x{i}={v}" for i, v in enumerate(values)) + ". Compute the chain."
        parts, steps = [], []
        for k in range(self.steps):
            i = self.n_vars + k
            near = i - 1
            # The far operand is at least `lookback` results back when the chain is long
            # enough; early on it is any earlier result.
            far_hi = i - self.lookback
            far = rng.randrange(0, far_hi + 1) if far_hi >= 0 else rng.randrange(0, i)
            op = rng.choice(OPS)
            value = _apply(op, values[far], values[near], self.modulus)
            values.append(value)
            steps.append((i, far, near, op))
            a, b = _name(far, self.n_vars), _name(near, self.n_vars)
            parts.append(f"{_name(i, self.n_vars)}={a}{op}{b}={values[far]}{op}{values[near]}={value}.")
        return ChainProblem(prompt=prompt, chain=" ".join(parts), answer=values[-1], steps=tuple(steps),
                            initial=tuple(values[: self.n_vars]))

    def solve(self, problem: ChainProblem, forget_before: int | None = None) -> int:
        """Recompute the answer; with ``forget_before``, results older than that many steps
        read as 0 (a solver whose cache lost them)."""
        values = list(problem.initial)
        for i, far, near, op in problem.steps:
            a = values[far] if forget_before is None or i - far <= forget_before else 0
            values.append(_apply(op, a, values[near], self.modulus))
        return values[-1]


def grade(text: str, answer: int) -> bool:
    """True when the last ``answer: N`` in ``text`` is the right one."""
    found = ANSWER_RE.findall(text.split("</think>")[-1])
    return bool(found) and int(found[-1]) == answer
