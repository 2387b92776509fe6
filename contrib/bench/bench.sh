#!/usr/bin/env bash
# The benchmark in one command: installs what is missing (gnuplot for the plots, wrk for the
# metadata service), builds, and runs contrib/bench/run.py with the given arguments
# (--quick for a fast look). `--scale [scale.py arguments]` runs contrib/bench/scale.py instead:
# 200 agents, Placement on PostgreSQL, a 3-member etcd and 2,000 instances.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
"$root/contrib/install-deps.sh" gnuplot-nox wrk
[ -f "$root/build/build.ninja" ] || meson setup "$root/build" --wrap-mode=nodownload >/dev/null
ninja -C "$root/build" -j2 toyvm/toyvm contrib/bench/toyvm-bench contrib/bench/libvirt-floor \
  tests/integration/toyvm-testbed >/dev/null
if [ "${1:-}" = --scale ]; then
  shift
  exec /usr/bin/python3 "$root/contrib/bench/scale.py" "$@"
fi
exec /usr/bin/python3 "$root/contrib/bench/run.py" "$@"
