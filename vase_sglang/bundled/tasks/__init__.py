"""Generated reasoning tasks with exact answers : the chain task the bundled model is trained on."""

from .chain import ChainProblem, ChainTask, grade

__all__ = ["ChainProblem", "ChainTask", "grade"]
