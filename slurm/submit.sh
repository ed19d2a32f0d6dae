#!/bin/bash
# Submit generate -> judge -> merge+report as three chained SLURM jobs and print their ids.
#
#   slurm/submit.sh SHARDS [hydra overrides...]
#   slurm/submit.sh 8 data=official data.root=/data/personalens/data run.name=llama8b \
#       model@assistant=llama31_8b assistant.path=/models/Llama-3.1-8B-Instruct
#
# Judge task k starts when generate task k has succeeded; the report job runs once every judge
# task has ended, whatever its state. Both dependencies carry --kill-on-invalid-dep=yes: a judge task
# whose generate task failed is cancelled at once (a default SLURM would leave it pending forever,
# DependencyNeverSatisfied, and the report behind it), so the chain always ends with a report. The
# report covers the shards that finished and names the others and why; its job then fails.
# Runs resume, so re-submitting with ARRAY=<failed shards> only does the missing work.
#
# Settings (environment variables; empty = the #SBATCH default in the .sbatch file):
#   PERSONALENS  personalens executable, e.g. /path/to/.venv/bin/personalens (default: on PATH)
#   GPUS         GPUs per generate/judge task (default 1); 0 = no GPU request (CPU-only cluster).
#                A task's models are placed on its GPUs before anything loads: `personalens plan` with
#                the same overrides and plan.gpus=N says how N GPUs hold them (docs/cluster.md)
#   CPUS         CPUs per generate/judge task (default 8)
#   MEM          memory per generate/judge task (default 64G)
#   TIME         time limit per generate/judge task (default 24:00:00)
#   REPORT_CPUS, REPORT_MEM, REPORT_TIME   the same for the merge+report job (default 4, 16G, 02:00:00)
#   PARTITION    partition of the generate and judge tasks (default: the cluster's default partition)
#   REPORT_PARTITION  partition of the merge+report job, which needs no GPU (default: PARTITION)
#   ACCOUNT      account of every job
#   ARRAY        shards to run, in sbatch --array syntax (default: all, 0-(SHARDS-1)); e.g. 1,3
#   LOG_DIR      where job logs go, named <job name>-<job id>_<array index>.log (default: slurm-logs)
#   SBATCH_ARGS  more sbatch arguments for every job, split on spaces, e.g. "--qos=high"
#   PLAN         the plan.json of `personalens plan` with these overrides and plan.gpus=GPUS: the
#                generate and judge tasks each run the layout it chose for them (`layout=PLAN`: the
#                fastest that fits; the configured one where the plan kept it or did not place the job)
set -euo pipefail

usage="usage: [SETTING=value ...] $0 SHARDS [hydra overrides...]   (settings: see the top of $0)"
if [[ $# -lt 1 || ! $1 =~ ^[1-9][0-9]*$ ]]; then
  echo "$usage" >&2
  exit 2
fi
shards=$1
shift

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
personalens=${PERSONALENS:-personalens}
if ! command -v "$personalens" >/dev/null; then
  echo "$0: personalens executable '$personalens' not found; set PERSONALENS=/path/to/.venv/bin/personalens" >&2
  exit 2
fi
personalens=$(command -v "$personalens")  # absolute, so that jobs find it from any node
log_dir=${LOG_DIR:-slurm-logs}
mkdir -p "$log_dir"

common=(--parsable "--export=ALL,SHARDS=$shards,PERSONALENS=$personalens")
[[ -n ${ACCOUNT:-} ]] && common+=("--account=$ACCOUNT")
# shellcheck disable=SC2206  # word splitting is the point
[[ -n ${SBATCH_ARGS:-} ]] && common+=($SBATCH_ARGS)

shard_jobs=("--array=${ARRAY:-0-$((shards - 1))}" "--output=$log_dir/%x-%A_%a.log")
report_job=("--output=$log_dir/%x-%j.log")
[[ -n ${PARTITION:-} ]] && shard_jobs+=("--partition=$PARTITION")
report_partition=${REPORT_PARTITION:-${PARTITION:-}}
[[ -n $report_partition ]] && report_job+=("--partition=$report_partition")
if [[ -n ${GPUS:-} ]]; then
  if [[ $GPUS == 0 ]]; then shard_jobs+=(--gres=none); else shard_jobs+=("--gres=gpu:$GPUS"); fi
fi

# sbatch flags from the settings <prefix>CPUS, <prefix>MEM and <prefix>TIME that are set
resources() {
  local cpus=${1}CPUS mem=${1}MEM time=${1}TIME
  if [[ -n ${!cpus:-} ]]; then echo "--cpus-per-task=${!cpus}"; fi
  if [[ -n ${!mem:-} ]]; then echo "--mem=${!mem}"; fi
  if [[ -n ${!time:-} ]]; then echo "--time=${!time}"; fi
}
mapfile -t shard_resources < <(resources "")
mapfile -t report_resources < <(resources REPORT_)
shard_jobs+=("${shard_resources[@]}")

# PLAN: each generate and judge task runs the layout plan chose for it (`layout=PLAN`, config/layout_plan.py);
# a PLAN that is no plan.json, or whose layout clashes with these overrides, is refused here, before anything
# is submitted (`--cfg job` composes the config with the plan's overrides without running the command)
generate_layout=() judge_layout=()
if [[ -n ${PLAN:-} ]]; then
  plan=$(realpath -m "$PLAN")  # absolute, so that tasks find it from any node
  for job in generate judge; do
    if ! "$personalens" "$job" "$@" "layout=$plan" --cfg job >/dev/null; then
      echo "$0: PLAN=$PLAN: $job refused it (above); nothing submitted" >&2
      exit 2
    fi
  done
  generate_layout=("layout=$plan") judge_layout=("layout=$plan")
fi

# --parsable prints "<job id>[;<cluster>]"
submit() { sbatch "${common[@]}" "$@" | cut -d';' -f1; }

generate=$(submit "${shard_jobs[@]}" "$here/generate.sbatch" "$@" "${generate_layout[@]}")
judge=$(submit "${shard_jobs[@]}" "--dependency=aftercorr:$generate" --kill-on-invalid-dep=yes "$here/judge.sbatch" \
  "$@" "${judge_layout[@]}")
report=$(submit "${report_job[@]}" "${report_resources[@]}" "--dependency=afterany:$judge" --kill-on-invalid-dep=yes \
  "$here/report.sbatch" "$@")

echo "generate $generate"
echo "judge $judge"
echo "report $report"
echo "logs in $log_dir/ (pl-generate-${generate}_<shard>.log, pl-judge-${judge}_<shard>.log, pl-report-$report.log)" >&2
