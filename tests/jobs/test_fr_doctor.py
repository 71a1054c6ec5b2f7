"""The hang doctor on torch's Flight Recorder, on real hung jobs (gloo, CPU; no collective_trace in the scripts)."""

from __future__ import annotations

import subprocess
import sys

from support import ROOT, SCENARIOS

from helpers import doctor, jobs
from helpers import flight_recorder as fr
from helpers.scenarios.issue_hangs import CASES


def _run(script: str, args: list[str], nproc: int) -> jobs.JobResult:
    return jobs.run_job(SCENARIOS / script, [*args, "--timeout-s", "60"], nproc=nproc, timeout_s=90, stall_s=4,
                        heartbeat=r"step \d+", verbose=False)


def test_two_rank_hangs_from_fr_alone_and_with_stacks(no_leftovers):
    save, ddp_eval = jobs.run_together(lambda: _run("hangs.py", ["--case", "rank0_save", "--backend", "gloo"], 2),
                                       lambda: _run("issue_hangs.py", ["--case", "ddp_eval_rank0"], 2))
    for r, want in ((save, [0]), (ddp_eval, CASES["ddp_eval_rank0"][2])):
        assert r.hung, r.summary()
        dumps = fr.load_dir(r.job_dir / "fr")
        assert sorted(dumps) == [0, 1] and all(d["entries"] for d in dumps.values())
        alone = doctor.diagnose_fr(dumps)
        both = doctor.diagnose_job_dir(r.job_dir)
        assert alone.diverged == want and both.diverged == want, (alone.text, both.text)
        assert alone.evidence != "undecided" and "decided by" in both.text
    assert doctor.diagnose_job_dir(save.job_dir).evidence == "rank branch"
    assert "save_checkpoint() at hangs.py:" in doctor.diagnose_job_dir(save.job_dir).text
    out = subprocess.run([sys.executable, "-m", "helpers.cli", "doctor", "--fr-dir", str(save.job_dir / "fr")], cwd=ROOT,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and "rank(s) [0] diverged" in out.stdout and "gloo:barrier" in out.stdout
