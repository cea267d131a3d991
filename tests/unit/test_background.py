"""The background-job queue of the test run (``support.background``): one job at a time,
longest first, each test waiting only for its own."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from support.background import DECLARED, NICENESS, Job, Jobs


def _declare(monkeypatch: pytest.MonkeyPatch, jobs: dict[str, Job]) -> list[pytest.Item]:
    for name, job in jobs.items():
        monkeypatch.setitem(DECLARED, name, lambda folder, job=job: job)

    class Item:
        fixturenames = list(jobs)

    return [Item()]  # type: ignore[list-item]


def _python(code: str, expected_s: float, timeout: float = 60) -> Job:
    return Job([sys.executable, "-c", code], timeout=timeout, expected_s=expected_s)


def test_jobs_run_one_at_a_time_longest_first(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    jobs = Jobs()
    items = _declare(monkeypatch, {
        "short": _python("print('short')", expected_s=1),
        "long": _python("import time; time.sleep(0.5); print('long')", expected_s=9),
    })
    jobs.start(items, lambda name: (tmp_path / name).mkdir() or tmp_path / name)
    assert list(jobs.running) == ["long"] and [name for name, _, _ in jobs.queue] == ["short"]
    jobs.advance()
    assert "short" not in jobs.running  # the long one is still running
    short = jobs.result("short")  # waits for the long one, then runs the short one
    assert (short.returncode, short.stdout) == (0, "short\n")
    assert jobs.running["long"].result is not None and jobs.running["long"].result.stdout == "long\n"
    assert short.folder == tmp_path / "short"


def test_a_job_past_its_time_limit_is_killed_and_the_next_starts(monkeypatch: pytest.MonkeyPatch,
                                                                 tmp_path: Path) -> None:
    jobs = Jobs()
    items = _declare(monkeypatch, {"hangs": _python("import time; time.sleep(60)", expected_s=9, timeout=0.3),
                                   "after": _python("print('after')", expected_s=1)})
    jobs.start(items, lambda name: (tmp_path / name).mkdir() or tmp_path / name)
    hung = jobs.result("hangs")
    assert hung.returncode != 0 and "[killed after 0 s]" in hung.stderr
    assert jobs.result("after").stdout == "after\n"
    with pytest.raises(KeyError, match="was not started"):
        jobs.result("never-declared")
    jobs.kill_all()


@pytest.mark.skipif(not Path("/proc/self/autogroup").exists(), reason="the kernel has no autogroups")
def test_a_job_and_the_sessions_it_starts_run_at_the_lowest_priority(monkeypatch: pytest.MonkeyPatch,
                                                                      tmp_path: Path) -> None:
    """With autogroups each session is a scheduling group of its own: a job's nice must be its
    group's, and a server it starts in a new session (``keep_priority``) must keep it."""
    code = ("import subprocess, sys\n"
            "from vase_sglang.server_process import keep_priority\n"
            "print(open('/proc/self/autogroup').read().split()[-1])\n"
            "subprocess.run([sys.executable, '-c', \"print(open('/proc/self/autogroup').read().split()[-1])\"],"
            " start_new_session=True, preexec_fn=keep_priority(), check=True)\n")
    jobs = Jobs()
    jobs.start(_declare(monkeypatch, {"nice": _python(code, expected_s=1)}),
               lambda name: (tmp_path / name).mkdir() or tmp_path / name)
    done = jobs.result("nice")
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == [str(NICENESS), str(NICENESS)]
