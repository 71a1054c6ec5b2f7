#!/usr/bin/env bash
# SLURM Prolog: the allocation check's prolog tier on each node before a job starts (runbook health-check).
# SLURM drains a node whose Prolog exits non-zero and requeues the job (https://slurm.schedmd.com/prolog_epilog.html),
# so this exits 1 only for a node problem (the check has already drained the node with its own reason), and 0
# when the check itself broke: a broken check must never drain a node or kill a user's job.
#
# slurm.conf (every node the same; the Prolog runs as root on each node of the job; keep it to seconds):
#     Prolog=/shared/distributed-runbook/configs/slurm/prolog.sh        # EDIT: the path on your nodes
#     PrologFlags=Alloc                                                   # run it when the allocation is granted
# then `scontrol reconfigure`.  The prolog tier takes at most 10 s (no job, no collective, no torch import).
set -euo pipefail
export PATH="/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin${PATH:+:$PATH}"  # slurmd passes next to none
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
if [ -r "${RUNBOOK_SITE_ENV:-$here/site.env}" ]; then
    set -a   # every variable of the file is exported: scontrol needs SLURM_CONF
    # shellcheck source=/dev/null
    . "${RUNBOOK_SITE_ENV:-$here/site.env}"
    set +a
fi
python="${RUNBOOK_PYTHON:-$root/.venv/bin/python}"                # EDIT: the project's interpreter on the nodes
contract="${RUNBOOK_CONTRACT:-$here/node_contract.json}"          # EDIT: copy node_contract.example.json and edit it
node="${SLURMD_NODENAME:-$(hostname -s)}"
log="${RUNBOOK_LOG_DIR:-$root/build/healthcheck}/$node.log"
mkdir -p "$(dirname "$log")"
rc=0
PYTHONPATH="$root" timeout 10 "$python" -m helpers.cli health-check --contract "$contract" --node "$node" --drain \
    >>"$log" 2>&1 || rc=$?
if [ "$rc" -eq 1 ]; then
    exit 1   # a node problem: SLURM keeps it drained and requeues the job elsewhere
fi
if [ "$rc" -ne 0 ]; then
    echo "$(date -Is) $node: prolog check did not judge the node (exit $rc): job ${SLURM_JOB_ID:-?} starts" >>"$log"
fi
exit 0
