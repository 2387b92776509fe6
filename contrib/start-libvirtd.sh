#!/usr/bin/env bash
# Starts virtlogd and libvirtd (Debian 12's monolithic daemon) unless qemu:///system already
# answers, and waits up to 60 s for it: the first connection waits while libvirtd probes QEMU.
# Used by the tests, the quick start and the benchmark.
set -euo pipefail
answers() { virsh -q -c qemu:///system uri >/dev/null 2>&1; }
answers && exit 0
# A daemon that already runs refuses to start twice (its pid file is locked): harmless.
virtlogd -d 2>/dev/null || true
libvirtd -d 2>/dev/null || true
for _ in $(seq 1 300); do
  answers && { echo "started libvirtd" >&2; exit 0; }
  sleep 0.2
done
echo "start-libvirtd: libvirtd does not answer on qemu:///system" >&2
exit 1
