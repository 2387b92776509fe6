#!/usr/bin/env bash
# The seeded fault campaigns: installs what is missing, builds, and runs one with the given
# arguments: contrib/chaos/chaos.py (agents on libvirt's test driver), e.g. --seconds 1800
# --seed 42, or with --moves first contrib/chaos/moves.py (moves of real guests between two
# libvirt daemons).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
campaign=chaos
if [ "${1:-}" = --moves ]; then campaign=moves; shift; fi
"$root/contrib/install-deps.sh"
[ -f "$root/build/build.ninja" ] || meson setup "$root/build" --wrap-mode=nodownload >/dev/null
ninja -C "$root/build" -j2 toyvm/toyvm tests/integration/toyvm-testbed >/dev/null
exec /usr/bin/python3 "$root/contrib/chaos/$campaign.py" --build "$root/build" "$@"
