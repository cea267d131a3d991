"""Slow checks that are one self-contained command each, run in the background of a test run.

A few tests only run a long command and read what it printed (the GPU kit's CPU rehearsal,
the kernel tests under another Triton, the offline compile check). They need no server of
the run and none of its state, so ``background_job`` declares the command once, and the
run starts the declared jobs when collection ends, one at a time, longest first (``Jobs``),
at a lower CPU priority (``nice``), while the server tests run in front: those leave about
a quarter of CI's two cores idle (waiting on start-ups and requests), which the job takes.
One at a time, because jobs side by side on two cores starve each other's own time limits.
The next job starts as the test run passes between tests (``Jobs.advance``, called from
``tests/conftest.py``). A job's test only waits for its result; until then the job runs
beside whatever tests come, taking only the CPU they leave.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from vase_sglang.server_process import set_autogroup_nice

NICENESS = 19  # below the server tests: the job takes the cores they leave idle


def _lower_priority() -> None:
    """Runs in the job's child: nice, and so is its session's scheduling group (with Linux
    autogroups, a nice process in a session of its own would otherwise get the same share of
    the cores as each server test's session); the servers it starts keep it (``keep_priority``)."""
    os.nice(NICENESS)
    set_autogroup_nice(NICENESS)


@dataclass(frozen=True)
class Job:
    argv: list[str]
    env: dict[str, str] | None = None
    timeout: float = 1800.0
    expected_s: float = 60.0  # about how long it runs alone: the longest start first


@dataclass(frozen=True)
class Finished:
    """A job's end: its exit status, what it printed, and its folder (with what it wrote)."""

    argv: list[str]
    returncode: int
    stdout: str
    stderr: str
    folder: Path


# Fixture name -> the function that gives its job from a fresh folder.
DECLARED: dict[str, Callable[[Path], Job]] = {}


class Running:
    """One started job: its process, its output files, its deadline."""

    def __init__(self, name: str, job: Job, folder: Path):
        self.name, self.job, self.folder = name, job, folder
        self.stdout, self.stderr = folder / "stdout.txt", folder / "stderr.txt"
        with self.stdout.open("w") as out, self.stderr.open("w") as err:
            self.proc = subprocess.Popen(job.argv, env=job.env, cwd=folder, stdout=out, stderr=err, text=True,
                                         start_new_session=True, preexec_fn=_lower_priority)
        self.deadline = time.monotonic() + job.timeout
        self.result: Finished | None = None

    def wait(self) -> Finished:
        if self.result is None:
            try:
                returncode = self.proc.wait(timeout=max(1.0, self.deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                self.kill()
                returncode = self.proc.wait()
                self.stderr.write_text(self.stderr.read_text() + f"\n[killed after {self.job.timeout:.0f} s]\n")
            self.result = Finished(self.job.argv, returncode, self.stdout.read_text(), self.stderr.read_text(),
                                   self.folder)
        return self.result

    def kill(self) -> None:
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)  # the job and whatever it started
            except ProcessLookupError:
                pass


class Jobs:
    """The jobs of one run, in a queue: one runs at a time; a test waits only for its own."""

    def __init__(self) -> None:
        self.queue: list[tuple[str, Job, Path]] = []
        self.running: dict[str, Running] = {}

    def start(self, items: list[pytest.Item], folder: Callable[[str], Path]) -> None:
        used = {name for item in items for name in getattr(item, "fixturenames", ()) if name in DECLARED}
        for name in sorted(used):
            where = folder(name)
            self.queue.append((name, DECLARED[name](where), where))
        self.queue.sort(key=lambda entry: -entry[1].expected_s)
        self.advance()

    def advance(self) -> None:
        """Starts the next job when none is running (cheap: called between tests); stops one
        that ran past its time limit."""
        for started in self.running.values():
            if started.proc.poll() is None and time.monotonic() > started.deadline:
                started.wait()
        if self.queue and all(r.proc.poll() is not None for r in self.running.values()):
            name, job, where = self.queue.pop(0)
            self.running[name] = Running(name, job, where)

    def result(self, name: str) -> Finished:
        if name not in self.running and name not in (queued for queued, _, _ in self.queue):
            raise KeyError(f"background job {name} was not started for this run")
        while name not in self.running:  # the jobs queued before it run first
            for started in self.running.values():
                started.wait()
            self.advance()
        return self.running[name].wait()

    def kill_all(self) -> None:
        self.queue.clear()
        for job in self.running.values():
            job.kill()


JOBS = Jobs()


def background_job(job: Callable[[Path], Job]) -> Any:
    """Declares a session fixture, named after ``job``, whose value is the ``Finished``
    ``job(folder)``, started in the background when the
    run's collection ends (``folder`` is the job's own, which it may write in)."""
    name = job.__name__
    if name in DECLARED:
        raise ValueError(f"two background jobs named {name}")
    DECLARED[name] = job

    def fixture() -> Finished:
        return JOBS.result(name)

    fixture.__doc__ = job.__doc__
    return pytest.fixture(scope="session", name=name)(fixture)
