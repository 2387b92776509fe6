#!/usr/bin/env bash
# Starts virtlogd and libvirtd (Debian 12's monolithic daemon) unless qemu:///system already
# answers, and waits up to 60 s for it: the first connection waits while libvirtd probes QEMU.
# Used by the tests, the quick start and the benchmark.
set -euo pipefail

# /dev/kvm as Debian's udev rule leaves it: root:kvm 0660, and QEMU runs as libvirt-qemu, a
# member of group kvm. Hosts without that rule (containers, VMs without udev) have it root-only:
# QEMU's capability probe still finds KVM, libvirtd's own check says its QEMU user cannot open
# it, so libvirtd takes its cached probe for outdated and probes QEMU again on every define and
# start (seconds each when idle, over a minute beside running guests).
if [ -c /dev/kvm ] && [ "$(id -u)" -eq 0 ] && getent group kvm >/dev/null &&
   ! runuser -u libvirt-qemu -- test -r /dev/kvm -a -w /dev/kvm 2>/dev/null; then
  chgrp kvm /dev/kvm && chmod g+rw /dev/kvm
fi

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
