#!/bin/sh
# mmdebstrap customize hook: $1 is the root of the new guest filesystem.
# Runs on the build host at image build time only.
set -eu
root="$1"
here="$(dirname "$0")"

install -m 0644 "$here/files/99-testbed.cfg" "$root/etc/cloud/cloud.cfg.d/99-testbed.cfg"
install -m 0644 "$here/files/cloud.cfg" "$root/etc/cloud/cloud.cfg"
rm -f "$root/etc/cloud/cloud.cfg.d/README"

# A small initrd: the build host's static busybox, the virtio modules the root disk needs
# (with their dependencies, in load order) and files/init, which mounts the root and
# switches to systemd. It replaces initramfs-tools' image: that one starts its own udev
# and runs its scripts, about as long again as the kernel itself under TCG.
busybox="$(command -v busybox)"
# ldd fails on a static binary ("not a dynamic executable"); libc-bin has it on every host.
if [ -z "$busybox" ] || ldd "$busybox" >/dev/null 2>&1; then
  echo "customize: no static busybox on the build host (install busybox-static)" >&2; exit 1
fi
for kdir in "$root"/lib/modules/*; do
  kver="$(basename "$kdir")"
  ird="$(mktemp -d)"
  mkdir -p "$ird/bin" "$ird/dev" "$ird/proc" "$ird/root" "$ird/modules"
  cp "$busybox" "$ird/bin/busybox"
  install -m 0755 "$here/files/init" "$ird/init"
  # isofs: the seed disk's filesystem. Loaded here by busybox's insmod, not at the seed's
  # mount, where the kernel starts modprobe (a process start under TCG, about a second,
  # on the way to cloud-init's local stage).
  chroot "$root" modprobe -S "$kver" --show-depends -a virtio_pci virtio_blk isofs \
    | awk '$1 == "insmod" && !seen[$2]++ { print $2 }' > "$ird/order.paths"
  [ -s "$ird/order.paths" ] || { echo "customize: no virtio or isofs modules found for $kver" >&2; exit 1; }
  while read -r ko; do
    cp "$root$ko" "$ird/modules/"
    basename "$ko" >> "$ird/modules/order"
  done < "$ird/order.paths"
  rm "$ird/order.paths"
  (cd "$ird" && find . | sort | cpio --quiet -o -H newc -R 0:0) | gzip -1 > "$root/boot/initrd.img-$kver"
  rm -rf "$ird"
done

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
# What else systemd-analyze blame / critical-chain showed on the way to the guest agent
# and cloud-init final (docs/performance.md): kernel filesystems nobody mounts, modules
# nobody loads, utmp and login bookkeeping for a guest nobody logs in to, the random seed
# file (virtio-rng feeds the pool and the testbed mixes host randomness in after a
# restore), sysusers (users were made at build time), and the journal's flush to disk
# (there is no journal: see below).
for u in systemd-update-utmp.service systemd-update-utmp-runlevel.service \
         systemd-user-sessions.service systemd-random-seed.service systemd-sysusers.service \
         systemd-journal-flush.service kmod-static-nodes.service \
         modprobe@fuse.service modprobe@configfs.service modprobe@dm_mod.service \
         modprobe@loop.service modprobe@drm.service \
         sys-kernel-debug.mount sys-kernel-tracing.mount sys-kernel-config.mount \
         sys-fs-fuse-connections.mount dev-hugepages.mount dev-mqueue.mount \
         systemd-ask-password-console.path systemd-ask-password-wall.path \
         systemd-initctl.socket systemd-fsckd.socket; do
  chroot "$root" systemctl mask "$u" >/dev/null 2>&1 || true
done
# cloud-init's network stage: the seed's meta-data says dsmode: local, so the local stage
# applies everything (hostname, write_files) and the network stage would only start
# Python (10-30 s under TCG) to log "datasource in local mode" and exit.
chroot "$root" systemctl mask cloud-init.service >/dev/null 2>&1 || true
# cloud-init's local and final stages in one Python process (files/cloud-init-boot): the
# final stage's own process spent seconds under TCG starting Python and importing
# cloud-init again. cloud-init-local.service runs the process; cloud-final.service keeps
# its place after multi-user.target and asks that process for the stage (files/cloud-final-go).
install -d "$root/usr/local/lib/testbed"
install -m 0755 "$here/files/cloud-init-boot" "$here/files/cloud-final-go" "$root/usr/local/lib/testbed/"
for u in cloud-init-local cloud-final systemd-remount-fs systemd-udev-trigger systemd-udevd; do
  mkdir -p "$root/etc/systemd/system/$u.service.d"
done
install -m 0644 "$here/files/cloud-init-local.conf" "$root/etc/systemd/system/cloud-init-local.service.d/10-testbed.conf"
# The clock set by the host after a restore through a FIFO, without a process started per
# restore (files/testbed-clock): the socket unit is enabled, the service starts on the
# first write (the testbed makes one before the guest's snapshot is saved).
install -m 0755 "$here/files/testbed-clock" "$root/usr/local/lib/testbed/"
install -m 0644 "$here/files/testbed-clock.socket" "$here/files/testbed-clock.service" "$root/etc/systemd/system/"
chroot "$root" systemctl enable testbed-clock.socket >/dev/null
# The seed disk mounted where NoCloud reads its seed folder (files/var-lib-cloud-seed-nocloud.mount).
install -m 0644 "$here/files/var-lib-cloud-seed-nocloud.mount" "$root/etc/systemd/system/"
# udevd without its sandbox (files/sandbox-off.conf).
install -m 0644 "$here/files/sandbox-off.conf" "$root/etc/systemd/system/systemd-udevd.service.d/10-testbed.conf"
install -m 0644 "$here/files/cloud-final.conf" "$root/etc/systemd/system/cloud-final.service.d/10-testbed.conf"
# No remount of a root the initrd mounted read-write with fstab's options already.
install -m 0644 "$here/files/remount-fs.conf" "$root/etc/systemd/system/systemd-remount-fs.service.d/10-testbed.conf"
# udev's coldplug for the subsystems a guest uses only (files/udev-trigger.conf).
install -m 0644 "$here/files/udev-trigger.conf" "$root/etc/systemd/system/systemd-udev-trigger.service.d/10-testbed.conf"
# No journald: its start was the second-largest unit of a cold boot under TCG (4.8 s of the
# one vCPU while cloud-init started, docs/performance.md), and nothing the testbed measures
# or reads needs a journal. systemd's own messages go to the kernel's log (dmesg); cloud-init's
# output goes to the console (files/cloud-init-local.conf), where the boot log is; its log
# file is /var/log/cloud-init.log as before. What services print goes to the console too
# (system.conf.d: the default TTYPath is /dev/console), which the testbed keeps per guest
# beside the run; `systemctl status` shows their state. The static /dev nodes of
# tmpfiles-setup-dev are for modules kmod-static-nodes (masked above) would list.
mkdir -p "$root/etc/systemd/system.conf.d"
printf '[Manager]\nDefaultStandardOutput=tty\nDefaultStandardError=tty\n' > "$root/etc/systemd/system.conf.d/10-testbed.conf"
for u in systemd-journald.service systemd-journald.socket systemd-journald-dev-log.socket \
         systemd-journald-audit.socket systemd-journal-catalog-update.service \
         systemd-tmpfiles-setup-dev.service; do
  chroot "$root" systemctl mask "$u" >/dev/null 2>&1 || true
done

# systemd-modules-load: the image lists no modules to load (modules.conf is all comments),
# yet the unit starts because the file exists.
chroot "$root" systemctl mask systemd-modules-load.service >/dev/null 2>&1 || true
# udev rules for hardware a testbed guest has not got (input, sound, cameras, seats, tape,
# device mapper, btrfs, Azure disks) and the persistent-storage symlinks nothing here
# uses (fstab names /dev/vda; cloud-init finds its seed with blkid). udev runs every
# rule file for every device at coldplug, one vCPU shared with the rest of the boot. Kept:
# the defaults, virtio-ports names (the guest agent's channel), driver autoloading
# (hot-plugged NICs), network naming and systemd's device tagging.
mkdir -p "$root/etc/udev/rules.d"
for r in 50-firmware 55-dm 60-autosuspend 60-cdrom_id 60-drm 60-evdev 60-fido-id 60-infiniband \
         60-input-id 60-persistent-alsa 60-persistent-input 60-persistent-storage-dm \
         60-persistent-storage-tape 60-persistent-storage 60-persistent-v4l 60-sensor 60-serial \
         64-btrfs 66-azure-ephemeral 70-camera 70-joystick 70-memory 70-mouse 70-power-switch \
         70-touchpad 70-uaccess 71-seat 73-seat-late 75-probe_mtd 78-sound-card 85-hwclock \
         95-dm-notify 96-e2scrub; do
  ln -sf /dev/null "$root/etc/udev/rules.d/$r.rules"
done

# Modules udev's coldplug loads for devices the guest does not use: kvm (1.2 MiB, for
# nested guests: none here), input and serial-mouse drivers, CPU frequency drivers (TCG has
# no frequency to set). Loading a module under TCG costs a second or more of the one vCPU
# while cloud-init starts. Only autoloading is stopped; modprobe by name still works.
printf 'blacklist %s\n' kvm kvm_amd kvm_intel irqbypass evdev serio_raw psmouse joydev pcspkr \
  powernow_k8 acpi_cpufreq > "$root/etc/modprobe.d/testbed-unused.conf"

# Generators run before any unit starts, each one a process under TCG. Kept: fstab (the
# root remount). No getty on the serial console either: nobody logs in; the console is the
# boot log.
mkdir -p "$root/etc/systemd/system-generators"
for g in systemd-gpt-auto-generator systemd-cryptsetup-generator systemd-integritysetup-generator \
         systemd-veritysetup-generator systemd-hibernate-resume-generator \
         systemd-system-update-generator systemd-sysv-generator systemd-rc-local-generator \
         systemd-run-generator systemd-debug-generator systemd-getty-generator; do
  ln -sf /dev/null "$root/etc/systemd/system-generators/$g"
done
# cloud-init's generator is a shell script that starts three more processes
# (systemd-detect-virt, mkdir, ln) while every unit waits for generators, to find on every
# boot what the image fixes at build time: cloud-init is enabled (the recipe's kernel
# command line says cloud-init=enabled, which `cloud-init status` reads) and cloud-init.target
# is wanted by multi-user.target, as the generator would link it. ds-identify, which the
# generator would run, probes for every datasource cloud-init knows; the image's
# datasource_list is NoCloud only. It stays diverted so that nothing runs it.
ln -sf /dev/null "$root/etc/systemd/system-generators/cloud-init-generator"
mkdir -p "$root/etc/systemd/system/multi-user.target.wants"
ln -sf /lib/systemd/system/cloud-init.target "$root/etc/systemd/system/multi-user.target.wants/cloud-init.target"
chroot "$root" dpkg-divert --quiet --local --rename --add /usr/lib/cloud-init/ds-identify

# Keep the image small.
rm -rf "$root/var/cache/apt/archives/"*.deb "$root/var/lib/apt/lists/"* "$root/usr/share/doc" "$root/usr/share/man"
