#!/usr/bin/env bash
# Prepares a private OpenStack Placement (noauth2, sqlite) in DIR, to be served on
# 127.0.0.1:PORT by `uwsgi --ini DIR/uwsgi.ini`. Used by the tests, the benchmark and the
# quick start. With a third argument, the database is copied from that prepared sqlite file
# instead of being created (saves the ~2 s schema sync). With a fifth, Placement uses that
# database URL instead (e.g. postgresql+psycopg2://user@127.0.0.1:5432/placement). With
# KEYSTONE_URL and KEYSTONE_ADMIN_PASSWORD in the environment, auth_strategy is keystone.
#   usage: placement-setup.sh DIR PORT [TEMPLATE_DB] [WORKERS] [DATABASE_URL]
set -euo pipefail
dir=$1 port=$2 template=${3:-} workers=${4:-2} database=${5:-}
mkdir -p "$dir"
dir=$(cd "$dir" && pwd)
[ -n "$database" ] || database=sqlite:///$dir/placement.sqlite

strategy=noauth2
[ -z "${KEYSTONE_URL:-}" ] || strategy=keystone
cat > "$dir/placement.conf" <<CONF
[DEFAULT]
debug = false
[api]
auth_strategy = $strategy
[placement_database]
connection = $database
[placement]
# A random sample when a limit cuts the candidates: concurrent schedulers then do not all
# get, and race for, the same first providers.
randomize_allocation_candidates = true
CONF
# With KEYSTONE_URL (…/v3) and KEYSTONE_ADMIN_PASSWORD, tokens are checked by Keystone.
if [ -n "${KEYSTONE_URL:-}" ]; then
  cat >> "$dir/placement.conf" <<CONF
[keystone_authtoken]
www_authenticate_uri = $KEYSTONE_URL
auth_url = $KEYSTONE_URL
auth_type = password
username = admin
password = $KEYSTONE_ADMIN_PASSWORD
project_name = admin
user_domain_name = Default
project_domain_name = Default
CONF
fi

# uWSGI's own HTTP router in front of the workers, so idle keep-alive clients do not pin a
# worker (with http11-socket one idle client can stall others for seconds).
cat > "$dir/uwsgi.ini" <<INI
[uwsgi]
plugins = python3,http
http = 127.0.0.1:$port
http-keepalive = 1
socket = $dir/uwsgi.sock
wsgi-file = /usr/bin/placement-api
env = OS_PLACEMENT_CONFIG_DIR=$dir
master = true
lazy-apps = true
processes = $workers
threads = 1
need-app = true
die-on-term = true
no-orphans = true
buffer-size = 65535
disable-logging = true
logto = $dir/uwsgi.log
INI

if [[ "$database" == sqlite* ]] && [ -n "$template" ] && [ -f "$template" ]; then
  cp "$template" "$dir/placement.sqlite"
else
  # Debian's Python tools need Debian's interpreter, not whatever python3 is first on PATH.
  /usr/bin/placement-manage --config-file "$dir/placement.conf" db sync >/dev/null
  # Seed the standard traits once, before several workers race to do it.
  OS_PLACEMENT_CONFIG_DIR=$dir /usr/bin/python3 -c \
    'from placement.wsgi import init_application; init_application()' >/dev/null 2>&1
fi
