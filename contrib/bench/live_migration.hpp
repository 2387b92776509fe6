#pragma once
// toyvm-bench live-migration: a tiny guest moved back and forth between two libvirt daemons
// through toyvm's backend, as two agents would move it; the time of each move and the guest's
// downtime as QEMU reports it.

#include <string>

struct LiveMigrationOptions {
  std::string from = "qemu:///system";
  std::string to;         // the second daemon (contrib/second-libvirtd.sh prints it)
  std::string back;       // the first daemon as the second reaches it (its second line); empty: `from`
  std::string image_dir;  // a kernel-boot guest: kernel, initrd, cmdline, disk.raw (contrib/tiny-guest.sh)
  std::string dir;        // the two instance dirs go under it
  int rounds = 6;
  bool virsh = false;     // each move through `virsh migrate` with the same flags and XML: the floor
};

int run_live_migration(const LiveMigrationOptions& o);
