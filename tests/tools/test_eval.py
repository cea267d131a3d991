"""The eval CLI without a server: options, one-line errors, loaders, graders, signatures, report."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from vase_sglang.bundled.tasks.chain import ChainTask
from vase_sglang.eval.__main__ import PROG, build_parser
from vase_sglang.eval.report import markdown_table, summarize, write_plot
from vase_sglang.eval.runner import Arm, Sample, custom_params
from vase_sglang.eval.signatures import has_loop, unclosed_think
from vase_sglang.eval.suites import SuiteError, chain_suite, grade_math, load_benchmark


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "vase_sglang.eval", *args], capture_output=True, text=True,
                          timeout=120, cwd="/")


def test_help_documents_every_option() -> None:
    out = _cli("--help")
    assert out.returncode == 0
    for action in build_parser()._actions:
        for flag in action.option_strings:
            assert flag in out.stdout
        assert action.help, f"{action.option_strings} has no help"


@pytest.mark.parametrize("args, needle", [
    (["--policies", "vase,nope"], "unknown policy 'nope'"),
    (["--suite", "gsm8k", "--data", "/no/such/file.jsonl", "--server", "http://127.0.0.1:9"],
     "dataset file not found: /no/such/file.jsonl"),
    (["--server", "http://127.0.0.1:9", "--problems", "1"], "cannot reach the server at http://127.0.0.1:9"),
    (["--budgets", "100"], "not a multiple of --recent"),
    (["--suite", "aime"], "needs --data"),
])
def test_bad_input_gives_one_error_line_and_nonzero_exit(args: list[str], needle: str) -> None:
    out = _cli(*args)
    assert out.returncode != 0
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"{PROG}: error:") and needle in lines[0], out.stderr


def test_loop_detector_follows_the_paper_definition() -> None:
    assert has_loop("some reasoning. " + "Wait, let me check. " * 5)
    assert not has_loop("some reasoning. " + "Wait, let me check. " * 4)
    assert not has_loop("Wait, let me check. " * 5 + " ".join(map(str, range(200))))  # only the last 500 count
    # correct chains of the bundled task are not loops
    assert not any(has_loop(ChainTask().generate(i).completion) for i in range(30))
    assert unclosed_think("<think> S4 R3 1") and not unclosed_think("<think> a </think> answer 1")


def _jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_benchmark_loaders_and_math_grader(tmp_path: Path) -> None:
    aime = load_benchmark("aime", _jsonl(tmp_path / "a.jsonl", [{"problem": "1+1?", "answer": 2, "id": "x"}]))
    assert aime[0].id == "x" and aime[0].answer == "2" and "\\boxed{}" in aime[0].prompt
    assert aime[0].grade("<think>hmm \\boxed{3}</think> so \\boxed{2}")
    assert not aime[0].grade("<think>\\boxed{2}</think> \\boxed{3}")  # only the final part counts
    math = load_benchmark("math500", _jsonl(tmp_path / "m.jsonl", [{"problem": "half?", "answer": "\\frac{1}{2}",
                                                                     "unique_id": "test/1"}]))
    assert math[0].grade("</think> The answer is \\boxed{0.5}.") and not math[0].grade("\\boxed{1/3}")
    gsm = load_benchmark("gsm8k", _jsonl(tmp_path / "g.jsonl", [{"question": "q", "answer": "so 1,200\n#### 1,200"}]),
                         limit=1)
    assert gsm[0].answer == "1200" and gsm[0].grade("</think> \\boxed{1200}")
    assert grade_math("</think> \\boxed{72}", "72") and not grade_math("</think> no answer", "72")
    with pytest.raises(SuiteError, match="no 'answer' field"):
        load_benchmark("aime", _jsonl(tmp_path / "bad.jsonl", [{"problem": "p"}]))
    with pytest.raises(SuiteError, match="#### <number>"):
        load_benchmark("gsm8k", _jsonl(tmp_path / "bad2.jsonl", [{"question": "q", "answer": "12"}]))
    (tmp_path / "notjson.jsonl").write_text("{oops\n")
    with pytest.raises(SuiteError, match="not JSON"):
        load_benchmark("math500", tmp_path / "notjson.jsonl")


def test_chain_suite_is_held_out_and_graded_exactly() -> None:
    problems = chain_suite(3, steps=20)
    task = ChainTask(steps=20)
    truth = task.generate(int(problems[0].id.split("-")[1]))
    assert problems[0].prompt == truth.prompt and problems[0].grade(truth.completion)
    assert not problems[0].grade(truth.completion[:-1] + str((truth.answer + 1) % 10))


def test_custom_params_per_arm() -> None:
    assert custom_params(Arm("none", None), 3) == {"kv_policy": "none"}
    assert custom_params(Arm("vase", 256), 3) == {"kv_policy": "vase", "kv_budget": 256, "kv_seed": 3}


def _sample(pid: str, seed: int, correct: bool, text: str = "<think> x </think> answer 1",
            served_loop: bool | None = None, signal: float | None = None) -> Sample:
    return Sample(pid, seed, correct, 100 + seed, has_loop(text), unclosed_think(text), "stop", text, served_loop,
                  signal)


def test_summary_table_and_plot(tmp_path: Path) -> None:
    full = summarize(Arm("none", None), [_sample("a", 0, True), _sample("b", 0, True)])
    vase = summarize(Arm("vase", 256), [_sample("a", 0, True), _sample("b", 0, False), _sample("a", 1, True),
                                        _sample("b", 1, True, "<think> loop " + "Wait, check. " * 6)])
    assert full["pass@1"] == 1.0 and vase["pass@1"] == 0.75
    assert vase["pass@1_by_seed"] == {"0": 0.5, "1": 1.0} and vase["pass@1_std_over_seeds"] == 0.25
    assert vase["loop_share"] == 0.25 and vase["unclosed_share"] == 0.25 and vase["mean_tokens"] == 100.5
    assert vase["served_loop_share"] is None and vase["evicted_attention_mean"] is None  # no server telemetry
    served = summarize(Arm("vase", 256), [_sample("a", 0, True, served_loop=False, signal=0.1),
                                          _sample("b", 0, True, "Wait, check. " * 6, served_loop=False, signal=0.3)])
    assert served["served_loop_share"] == 0.0 and served["loop_agreement"] == 0.5
    assert served["evicted_attention_mean"] == pytest.approx(0.2)
    assert "loop 50.0 / served 0.0" in markdown_table([served], None)
    table = markdown_table([full, vase], full_tokens=1024)
    assert "B=256, 4.0x" in table and "| none | 100.0 ± 0.0" in table and "| vase | 75.0 ± 25.0" in table
    assert write_plot([full, vase], tmp_path / "p.png", "t") is None and (tmp_path / "p.png").stat().st_size > 1000
