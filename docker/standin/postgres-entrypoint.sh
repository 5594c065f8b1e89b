#!/usr/bin/env bash
# The official postgres image's contract, as far as docker/compose.yaml uses it: on an empty $PGDATA,
# create the cluster with the superuser POSTGRES_USER (password POSTGRES_PASSWORD, scram) and the
# database POSTGRES_DB; then serve on every address of the container's network, passwords required.
set -euo pipefail
: "${POSTGRES_PASSWORD:?set POSTGRES_PASSWORD}"
user="${POSTGRES_USER:-postgres}"
db="${POSTGRES_DB:-$user}"
if [ ! -s "$PGDATA/PG_VERSION" ]; then
  pwfile="$(mktemp)"; printf '%s\n' "$POSTGRES_PASSWORD" > "$pwfile"
  initdb -D "$PGDATA" -U "$user" --pwfile="$pwfile" --auth-local=trust --auth-host=scram-sha-256 >/dev/null
  rm -f "$pwfile"
  echo "host all all all scram-sha-256" >> "$PGDATA/pg_hba.conf"
  if [ "$db" != postgres ]; then
    pg_ctl -D "$PGDATA" -w -o "-c listen_addresses='' -c unix_socket_directories=/var/run/postgresql" start >/dev/null
    createdb -h /var/run/postgresql -U "$user" -O "$user" "$db"
    pg_ctl -D "$PGDATA" -w -m fast stop >/dev/null
  fi
  echo "postgres-entrypoint.sh: created the cluster (user $user, database $db)"
fi
exec postgres -D "$PGDATA" -c listen_addresses='*' -c unix_socket_directories=/var/run/postgresql
