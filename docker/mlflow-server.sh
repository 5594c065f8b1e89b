#!/usr/bin/env bash
# The MLflow tracking server of the compose stack (and of any host): store and artifacts from the
# environment, basic authentication behind one switch.
#   MLFLOW_BACKEND_STORE_URI      e.g. postgresql+psycopg2://mlflow:PASSWORD@postgres:5432/mlflow (required)
#   MLFLOW_ARTIFACTS_DESTINATION  folder or URI for artifacts (default /mlartifacts)
#   MLFLOW_HOST / MLFLOW_PORT     where it listens (default 0.0.0.0:5000 inside a container; publish the
#                                 port on 127.0.0.1 only)
#   MLFLOW_WORKERS                server worker processes (default 2)
#   MLFLOW_ALLOWED_HOSTS          Host headers the server answers (MLflow's DNS-rebinding guard; default
#                                 localhost and private IPs): in compose, the service name `mlflow:5000`
#   MLFLOW_AUTH=basic             users and passwords (MLflow's basic-auth app); then MLFLOW_ADMIN_PASSWORD
#                                 is required (the admin user's password, MLFLOW_ADMIN_USER default admin)
#                                 and clients log with MLFLOW_TRACKING_USERNAME / MLFLOW_TRACKING_PASSWORD.
set -euo pipefail
# MLflow's job runner (consumers for its GenAI evaluation jobs) serves nothing of mocolab's: off unless asked
export MLFLOW_SERVER_ENABLE_JOB_EXECUTION="${MLFLOW_SERVER_ENABLE_JOB_EXECUTION:-false}"
: "${MLFLOW_BACKEND_STORE_URI:?set MLFLOW_BACKEND_STORE_URI (postgresql+psycopg2://user:password@host:5432/db or sqlite:///path)}"
args=(server --host "${MLFLOW_HOST:-0.0.0.0}" --port "${MLFLOW_PORT:-5000}" --workers "${MLFLOW_WORKERS:-2}"
      --backend-store-uri "$MLFLOW_BACKEND_STORE_URI"
      --artifacts-destination "${MLFLOW_ARTIFACTS_DESTINATION:-/mlartifacts}")
[ -n "${MLFLOW_ALLOWED_HOSTS:-}" ] && args+=(--allowed-hosts "$MLFLOW_ALLOWED_HOSTS")
case "${MLFLOW_AUTH:-none}" in
  none) ;;
  basic)
    : "${MLFLOW_ADMIN_PASSWORD:?MLFLOW_AUTH=basic needs MLFLOW_ADMIN_PASSWORD, the password of the admin user}"
    config="$(mktemp -d)/basic_auth.ini"
    umask 077
    cat > "$config" <<INI
[mlflow]
default_permission = READ
database_uri = ${MLFLOW_AUTH_DATABASE_URI:-$MLFLOW_BACKEND_STORE_URI}
admin_username = ${MLFLOW_ADMIN_USER:-admin}
admin_password = ${MLFLOW_ADMIN_PASSWORD}
authorization_function = mlflow.server.auth:authenticate_request_basic_auth
INI
    export MLFLOW_AUTH_CONFIG_PATH="$config"
    # the CSRF key of the login forms: one per server unless given (give one when servers share a store)
    export MLFLOW_FLASK_SERVER_SECRET_KEY="${MLFLOW_FLASK_SERVER_SECRET_KEY:-$(python -c 'import secrets; print(secrets.token_hex(32))')}"
    args+=(--app-name basic-auth) ;;
  *) echo "mlflow-server.sh: MLFLOW_AUTH='${MLFLOW_AUTH}' is not one of: none, basic" >&2; exit 2 ;;
esac
echo "mlflow-server.sh: mlflow server on ${MLFLOW_HOST:-0.0.0.0}:${MLFLOW_PORT:-5000}, auth ${MLFLOW_AUTH:-none}"
exec mlflow "${args[@]}"
