"""The course as a test suite on a cluster (configs/slurm/course.sbatch + helpers.course), on the real SLURM lab.

One short chapter only (chapter 00), so that the path is real without running the course twice; the
whole course on an allocation is ``make course-sbatch``.  Also: helpers.slurm's submit/wait/queue on
the lab.  Skipped with the reason printed when the lab or slurm-wlm/munge are missing.
"""

from __future__ import annotations

import json
import shutil
import sys

import pytest

from helpers import course, netlab, slurm
from helpers import slurm_cases as sc
from helpers.netlab import slurmlab

LAB_OK, LAB_WHY = netlab.lab_available()
SLURM_OK, SLURM_WHY = slurmlab.slurm_available()
pytestmark = [pytest.mark.skipif(not LAB_OK, reason=f"network lab unavailable: {LAB_WHY}"),
              pytest.mark.skipif(not SLURM_OK, reason=f"SLURM lab unavailable: {SLURM_WHY}")]
if not (LAB_OK and SLURM_OK):
    print(f"tests/lab/test_slurm_course.py skipped: {LAB_WHY if not LAB_OK else SLURM_WHY}", file=sys.stderr)
LAB_NAME = "ch"


@pytest.fixture(scope="module")
def lab():
    netlab.down(LAB_NAME)
    with netlab.Lab(2, name=LAB_NAME, slurm=True) as cluster:
        yield cluster
    assert not netlab.Lab(2, name=LAB_NAME, slurm=True).leftovers()


def test_submit_wait_and_a_failing_job(lab):
    work = sc.ROOT / "build" / "test-slurm-jobs"
    shutil.rmtree(work, ignore_errors=True)
    ok = slurm.submit(lab, f"#!/bin/bash\n#SBATCH --nodes=2\n#SBATCH --output={work}/%x_%j.out\nsrun hostname\n", work, name="ok")
    bad = slurm.submit(lab, f"#!/bin/bash\n#SBATCH --output={work}/%x_%j.out\necho nope; exit 3\n", work, name="bad",
                       sbatch_args=["--job-name=bad"])  # else the job is named after the file: bad.sbatch_<id>.out
    states = slurm.wait_jobs(lab, [ok, bad], timeout_s=60)
    assert states[ok].state == "COMPLETED" and states[ok].exit_code == "0:0" and states[ok].ended
    assert sorted(states[ok].out().split()) == ["node0", "node1"]
    assert states[bad].state == "FAILED" and states[bad].exit_status == 3 and states[bad].reason == "NonZeroExitCode"
    assert states[bad].out().strip() == "nope" and states[bad].files() == {str(work / f"bad_{bad}.out"): True}
    with pytest.raises(RuntimeError, match="sbatch .* refused"):
        slurm.submit(lab, "#!/bin/bash\n#SBATCH --partition=nosuch\nhostname\n", work, name="nosuch")
    with pytest.raises(ValueError, match="name="):
        slurm.submit(lab, "#!/bin/bash\n", work, name="a b")
    shutil.rmtree(work, ignore_errors=True)


def test_course_sbatch_runs_one_chapter_on_the_allocation(lab):
    text = course.lab_sbatch((sc.ROOT / "configs" / "slurm" / "course.sbatch").read_text())
    work = sc.ROOT / "build" / "course"
    work.mkdir(parents=True, exist_ok=True)
    # chapter 00 without its single-node smoke tests and with a short sweep: the path through sbatch, srun and
    # papermill is what this test is for; the full check runs in tests/notebooks/test_00_allocation_check.py
    env = {**sc.job_env(work), "COURSE_CHAPTERS": "00",
           "COURSE_ARGS": "-p 00:RUN_SMOKE= -p 00:MULTI_STEPS=nodes,job -p 00:MAX_BYTES=4194304"}
    job = slurm.submit(lab, text, sc.ROOT / "build" / "test-course", name="course", env=env, cwd=sc.ROOT)
    state = slurm.wait_job(lab, job, timeout_s=420, poll_s=2)
    out_dir = work / job
    try:
        assert state.state == "COMPLETED", f"{state.summary()}\n{state.out()[-2000:]}\n{state.err()[-3000:]}"
        assert f"course job {job} on 2 node(s): node[0-1]" in state.out()
        summary = json.loads((out_dir / "summary.json").read_text())
        assert [(c["chapter"], c["status"]) for c in summary] == [("00_allocation_check.ipynb", "passed")]
        assert summary[0]["tiers"]["cpu"]["ran"] > 0 and "1/1 chapters passed" in (out_dir / "summary.md").read_text()
        assert "not compared: run with parameters" in summary[0]["outputs"] and "'RUN_SMOKE': ''" in summary[0]["outputs"]
    finally:
        shutil.rmtree(out_dir, ignore_errors=True)
        for p in (work / f"course_{job}.out", work / f"course_{job}.err"):
            p.unlink(missing_ok=True)
        shutil.rmtree(sc.ROOT / "build" / "test-course", ignore_errors=True)


def test_course_selection_and_parameters():
    assert [p.name for p in course.chapters("08")] == ["08_slurm.ipynb"]
    assert course.chapters(None)[0].name.startswith("00_")
    with pytest.raises(ValueError, match="matches no notebook"):
        course.chapters("99")
    assert course._parameter("08:JOB_TIMEOUT_S=120") == ("08", "JOB_TIMEOUT_S", 120)
    with pytest.raises(ValueError, match="CHAPTER:NAME=VALUE"):
        course._parameter("JOB_TIMEOUT_S=1")
