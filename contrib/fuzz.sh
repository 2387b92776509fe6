#!/usr/bin/env bash
# Fuzzing with libFuzzer (clang from Debian) under AddressSanitizer and UBSan: the query
# parser, the decoding of every etcd record (and the metadata routes), and config loading.
#   usage: contrib/fuzz.sh [SECONDS_PER_TARGET]   (default 60)
# Corpora live in build-fuzz/corpus/<target>; a crash leaves its input in build-fuzz/.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
seconds=${1:-60}
out=$root/build-fuzz
"$root/contrib/install-deps.sh" clang-14 libclang-rt-14-dev
mkdir -p "$out"

# Only the pure parts are fuzzed; they build without the rest of toyvm.
sources=(model/query.cpp model/records.cpp model/metadata.cpp model/keys.cpp model/uuid.cpp
         model/groups.cpp model/candidates.cpp model/inventory.cpp core/config.cpp core/error.cpp)
flags=(-std=c++20 -O1 -g -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined
       -I"$root/toyvm" -DBOOST_JSON_NO_LIB -DSPDLOG_FMT_EXTERNAL
       -DTOML_HEADER_ONLY=0 -DTOML_SHARED_LIB=1)  # toml++ as the real build uses it: Debian's library
libs=(-lboost_json -lsimdjson -ltomlplusplus -lfmt)

status=0
for target in query records config; do
  binary=$out/fuzz_$target
  if [ ! -x "$binary" ] || [ -n "$(find "$root/toyvm" "$root/tests/fuzz" -newer "$binary" -name '*.[ch]pp' | head -1)" ]; then
    clang++-14 "${flags[@]}" "$root/tests/fuzz/fuzz_$target.cpp" "${sources[@]/#/$root/toyvm/}" "${libs[@]}" -o "$binary"
  fi
  mkdir -p "$out/corpus/$target"
  echo "fuzz_$target: $seconds s"
  # The inputs of crashes found before seed every run (libFuzzer adds new finds to the first dir).
  if ! (cd "$out" && "$binary" -max_total_time="$seconds" -print_final_stats=1 "$out/corpus/$target" "$root/tests/fuzz/crashes" \
        > "$out/fuzz_$target.log" 2>&1); then
    echo "fuzz_$target: FAILED, see $out/fuzz_$target.log"
    status=1
  fi
  grep -E "stat::number_of_executed_units|stat::peak_rss_mb" "$out/fuzz_$target.log" | sed "s/^/  /"
done
exit $status
