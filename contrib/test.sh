#!/usr/bin/env bash
# Installs what is missing, builds, runs every test suite, and ends with one line
# "N passed, N failed" (test cases and their sections, counted from the JUnit reports).
#   usage: contrib/test.sh [meson test arguments, e.g. --suite unit]
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
build=${TOYVM_BUILD_DIR:-build}

"$root/contrib/install-deps.sh" || exit 1
if [ ! -f "$build/build.ninja" ]; then
  meson setup "$build" --wrap-mode=nodownload -Dtests=true >/dev/null || exit 1
fi
ninja -C "$build" -j2 || exit 1

reports="$build/test-reports"
rm -rf "$reports" && mkdir -p "$reports"
meson test -C "$build" --no-rebuild --num-processes 1 --print-errorlogs "$@"
meson_status=$?

/usr/bin/python3 - "$reports" "$meson_status" <<'PY'
import pathlib, sys, xml.etree.ElementTree as ET
reports, meson_status = pathlib.Path(sys.argv[1]), int(sys.argv[2])
passed = failed = 0
for report in sorted(reports.glob("*.xml")):
    try:
        cases = ET.parse(report).getroot().iter("testcase")
    except ET.ParseError:
        failed += 1  # a crashed test program leaves a truncated report
        print(f"FAILED {report.stem}: its report is truncated (the test program crashed)")
        continue
    for case in cases:
        problem = case.find("failure")
        if problem is None:
            problem = case.find("error")
        if problem is None:
            passed += 1
            continue
        failed += 1
        # Name what failed and why, so a log of this run alone explains it.
        print(f"FAILED {report.stem}: {case.get('classname', '')} {case.get('name')}")
        detail = (problem.get("message") or "") + "\n" + (problem.text or "")
        for line in detail.strip().splitlines()[:40]:
            print(f"    {line}")
if meson_status != 0 and failed == 0:
    failed = 1  # a suite failed without a report: count it
print(f"{passed} passed, {failed} failed")
sys.exit(1 if failed else 0)
PY
