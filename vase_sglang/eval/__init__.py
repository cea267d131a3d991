"""The accuracy harness: ``python -m vase_sglang.eval`` (see ``__main__`` for the options).

``suites`` builds the problems (the generated chain task; AIME/MATH-500/GSM8K JSONL),
``runner`` sends them to a server arm by arm, ``signatures`` flags loops and unclosed
thinking, ``report`` summarizes, tabulates and plots.
"""
