#!/usr/bin/env bash
# Prepares a private OpenStack Keystone (sqlite, fernet tokens) in DIR, bootstrapped with user
# "admin" (role admin on project "admin", domain Default) and the given password, to be served
# on 127.0.0.1:PORT by `uwsgi --ini DIR/uwsgi.ini`. Used by the tests of Keystone auth.
#   usage: keystone-setup.sh DIR PORT PASSWORD [TOKEN_EXPIRATION_SECONDS]
set -euo pipefail
dir=$1 port=$2 password=$3 expiration=${4:-3600}
mkdir -p "$dir"
dir=$(cd "$dir" && pwd)

cat > "$dir/keystone.conf" <<CONF
[DEFAULT]
log_file = $dir/keystone.log
[database]
connection = sqlite:///$dir/keystone.sqlite
[token]
provider = fernet
expiration = $expiration
[fernet_tokens]
key_repository = $dir/fernet-keys
[fernet_receipts]
key_repository = $dir/fernet-receipts
[credential]
key_repository = $dir/credential-keys
CONF

cat > "$dir/uwsgi.ini" <<INI
[uwsgi]
plugins = python3,http
http = 127.0.0.1:$port
wsgi-file = /usr/bin/keystone-wsgi-public
env = OS_KEYSTONE_CONFIG_FILES=$dir/keystone.conf
# Without keep-alive the router closes each connection after its answer, and a client
# that reused one at that moment (keystonemiddleware in Placement) got a reset: a 503.
http-keepalive = 1
master = true
processes = 1
threads = 1
need-app = true
die-on-term = true
disable-logging = true
logto = $dir/uwsgi.log
INI

manage() { /usr/bin/keystone-manage --config-file "$dir/keystone.conf" "$@" >>"$dir/setup.log" 2>&1; }
manage db_sync
manage fernet_setup --keystone-user "$(id -un)" --keystone-group "$(id -gn)"
manage credential_setup --keystone-user "$(id -un)" --keystone-group "$(id -gn)"
# keystone-manage exits through an eventlet traceback after its work; the check below is what counts.
manage bootstrap --bootstrap-password "$password" --bootstrap-region-id RegionOne \
  --bootstrap-admin-url "http://127.0.0.1:$port/v3" --bootstrap-public-url "http://127.0.0.1:$port/v3" \
  --bootstrap-internal-url "http://127.0.0.1:$port/v3" || true
grep -q "Created public endpoint\|already exists" "$dir/keystone.log"
