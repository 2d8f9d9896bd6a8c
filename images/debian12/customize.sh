#!/bin/sh
# mmdebstrap customize hook: $1 is the root of the new guest filesystem.
# Runs on the build host at image build time only.
set -eu
root="$1"
here="$(dirname "$0")"

install -m 0644 "$here/files/99-testbed.cfg" "$root/etc/cloud/cloud.cfg.d/99-testbed.cfg"

# A small initrd: only the virtio modules needed to find the root disk.
sed -i 's/^MODULES=.*/MODULES=list/' "$root/etc/initramfs-tools/initramfs.conf"
cat "$here/files/initramfs-modules" >> "$root/etc/initramfs-tools/modules"
chroot "$root" update-initramfs -u -k all

# No passwords anywhere: root stays locked, there is no login user and no sshd.
chroot "$root" passwd -l root
echo "/dev/vda / ext4 defaults,noatime 0 1" > "$root/etc/fstab"
echo tb-guest > "$root/etc/hostname"

# Units that cost boot time and do nothing for a measurement guest.
for u in apt-daily.timer apt-daily-upgrade.timer man-db.timer e2scrub_all.timer \
         e2scrub_reap.service fstrim.timer dpkg-db-backup.timer logrotate.timer \
         systemd-timesyncd.service systemd-networkd-wait-online.service \
         sysstat.service sysstat-collect.timer sysstat-summary.timer \
         getty@tty1.service systemd-pstore.service netperf.service \
         cloud-init-hotplugd.socket getty-static.service systemd-binfmt.service \
         cloud-config.service; do
  chroot "$root" systemctl mask "$u" >/dev/null 2>&1 || true
done
# Keep the image small.
rm -rf "$root/var/cache/apt/archives/"*.deb "$root/var/lib/apt/lists/"* "$root/usr/share/doc" "$root/usr/share/man"
