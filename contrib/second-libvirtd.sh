#!/usr/bin/env bash
# A second libvirtd on this machine, as a second host for moving guests between two daemons:
#   contrib/second-libvirtd.sh start [DIR]   prints its URI (qemu+tcp://127.0.0.1:16510/system),
#                                            then the first daemon's as either reaches it (a
#                                            unix socket; the first does not listen on TCP)
#   contrib/second-libvirtd.sh stop [DIR]
# The QEMU driver keeps fixed paths (its pid lock, <name>.xml status files), and during a
# migration one domain exists on both daemons: this one runs in its own mount namespace, with
# its own /run/libvirt, /var/lib/libvirt, /var/cache/libvirt, /var/log/libvirt and /etc/libvirt
# under DIR (default /var/lib/toyvm-test/libvirtd-b), its own host_uuid (libvirt refuses to
# migrate to the same host uuid), TCP without authentication on 127.0.0.1 only (for tests on
# one machine; never for a real host), and its own migration and display port ranges. Its
# `default` network bridges onto the first daemon's virbr0: same guests' network, one DHCP
# server. Needs root; the first daemon is started if it is not running.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
action=${1:-}
dir=${2:-/var/lib/toyvm-test/libvirtd-b}
port=${TOYVM_SECOND_LIBVIRTD_PORT:-16510}
uri="qemu+tcp://127.0.0.1:$port/system"

answers() { virsh -q -c "$uri" uri >/dev/null 2>&1; }

alive() { [ -f "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }

stop() {
  for pidfile in "$@"; do
    [ -f "$pidfile" ] || continue
    pid=$(cat "$pidfile")
    kill "$pid" 2>/dev/null || true
    for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    rm -f "$pidfile"
  done
}

case "$action" in
  stop) stop "$dir/libvirtd.pid" "$dir/virtlogd.pid"; umount /run/toyvm-first-libvirt 2>/dev/null || true; exit 0 ;;
  start) ;;
  *) echo "usage: $0 start|stop [DIR]" >&2; exit 2 ;;
esac

# The first daemon under a path that both namespaces share: the second daemon sends guests
# back to it there, and a cold move's disk goes to it from either side.
# The first daemon makes /run/libvirt on a fresh machine: it starts first.
back="qemu+unix:///system?socket=/run/toyvm-first-libvirt/libvirt-sock"
"$root/contrib/start-libvirtd.sh"
mkdir -p /run/toyvm-first-libvirt
mountpoint -q /run/toyvm-first-libvirt || mount --bind /run/libvirt /run/toyvm-first-libvirt
answers && { echo "$uri"; echo "$back"; exit 0; }
# A daemon of an earlier run that no longer answers goes. Its virtlogd, still running, stays, as
# it does on any host (a service of its own): it holds the running guests' console logs, which
# would end with it.
stop "$dir/libvirtd.pid"
virtlogd_needed=1
alive "$dir/virtlogd.pid" && virtlogd_needed=0

mkdir -p "$dir"/{run,lib,cache,log,etc}
if [ ! -f "$dir/etc/libvirtd.conf" ]; then
  cp -a /etc/libvirt/. "$dir/etc/"
  cp -a /var/cache/libvirt/. "$dir/cache/"  # QEMU's capabilities: spares it the probe
  mkdir -p "$dir/lib/qemu" "$dir/lib/dnsmasq" "$dir/lib/images"
  chown libvirt-qemu:libvirt-qemu "$dir/lib/qemu" 2>/dev/null || true
  cat >>"$dir/etc/libvirtd.conf" <<EOF

# A second daemon for tests on one machine (contrib/second-libvirtd.sh).
listen_tls = 0
listen_tcp = 1
listen_addr = "127.0.0.1"
tcp_port = "$port"
auth_tcp = "none"
host_uuid = "$(cat /proc/sys/kernel/random/uuid)"
EOF
  cat >>"$dir/etc/qemu.conf" <<'EOF'

# Apart from the first daemon's (49152-49215 and 5900-65535 by default).
migration_port_min = 49400
migration_port_max = 49463
remote_display_port_min = 15900
remote_display_port_max = 15999
EOF
  # Only the bridge over the first daemon's network: a second dnsmasq would answer the same
  # guests.
  rm -f "$dir"/etc/qemu/networks/autostart/*.xml "$dir"/etc/qemu/networks/*.xml
  mkdir -p "$dir/etc/qemu/networks/autostart"
  cat >"$dir/etc/qemu/networks/default.xml" <<'EOF'
<network>
  <name>default</name>
  <forward mode='bridge'/>
  <bridge name='virbr0'/>
</network>
EOF
  ln -sf ../default.xml "$dir/etc/qemu/networks/autostart/default.xml"
fi

# The first daemon's network (its virbr0) must be up for the bridge above.
virsh -q -c qemu:///system net-start default >/dev/null 2>&1 || true

# Private mounts over libvirt's fixed paths; the daemons keep the namespace alive. Their pid
# files go under DIR, as /run itself is shared.
unshare --mount --propagation private bash -c '
  set -e
  dir=$1
  mount --bind "$dir/run" /run/libvirt 2>/dev/null || { mkdir -p /run/libvirt; mount --bind "$dir/run" /run/libvirt; }
  mount --bind "$dir/lib" /var/lib/libvirt
  mount --bind "$dir/cache" /var/cache/libvirt
  mkdir -p /var/log/libvirt && mount --bind "$dir/log" /var/log/libvirt
  mount --bind "$dir/etc" /etc/libvirt
  if [ "$2" = 1 ]; then virtlogd -d -p "$dir/virtlogd.pid"; fi
  libvirtd -d --listen -p "$dir/libvirtd.pid"
' _ "$dir" "$virtlogd_needed"

for _ in $(seq 1 300); do
  answers && { echo "$uri"; echo "$back"; exit 0; }
  sleep 0.2
done
echo "second-libvirtd: no answer on $uri (see $dir/log)" >&2
exit 1
