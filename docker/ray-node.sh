#!/usr/bin/env bash
# One Ray node of the compose stack: `ray-node.sh head` or `ray-node.sh worker`, in the foreground
# (--block) so the container lives as long as the node. Token authentication is on: RAY_AUTH_TOKEN
# (the same on every node and on the client that submits jobs) is required.
#   RAY_HEAD_ADDRESS   the head's GCS for a worker (default ray-head:6379)
#   RAY_NUM_CPUS       CPUs this node offers (head default 0: it only coordinates; worker default: all)
#   RAY_NUM_GPUS       GPUs this node offers (default: what Ray detects)
#   RAY_GCS_PORT / RAY_DASHBOARD_PORT / RAY_DASHBOARD_HOST   head ports (6379 / 8265 / 0.0.0.0 inside a
#                      container; publish the dashboard on 127.0.0.1 only)
#   RAY_START_ARGS     anything else for `ray start`
set -euo pipefail
export RAY_AUTH_MODE="${RAY_AUTH_MODE:-token}"
if [ "$RAY_AUTH_MODE" = token ] && [ -z "${RAY_AUTH_TOKEN:-}" ] && [ ! -s "$HOME/.ray/auth_token" ]; then
  echo "ray-node.sh: token authentication is on and RAY_AUTH_TOKEN is not set (make one: ray get-auth-token --generate)" >&2
  exit 2
fi
role="${1:-}"
args=(start --block)
[ -n "${RAY_NUM_GPUS:-}" ] && args+=(--num-gpus "$RAY_NUM_GPUS")
case "$role" in
  head)
    args+=(--head --port "${RAY_GCS_PORT:-6379}" --dashboard-host "${RAY_DASHBOARD_HOST:-0.0.0.0}"
           --dashboard-port "${RAY_DASHBOARD_PORT:-8265}" --num-cpus "${RAY_NUM_CPUS:-0}") ;;
  worker)
    args+=(--address "${RAY_HEAD_ADDRESS:-ray-head:6379}")
    [ -n "${RAY_NUM_CPUS:-}" ] && args+=(--num-cpus "$RAY_NUM_CPUS") ;;
  *) echo "usage: ray-node.sh head|worker" >&2; exit 2 ;;
esac
# shellcheck disable=SC2206  # RAY_START_ARGS is split on purpose
args+=(${RAY_START_ARGS:-})
echo "ray-node.sh: ray ${args[*]}"
exec ray "${args[@]}"
