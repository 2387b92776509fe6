#!/usr/bin/env bash
# Installs every Debian package toyvm's build, tests and quick start need.
# Idempotent: when everything is present it only runs dpkg-query and exits.
set -euo pipefail

build_pkgs=(
  meson ninja-build pkg-config g++
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  libsimdjson-dev libcli11-dev libtomlplusplus-dev catch2 libspdlog-dev libfmt-dev
  libvirt-dev libisofs-dev libssl-dev libboost1.81-dev libboost-json1.81-dev libboost-url1.81-dev
  prometheus-cpp-dev libxml2-dev
  # The Debian package (debian/), built and checked by the package suite; dpkg-buildpackage
  # requires build-essential as every package's implicit build dependency.
  dpkg-dev build-essential debhelper lintian
)
# Real servers the integration tests and the quick start run on loopback.
service_pkgs=(
  iproute2 procps
  postgresql python3-psycopg2
  etcd-server etcd-client
  placement-api python3-placement uwsgi-core uwsgi-plugin-python3
  libvirt-clients openssl keystone
  # The metrics test parses /metrics with the Prometheus client's own parser.
  python3-prometheus-client
  # Real guests: libvirtd with QEMU, and what contrib/tiny-guest.sh builds the test guest with.
  libvirt-daemon-system qemu-system-x86 qemu-utils busybox-static xz-utils
  # The Debian guest (contrib/debian-image.sh), reached over ssh, and Debian's cloud-init
  # unpacked for its network converter (its modules need configobj and yaml).
  # debootstrap checks Debian's Release signature with the archive keyring (a Recommends).
  debootstrap debian-archive-keyring gpgv e2fsprogs openssh-client python3-configobj python3-yaml
  # What libvirtd runs that its packages only recommend (installed here without them):
  # dnsmasq serves DHCP and DNS on NAT networks such as "default", dmidecode gives it the
  # host's SMBIOS facts. Its firewall backend, iptables, is a hard dependency.
  dnsmasq-base dmidecode
)
extra_pkgs=("$@")

wanted=("${build_pkgs[@]}" "${service_pkgs[@]}" "${extra_pkgs[@]}")
missing=()
for pkg in "${wanted[@]}"; do
  status=$(dpkg-query -W -f='${db:Status-Status}' "$pkg" 2>/dev/null || true)
  [ "$status" = installed ] || missing+=("$pkg")
done
[ ${#missing[@]} -eq 0 ] && exit 0

if [ "$(id -u)" -ne 0 ]; then
  echo "install-deps: missing packages: ${missing[*]}; run as root to install them" >&2
  exit 1
fi
echo "install-deps: installing ${missing[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
# Services must not start on install: toyvm's scripts start private instances themselves.
policy=/usr/sbin/policy-rc.d
created_policy=0
if [ ! -e "$policy" ]; then
  printf '#!/bin/sh\nexit 101\n' > "$policy"; chmod +x "$policy"; created_policy=1
fi
trap '[ $created_policy -eq 1 ] && rm -f "$policy"' EXIT
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
