#!/usr/bin/env bash
# SLURM HealthCheckProgram: the allocation check's prolog tier on this node (runbook health-check, issue 23).
# It drains THIS node itself when the node breaks its contract (slurmd expects the program to act:
# "scontrol update NodeName=foo State=drain Reason=..."), with a reason sinfo -R can read in 20 characters:
#     [node_problem] mtu: path MTU below 9000: ... lost, 1472 bytes pass
# A check that breaks on its own (unreadable contract, missing tool, over 50 s) drains nothing: it is logged.
#
# slurm.conf (every node the same; slurmd runs it as root every HealthCheckInterval seconds, at start-up, and
# kills it after 60 s):
#     HealthCheckProgram=/shared/distributed-runbook/configs/slurm/healthcheck.sh   # EDIT: the path on your nodes
#     HealthCheckInterval=300
# then `scontrol reconfigure`.  Try it by hand on a node: sudo configs/slurm/healthcheck.sh; tail the log.
set -euo pipefail
export PATH="/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin${PATH:+:$PATH}"  # slurmd passes next to none
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
# Site settings: slurmd gives this program almost no environment, so they live in a file beside it (optional):
# RUNBOOK_PYTHON, RUNBOOK_CONTRACT, RUNBOOK_LOG_DIR, SLURM_CONF, PATH.
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
PYTHONPATH="$root" timeout 50 "$python" -m helpers.cli health-check --contract "$contract" --node "$node" --drain \
    >>"$log" 2>&1 || rc=$?
# 0 healthy; 1 a node problem (drained above); 2 the check broke; 124 it ran over 50 s: never a drain but 1.
case "$rc" in
    0|1) ;;
    *) echo "$(date -Is) $node: the health check did not judge the node (exit $rc): nothing drained" >>"$log" ;;
esac
exit 0
