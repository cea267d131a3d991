"""A procedural task whose chain of thought must look far back at its own earlier steps.

The prompt defines a few variables; the chain of thought computes one new value per step.
Step ``i`` adds the previous result and one chosen at random at least ``lookback`` steps
back (hundreds of tokens earlier in the chain), modulo ``modulus``. The answer is the
last value, so it depends on every step: a solver that has forgotten one old result
gets it wrong. Everything is seeded and exact. The text is made of whole words, one
token each in the bundled model's vocabulary (``vase_sglang.bundled.model``)::

    prompt:  "vars R0 3 R1 7 R2 0 R3 5 R4 1 R5 8 R6 6 R7 2 solve"
    chain:   "S8 R7 2 T8 R1 7 R8 9 S9 R8 9 T9 R0 3 R9 2 ..."
    answer:  "answer 5"

Each step is 8 tokens: ``S<i>`` starts step i, then the near operand's name and value,
``T<i>`` and the far operand's name and value, then ``R<i>`` and the new value. The
values sit right after their names, so reading an old result is a lookup of an old token.

Which earlier result step i reads (its *dependency graph*) comes from ``graph_seed``: the
same for every problem of a task, so a model learns the graph and each problem differs
only in its initial values (10**n_vars of them), and the chain must carry every value.
With ``graph_seed=None`` every problem draws its own graph and the prompt lists it
(``steps S8 R7 T8 R1 ...``): harder, as the model must also copy its program from the
prompt (a small model trained for an hour on CPU does not learn that copy; see docs/accuracy.md).

Difficulty knobs: ``steps`` (chain length, 8 tokens each), ``lookback`` (minimum distance
of the far operand, in steps), ``n_vars`` and ``modulus`` (the vocabulary of values),
``graph_seed``.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass, field

MAX_NAMES = 160  # names R0..R159 (and S, T markers) exist in the model's vocabulary
MAX_MODULUS = 10  # values are the single-token words 0..9
TOKENS_PER_STEP = 8
ANSWER_RE = re.compile(r"answer\s+(\d+)")
# Held-out problems (eval, training checks) use seeds from here on; training seeds are < 2**40.
HELD_OUT_SEED = 10**13


@dataclass(frozen=True)
class ChainProblem:
    prompt: str
    chain: str
    answer: int
    # (index, far operand, near operand) per step: lets tests and analyses recompute.
    steps: tuple[tuple[int, int, int], ...] = field(repr=False)
    initial: tuple[int, ...] = field(repr=False)

    @property
    def completion(self) -> str:
        return f"<think> {self.chain} </think> answer {self.answer}"


@dataclass(frozen=True)
class ChainTask:
    steps: int = 125
    lookback: int = 24
    n_vars: int = 8
    modulus: int = 10
    graph_seed: int | None = 0

    def __post_init__(self) -> None:
        if self.n_vars < 2:
            raise ValueError(f"invalid n_vars={self.n_vars}: must be >= 2")
        if self.steps < 1:
            raise ValueError(f"invalid steps={self.steps}: must be >= 1")
        if self.n_vars + self.steps > MAX_NAMES:
            raise ValueError(f"invalid steps={self.steps}: n_vars + steps must be <= {MAX_NAMES}")
        if not 1 <= self.lookback:
            raise ValueError(f"invalid lookback={self.lookback}: must be >= 1")
        if not 2 <= self.modulus <= MAX_MODULUS:
            raise ValueError(f"invalid modulus={self.modulus}: must be in [2, {MAX_MODULUS}]")

    @property
    def chain_tokens(self) -> int:
        return self.steps * TOKENS_PER_STEP

    @property
    def completion_tokens(self) -> int:
        """The whole answer: ``<think>``, the chain, ``</think> answer N``."""
        return self.chain_tokens + 4

    def far_operand(self, i: int, rng: random.Random) -> int:
        """The result step i reads besides the previous one: at least ``lookback`` back once
        the chain is long enough, any earlier result before that."""
        if self.graph_seed is not None:  # one graph per task: the same draw for every problem
            rng = random.Random(f"vase-chain/{self.graph_seed}/{self.lookback}/{i}")
        far_hi = i - self.lookback
        return rng.randrange(0, far_hi + 1) if far_hi >= 0 else rng.randrange(0, i)

    def generate(self, seed: int) -> ChainProblem:
        rng = random.Random(seed)
        values = [rng.randrange(self.modulus) for _ in range(self.n_vars)]
        program, lines, steps = [], [], []
        for i in range(self.n_vars, self.n_vars + self.steps):
            near = i - 1
            far = self.far_operand(i, rng)
            values.append((values[near] + values[far]) % self.modulus)
            steps.append((i, far, near))
            program.append(f"S{i} R{near} T{i} R{far}")
            lines.append(f"S{i} R{near} {values[near]} T{i} R{far} {values[far]} R{i} {values[i]}")
        head = " ".join(f"R{i} {v}" for i, v in enumerate(values[: self.n_vars]))
        listed = "" if self.graph_seed is not None else f" steps {' '.join(program)}"
        return ChainProblem(prompt=f"vars {head}{listed} solve", chain=" ".join(lines),
                            answer=values[-1], steps=tuple(steps), initial=tuple(values[: self.n_vars]))

    def solve(self, problem: ChainProblem, forget_before: int | None = None) -> int:
        """Recompute the answer; with ``forget_before``, results older than that many steps
        read as 0 (a solver whose cache lost them)."""
        values = list(problem.initial)
        for i, far, near in problem.steps:
            a = values[far] if forget_before is None or i - far <= forget_before else 0
            values.append((values[near] + a) % self.modulus)
        return values[-1]


def extract_answer(text: str) -> str | None:
    """The last ``answer N`` after the last ``</think>``; None when there is none."""
    if "</think>" not in text:
        return None
    found = ANSWER_RE.findall(text.split("</think>")[-1])
    return found[-1] if found else None


def grade(text: str, answer: int) -> bool:
    """True when the last ``answer N`` after ``</think>`` is the right one."""
    found = extract_answer(text)
    return found is not None and int(found) == answer
