#!/usr/bin/env bash
# The real-guest move campaign (contrib/chaos/moves.py): installs what is missing, builds, and
# runs it with the given arguments, e.g. --seconds 1800 --seed 42.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
"$root/contrib/install-deps.sh"
[ -f "$root/build/build.ninja" ] || meson setup "$root/build" --wrap-mode=nodownload >/dev/null
ninja -C "$root/build" -j2 toyvm/toyvm >/dev/null
exec /usr/bin/python3 "$root/contrib/chaos/moves.py" --build "$root/build" "$@"
