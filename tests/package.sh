#!/usr/bin/env bash
# The Debian package, as an operator gets it: built from a copy of the tree with debhelper and
# meson, lintian without errors, installed with dpkg, toyvm --version from /usr/bin, its units
# verified by systemd, its configuration file in place and valid once uncommented; then
# purged, leaving the machine as it was.
#   usage: tests/package.sh SOURCE_ROOT [JUNIT_REPORT]   (as root)
set -euo pipefail

src=$(cd "$1" && pwd)
junit=${2:-}
work=$(mktemp -d /tmp/toyvm-package-XXXXXX)
installed=0
failure=""
cleanup() {
  local status=$?
  [ $installed -eq 1 ] && dpkg --purge toyvm >/dev/null 2>&1
  rm -rf "$work"
  [ $status -ne 0 ] && [ -z "$failure" ] && failure="exit $status"
  if [ -n "$junit" ]; then
    local body=""
    [ -n "$failure" ] && body="<failure message=\"$(printf '%s' "$failure" | sed 's/&/\&amp;/g; s/</\&lt;/g; s/"/\&quot;/g')\"/>"
    printf '<?xml version="1.0"?>\n<testsuite name="package" tests="1"><testcase classname="package" name="the Debian package builds, installs, verifies and purges">%s</testcase></testsuite>\n' \
      "$body" >"$junit"
  fi
}
trap cleanup EXIT
fail() { failure="$*"; echo "package: $*" >&2; exit 1; }

# The tracked files only: no build dirs, nothing a developer left lying around.
mkdir "$work/toyvm"
if git -C "$src" rev-parse --git-dir >/dev/null 2>&1; then
  git -C "$src" ls-files -z | (cd "$src" && xargs -0 cp --parents -t "$work/toyvm")
else
  tar -C "$src" --exclude='./build*' --exclude='./obj-*' -cf - . | tar -C "$work/toyvm" -xf -
fi

echo "package: building (dpkg-buildpackage -b)" >&2
(cd "$work/toyvm" && DEB_BUILD_OPTIONS="parallel=2 nocheck" dpkg-buildpackage -b -us -uc >"$work/build.log" 2>&1) ||
  { tail -40 "$work/build.log" >&2; fail "dpkg-buildpackage failed"; }
deb=$(ls "$work"/toyvm_*.deb)

# lintian's errors fail the test; its warnings are printed.
lintian --fail-on error "$deb" ||
  fail "lintian found errors in $deb"

dpkg -i "$deb" >/dev/null
installed=1
[ "$(command -v toyvm)" = /usr/bin/toyvm ] || fail "toyvm is not /usr/bin/toyvm"
version=$(/usr/bin/toyvm --version)
expected=$(dpkg-parsechangelog -l "$src/debian/changelog" -S Version)
[[ "$version" == *"${expected%%-*}"* ]] || fail "toyvm --version says '$version', the package is $expected"
echo "package: /usr/bin/toyvm --version: $version" >&2

units=(/lib/systemd/system/toyvm-compute.service /lib/systemd/system/toyvm-mdserver.service
       /lib/systemd/system/toyvm-scheduler.service)
for unit in "${units[@]}"; do [ -f "$unit" ] || fail "$unit is not installed"; done
# Offline: no systemd need run here. Any complaint about toyvm's units fails the test (it
# also reads the machine's other units, and may say what it thinks of them).
said=$(SYSTEMD_LOG_LEVEL=warning systemd-analyze verify --man=no "${units[@]}" 2>&1) ||
  fail "systemd-analyze verify: $said"
ours=$(grep -i toyvm <<<"$said" || true)
[ -z "$ours" ] || fail "systemd-analyze verify: $ours"
# Installed, not enabled or started: each needs the host's configuration first.
for unit in "${units[@]}"; do
  [ ! -e "/etc/systemd/system/multi-user.target.wants/$(basename "$unit")" ] || fail "$unit was enabled on install"
done

conf=/etc/toyvm/toyvm.toml
[ -f "$conf" ] || fail "$conf is not installed"
grep -q "^/etc/toyvm/toyvm.toml$" /var/lib/dpkg/info/toyvm.conffiles || fail "$conf is not a conffile"
# Every key uncommented is a valid configuration: the command gets past it to etcd, which
# is not there (4), rather than refusing the file (2).
sed -E 's/^#([a-z_]+ = )/\1/' "$conf" >"$work/uncommented.toml"
set +e
/usr/bin/toyvm --config "$work/uncommented.toml" --etcd http://127.0.0.1:9 show 00000000-0000-4000-8000-000000000000 \
  >"$work/show.out" 2>&1
code=$?
set -e
[ $code -eq 4 ] || fail "the configuration uncommented: exit $code, not 4: $(cat "$work/show.out")"

dpkg --purge toyvm >/dev/null
installed=0
[ ! -e /usr/bin/toyvm ] && [ ! -e /etc/toyvm/toyvm.toml ] || fail "purging left files behind"
echo "package: built, lintian clean of errors, installed, verified and purged" >&2
