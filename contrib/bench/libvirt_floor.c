// The memory floor of any libvirt agent: a process that only holds a libvirt connection.
// Prints "ready" once connected and keeps the connection until its stdin closes.
#include <libvirt/libvirt.h>

#include <stdio.h>
#include <unistd.h>

int main(int argc, char **argv) {
  if (argc != 2) {
    fputs("usage: libvirt-floor URI\n", stderr);
    return 2;
  }
  virConnectPtr conn = virConnectOpen(argv[1]);
  if (!conn) return 1;
  puts("ready");
  fflush(stdout);
  char buffer[64];
  while (read(0, buffer, sizeof buffer) > 0) {
  }
  virConnectClose(conn);
  return 0;
}
