#!/usr/bin/env bash
# A Debian bookworm base image with Python 3.11 and venv, made here from Debian's packages (no
# image registry needed): debootstrap --variant=minbase, apt-get install python3 python3-venv
# in a chroot, the host's CA bundle (pip inside builds reaches the index like the host's pip),
# then `docker import`. Usage: base-image.sh IMAGE_TAG  (DOCKER_HOST names the daemon).
set -euo pipefail
tag=${1:?usage: base-image.sh IMAGE_TAG}
mirror=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
root=$(mktemp -d /var/tmp/dart-base.XXXXXX)
cleanup() {
  for m in proc sys dev; do umount -l "$root/$m" 2>/dev/null || true; done
  rm -rf --one-file-system "$root"
}
trap cleanup EXIT

debootstrap --variant=minbase bookworm "$root" "$mirror" > "$root.log" 2>&1 \
  || { tail -20 "$root.log"; echo "base-image: debootstrap failed (log above)" >&2; exit 1; }
rm -f "$root.log"
# The same suites as the host (updates and security), so the packages match what it runs.
cat > "$root/etc/apt/sources.list" <<SRC
deb $mirror bookworm main
deb $mirror bookworm-updates main
deb http://deb.debian.org/debian-security bookworm-security main
SRC
cp /etc/resolv.conf "$root/etc/resolv.conf"
mount -t proc proc "$root/proc"
chroot "$root" /bin/sh -c 'apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q \
  --no-install-recommends python3 python3-venv ca-certificates && apt-get clean && rm -rf /var/lib/apt/lists/*' \
  > "$root/tmp/apt.log" 2>&1 || { tail -20 "$root/tmp/apt.log"; echo "base-image: apt-get failed" >&2; exit 1; }
umount -l "$root/proc"
# The host's CA bundle: pip in a build verifies the index with the same roots as the host's pip.
cp /etc/ssl/certs/ca-certificates.crt "$root/etc/ssl/certs/ca-certificates.crt"
rm -rf "$root/tmp/"* "$root/var/cache/apt/"*.bin "$root/etc/resolv.conf"
tar -C "$root" -c . | docker import \
  -c 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin LANG=C.UTF-8' \
  -c 'CMD ["/bin/bash"]' - "$tag" > /dev/null
echo "base-image: $tag ($(docker image inspect -f '{{.Size}}' "$tag" | awk '{printf "%.0f MB", $1/1e6}'))"
