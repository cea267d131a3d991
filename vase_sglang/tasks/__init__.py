"""Generated reasoning tasks with exact answers (issue 4 groundwork)."""

from .chain import ChainProblem, ChainTask, grade

__all__ = ["ChainProblem", "ChainTask", "grade"]
