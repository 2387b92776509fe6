#!/usr/bin/env bash
# Builds a tiny direct-kernel-boot guest image from Debian's packages, no other downloads:
# the kernel of linux-image-amd64, the virtio-net and e1000 drivers from the same package
# (so either NIC model works) and virtio-blk (its disk is /dev/vda), and an initramfs
# of busybox-static whose init prints a marker on the serial console, asks DHCP for an
# address, reads its metadata from the metadata service, and runs user data that is a script.
#   usage: contrib/tiny-guest.sh OUTDIR      (writes OUTDIR/{kernel,initrd,cmdline,disk.raw})
# Idempotent: an OUTDIR built by this version of the script is left alone.
set -euo pipefail
out=${1:?usage: tiny-guest.sh OUTDIR}
recipe=$(sha256sum "$0" | cut -d' ' -f1)
if [ "$(cat "$out/.recipe" 2>/dev/null)" = "$recipe" ]; then
  exit 0
fi
mkdir -p "$out"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
chmod 0777 "$work"  # apt-get download drops to the _apt user

kernel_pkg=$(apt-cache depends linux-image-amd64 2>/dev/null | awk '/Depends: linux-image-[0-9]/ {print $2; exit}' || true)
if [ -z "$kernel_pkg" ]; then  # no package lists yet on this machine
  apt-get update -qq
  kernel_pkg=$(apt-cache depends linux-image-amd64 | awk '/Depends: linux-image-[0-9]/ {print $2; exit}')
fi
(cd "$work" && apt-get download -qq "$kernel_pkg" >/dev/null)
dpkg-deb -x "$work"/linux-image-*.deb "$work/pkg"
version=${kernel_pkg#linux-image-}

root="$work/root"
mkdir -p "$root"/{bin,dev,proc,sys,etc,tmp,run,lib/modules}
cp /bin/busybox "$root/bin/busybox"
# In load order: each after the modules it depends on.
modules="virtio_ring virtio virtio_pci_modern_dev virtio_pci_legacy_dev virtio_pci failover net_failover virtio_net
virtio_blk e1000 evdev button"
for module in $modules; do
  found=$(find "$work/pkg/lib/modules/$version" -name "$module.ko*" | head -1)
  case "$found" in
    *.xz) xz -dc "$found" > "$root/lib/modules/$module.ko" ;;
    '') echo "tiny-guest: $kernel_pkg has no module $module" >&2; exit 1 ;;
    *) cp "$found" "$root/lib/modules/$module.ko" ;;
  esac
done
echo $modules > "$root/lib/modules/order"

cat > "$root/init" <<'INIT'
#!/bin/busybox sh
/bin/busybox --install -s /bin
export PATH=/bin
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev 2>/dev/null
echo "toyvm-guest: booted $(uname -r)"
for module in $(cat /lib/modules/order); do insmod /lib/modules/$module.ko; done
# The host's shutdown request (ACPI power button) powers the guest off.
mkdir -p /etc/acpi/PWRF
printf '#!/bin/sh\necho "toyvm-guest: power button"\npoweroff -f\n' > /etc/acpi/PWRF/00000080
chmod +x /etc/acpi/PWRF/00000080
acpid -d -c /etc/acpi &  # -d: in the foreground, logging to the console
ip link set lo up
ip link set eth0 up
# TCG on a busy host can be slow to answer: ask again rather than give up.
for attempt in 1 2 3 4 5; do
  udhcpc -i eth0 -s /bin/dhcp-event -t 10 -T 3 -n -q && break
done
[ -s /run/address ] &&
  echo "toyvm-guest: address $(cat /run/address) at uptime $(cut -d' ' -f1 /proc/uptime)"
# The metadata service answers at 169.254.169.254 through the host's bridge (busybox's
# static wget crashes, so plain HTTP/1.0 through nc). It learns this guest's address from
# the agent a moment after DHCP, so the guest asks again for a while, as cloud-init does.
metadata() {
  printf 'GET %s HTTP/1.0\r\nHost: 169.254.169.254\r\n\r\n' "$1" | nc -w 5 169.254.169.254 80 > /run/response 2>/dev/null
  head -1 /run/response | grep -q ' 200 ' && sed '1,/^\r*$/d' /run/response
}
for attempt in $(seq 1 30); do
  id=$(metadata /latest/meta-data/instance-id) && break
  sleep 1
done
if [ -n "$id" ]; then
  echo "toyvm-guest: instance-id $id"
  metadata /latest/user-data > /run/user-data
  echo "toyvm-guest: user-data $(head -c 200 /run/user-data)"
  # User data that is a script is run, as cloud-init does.
  if [ "$(head -c 2 /run/user-data)" = '#!' ]; then
    sh /run/user-data 2>&1 | sed 's/^/toyvm-guest: /'
  fi
else
  echo "toyvm-guest: no metadata service"
fi
# A heartbeat on the console: a guest moved while it runs goes on counting, its uptime too.
tick=0
while true; do
  tick=$((tick + 1))
  echo "toyvm-guest: tick $tick uptime $(cut -d' ' -f1 /proc/uptime)"
  sleep 5
done
INIT
cat > "$root/bin/dhcp-event" <<'DHCP'
#!/bin/busybox sh
case "$1" in
  bound|renew)
    ip addr add "$ip/${mask:-24}" dev "$interface"
    [ -n "$router" ] && ip route add default via ${router%% *} dev "$interface"
    ip route add 169.254.169.254/32 dev "$interface" 2>/dev/null
    echo "$ip" > /run/address ;;
esac
DHCP
chmod +x "$root/init" "$root/bin/dhcp-event"

(cd "$root" && find . | busybox cpio -o -H newc 2>/dev/null | gzip -1) > "$work/initrd"
cp "$work/pkg/boot/vmlinuz-$version" "$work/kernel"
echo "console=ttyS0 quiet panic=-1" > "$work/cmdline"
# A base disk with recognisable content: the instance's overlay sits on top of it.
head -c $((16 * 1024 * 1024)) /dev/urandom > "$work/disk.raw"
chmod 0644 "$work"/{kernel,initrd,cmdline,disk.raw}
mv "$work"/{kernel,initrd,cmdline,disk.raw} "$out/"
echo "$recipe" > "$out/.recipe"
echo "tiny-guest: $out (kernel $version)"
