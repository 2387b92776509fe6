#!/usr/bin/env bash
# Waits for the Placement database, applies migrations, then serves the API.
set -euo pipefail

conf_dir=${OS_PLACEMENT_CONFIG_DIR:-/etc/placement}
wait_seconds=${PLACEMENT_DB_WAIT_SECONDS:-60}

db_ready() {
  /usr/bin/python3 - "$conf_dir/placement.conf" <<'PY'
import configparser
import sys

import sqlalchemy

parser = configparser.ConfigParser(interpolation=None)
parser.read(sys.argv[1])
engine = sqlalchemy.create_engine(parser["placement_database"]["connection"])
with engine.connect():
    pass
PY
}

echo "placement: waiting for the database" >&2
deadline=$((SECONDS + wait_seconds))
until err=$(db_ready 2>&1); do
  if (( SECONDS >= deadline )); then
    echo "placement: database not reachable after ${wait_seconds}s:" >&2
    echo "$err" | tail -n 3 >&2
    exit 1
  fi
  sleep 1
done

echo "placement: syncing the database schema" >&2
placement-manage --config-dir "$conf_dir" db sync

exec uwsgi --ini "$conf_dir/uwsgi.ini" "$@"
