#!/usr/bin/env bash
# Builds a Debian 12 cloud guest from Debian's packages with debootstrap: Debian's own
# cloud-init, openssh-server, the cloud kernel, ifupdown and a DHCP client, as a toyvm image
# directory for direct kernel boot (kernel, initrd, cmdline, disk.raw). The guest has no
# password and no key of its own: cloud-init gives the default user "debian" the instance's
# keys, from the metadata service or a config drive.
#   usage: contrib/debian-image.sh [OUTDIR]   (default /var/cache/toyvm/debian-12; as root)
# Idempotent: an OUTDIR built by this version of the script is left alone.
set -euo pipefail
out=${1:-/var/cache/toyvm/debian-12}
recipe=$(sha256sum "$0" | cut -d' ' -f1)
if [ "$(cat "$out/.recipe" 2>/dev/null)" = "$recipe" ]; then
  exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
  echo "debian-image: debootstrap needs root" >&2
  exit 1
fi
mirror=${TOYVM_DEBIAN_MIRROR:-$(awk '/^URIs:/ {print $2; exit} /^deb / {print $2; exit}' \
  /etc/apt/sources.list.d/debian.sources /etc/apt/sources.list 2>/dev/null || true)}
mirror=${mirror:-http://deb.debian.org/debian}

mkdir -p "$out"
work=$(mktemp -d "${out%/}.build.XXXXXX")
trap 'rm -rf "$work"' EXIT
root="$work/root"

# minbase and what a cloud guest needs on top of it. python3-cffi-backend: debootstrap does
# not resolve the virtual package python3-cryptography depends on.
packages=(
  systemd-sysv udev dbus kmod iproute2 netbase ifupdown isc-dhcp-client
  linux-image-cloud-amd64 initramfs-tools
  cloud-init python3-cffi-backend openssh-server sudo locales
)
echo "debian-image: debootstrap bookworm from $mirror (a few minutes)" >&2
# The archive's signature is checked, never skipped for want of a keyring.
debootstrap --variant=minbase --keyring=/usr/share/keyrings/debian-archive-keyring.gpg \
  --include="$(IFS=,; echo "${packages[*]}")" bookworm "$root" "$mirror" \
  > "$work/debootstrap.log" 2>&1 || { tail -20 "$work/debootstrap.log" >&2; exit 1; }

echo 'debian' > "$root/etc/hostname"
echo '/dev/vda / ext4 rw,errors=remount-ro 0 1' > "$root/etc/fstab"
# cloud-init's network configuration lands in interfaces.d (its eni renderer).
cat > "$root/etc/network/interfaces" <<'EOF'
source /etc/network/interfaces.d/*

auto lo
iface lo inet loopback
EOF
# The locale cloud-init sets by default, made here once: a guest does not spend its first
# boot generating it.
echo 'en_US.UTF-8 UTF-8' > "$root/etc/locale.gen"
chroot "$root" locale-gen >/dev/null
echo 'LANG=en_US.UTF-8' > "$root/etc/default/locale"
# Each guest makes its own machine id and ssh host keys (cloud-init) at first boot.
: > "$root/etc/machine-id"
rm -f "$root"/etc/ssh/ssh_host_*
rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/*

kernel=$(ls "$root"/boot/vmlinuz-* | head -1)
version=${kernel##*/vmlinuz-}
cp "$kernel" "$work/kernel"
cp "$root/boot/initrd.img-$version" "$work/initrd"
echo 'root=/dev/vda rw console=ttyS0' > "$work/cmdline"
# An ext4 root filesystem made from the directory, no loop device; cloud-init grows it to the
# instance's DISK_GB at first boot.
mkfs.ext4 -q -L root -d "$root" "$work/disk.raw" 2G >/dev/null
chmod 0644 "$work"/{kernel,initrd,cmdline,disk.raw}
rm -f "$out/.recipe"
mv -f "$work"/{kernel,initrd,cmdline,disk.raw} "$out/"
echo "$recipe" > "$out/.recipe"
echo "debian-image: $out (kernel $version)"
