#!/usr/bin/env bash
# Quick start: installs what is missing, builds toyvm, starts etcd and Placement on
# loopback (their data under one directory), starts one compute agent on libvirt's test
# driver, schedules an instance, waits for ACTIVE and shows it. Safe to run again.
# With --real, the agent runs on qemu:///system instead (libvirtd is started if needed) and
# the instance is a real guest under QEMU's TCG: contrib/tiny-guest.sh's kernel + busybox.
# With --debian, the guest is Debian 12 with its own cloud-init (contrib/debian-image.sh),
# given your ssh key (~/.ssh/id_ed25519.pub or id_rsa.pub; one is made if you have none), and
# the quick start ends by logging in to it with ssh.
# With --projects, a cloud of its own (etcd with TLS and auth on) shows a project's member
# scheduling through `toyvm scheduler` and being refused over quota, then stops it.
#   usage: contrib/quickstart.sh           start everything and schedule an instance
#          contrib/quickstart.sh --projects  projects, quotas and a member, in a cloud of its own
#          contrib/quickstart.sh --real    the same with a real guest
#          contrib/quickstart.sh --debian  the same with a Debian guest, and ssh into it
#          contrib/quickstart.sh stop     stop what it started (the data stays)
# Data: $TOYVM_QUICKSTART_DIR, default /var/tmp/toyvm-quickstart (delete it to start over).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
data=${TOYVM_QUICKSTART_DIR:-/var/tmp/toyvm-quickstart}
toyvm=$root/build/toyvm/toyvm
etcd_url=http://127.0.0.1:2379
placement_url=http://127.0.0.1:8080
export TOYVM_ETCD=$etcd_url TOYVM_PLACEMENT=$placement_url

alive() { [ -f "$data/$1.pid" ] && kill -0 "$(cat "$data/$1.pid")" 2>/dev/null; }

stop_one() {
  if alive "$1"; then
    local pid deadline=$((SECONDS + 15))
    pid=$(cat "$data/$1.pid")
    kill "$pid"
    while kill -0 "$pid" 2>/dev/null; do
      if [ $SECONDS -ge $deadline ]; then kill -9 "$pid"; fi
      sleep 0.1
    done
    echo "stopped $1"
  fi
  rm -f "$data/$1.pid"
}

if [ "${1:-}" = stop ]; then
  stop_one compute
  stop_one compute-real
  echo "guests keep running; destroy them with: $toyvm destroy UUID (servers must be up)"
  stop_one placement
  stop_one etcd
  exit 0
fi

"$root/contrib/install-deps.sh"
[ -f "$root/build/build.ninja" ] || meson setup "$root/build" --wrap-mode=nodownload >/dev/null
if [ "${1:-}" = --projects ]; then
  ninja -C "$root/build" -j2 toyvm/toyvm tests/integration/toyvm-testbed >/dev/null
  exec /usr/bin/python3 "$root/contrib/testbed/projects_demo.py" --build "$root/build"
fi
ninja -C "$root/build" -j2 toyvm/toyvm >/dev/null
mkdir -p "$data"

# Polls a command until it succeeds, for at most $1 seconds.
wait_until() {
  local limit=$1; shift
  local deadline=$((SECONDS + limit))
  until "$@" >/dev/null 2>&1; do
    if [ $SECONDS -ge $deadline ]; then echo "quickstart: timed out waiting for: $*" >&2; return 1; fi
    sleep 0.2
  done
}
placement_up() { /usr/bin/python3 -c "import urllib.request; urllib.request.urlopen('$placement_url/')"; }

if ! alive etcd; then
  setsid etcd --name quickstart --data-dir "$data/etcd" --logger=zap --log-outputs="$data/etcd.log" \
    --listen-client-urls $etcd_url --advertise-client-urls $etcd_url \
    --listen-peer-urls http://127.0.0.1:2380 --initial-advertise-peer-urls http://127.0.0.1:2380 \
    --initial-cluster quickstart=http://127.0.0.1:2380 \
    --auto-compaction-mode=periodic --auto-compaction-retention=1h >/dev/null 2>&1 < /dev/null &
  echo $! > "$data/etcd.pid"
  echo "started etcd at $etcd_url"
fi
if ! alive placement; then
  [ -f "$data/placement/placement.sqlite" ] || "$root/contrib/placement-setup.sh" "$data/placement" 8080
  setsid uwsgi --ini "$data/placement/uwsgi.ini" >/dev/null 2>&1 < /dev/null &
  echo $! > "$data/placement.pid"
  echo "started Placement at $placement_url"
fi
wait_until 20 "$toyvm" show
wait_until 30 placement_up

mode=${1:-}
case "$mode" in
  ''|--real|--debian) ;;
  *) echo "usage: $0 [--real|--debian|--projects|stop]" >&2; exit 2 ;;
esac

if [ -z "$mode" ]; then
  if ! alive compute; then
    setsid "$toyvm" compute --state-dir "$data/compute" --libvirt-uri test:///default --name quickstart \
      >"$data/compute.log" 2>&1 < /dev/null &
    echo $! > "$data/compute.pid"
    echo "started toyvm compute (log: $data/compute.log)"
  fi
  wait_until 30 sh -c "'$toyvm' show --hosts | grep -q '^quickstart .* yes '"
  query='resources=VCPU:1,DISK_GB:1,MEMORY_MB:256'
  schedule_args=()
else
  "$root/contrib/start-libvirtd.sh"
  if [ "$mode" = --debian ]; then
    "$root/contrib/debian-image.sh" "$data/images/debian-12"
  else
    "$root/contrib/tiny-guest.sh" "$data/images/tiny"
  fi
  chmod 0755 "$data" "$data/images"
  if ! alive compute-real; then
    cat > "$data/compute-real.toml" <<EOF
[compute]
libvirt_uri = "qemu:///system"
domain_type = "qemu"           # TCG: no nested virtualisation here
image_dir = "$data/images"
network = "default"
metadata_interface = "virbr0"  # the agent serves its guests' metadata on 169.254.169.254 there
[mdserver]
listen = ["169.254.169.254:80"]
EOF
    setsid "$toyvm" --config "$data/compute-real.toml" compute --state-dir "$data/compute-real" \
      --name quickstart-real --trait CUSTOM_REAL_GUESTS --inventory VCPU:2,MEMORY_MB:1024,DISK_GB:10 \
      >"$data/compute-real.log" 2>&1 < /dev/null &
    echo $! > "$data/compute-real.pid"
    echo "started toyvm compute on qemu:///system (log: $data/compute-real.log)"
  fi
  wait_until 60 sh -c "'$toyvm' show --hosts | grep -q '^quickstart-real .* yes '"
  if [ "$mode" = --debian ]; then
    key=
    for candidate in ~/.ssh/id_ed25519 ~/.ssh/id_rsa "$data/id_ed25519"; do
      [ -f "$candidate.pub" ] && { key=$candidate; break; }
    done
    if [ -z "$key" ]; then
      key=$data/id_ed25519
      ssh-keygen -q -t ed25519 -N '' -C toyvm-quickstart -f "$key"
      echo "made an ssh key for the guest: $key"
    fi
    query='resources=VCPU:1,DISK_GB:3,MEMORY_MB:512&required=CUSTOM_REAL_GUESTS'
    schedule_args=(--image debian-12 --name debian-1 --key-file "$key.pub" --timeout 600)
  else
    query='resources=VCPU:1,DISK_GB:1,MEMORY_MB:128&required=CUSTOM_REAL_GUESTS'
    schedule_args=(--image tiny --timeout 300)
  fi
fi

echo
echo "\$ toyvm schedule '$query' ${schedule_args[*]} --wait"
out=$("$toyvm" schedule "$query" "${schedule_args[@]}" --wait)
echo "$out"
uuid=$(echo "$out" | sed -n 's/^NOTIFIED TARGET, .*, OF INSTANCE \(.*\)$/\1/p')
echo
echo "\$ toyvm show --hosts"
"$toyvm" show --hosts
echo
echo "\$ toyvm show $uuid"
"$toyvm" show "$uuid"
if [ "$mode" = --real ]; then
  wait_until 120 sh -c "'$toyvm' show $uuid --console | grep -q 'toyvm-guest: \(instance-id\|no metadata\)'" || true
  echo
  echo "\$ toyvm show $uuid --console | tail -n 8"
  "$toyvm" show "$uuid" --console | tail -n 8
fi
if [ "$mode" = --debian ]; then
  ip=$("$toyvm" show "$uuid" --json | /usr/bin/python3 -c 'import json, sys; print(json.load(sys.stdin)["ip"] or "")')
  login=(ssh -i "$key" -o UserKnownHostsFile="$data/known_hosts" -o StrictHostKeyChecking=accept-new "debian@$ip")
  echo
  echo "waiting for the guest's ssh (cloud-init gives it your key as it boots; minutes under TCG)"
  wait_until 600 "${login[@]}" -o BatchMode=yes -o ConnectTimeout=5 true
  echo
  echo "\$ ${login[*]} 'cloud-init status --wait; hostname; ip -4 -brief addr'"
  "${login[@]}" 'cloud-init status --wait; hostname; ip -4 -brief addr'
  echo
  echo "log in with: ${login[*]}"
fi
echo
echo "toyvm is at $toyvm; the servers keep running. Stop them with: $0 stop"
