#!/usr/bin/env bash
# CI stage (issue 37 item 8): the engine's machine suite on a pure cgroup v2
# host, as an ordinary user in a systemd-style delegated group, with the
# pids, memory and cpu controllers this CI machine keeps on cgroup v1.
#
# Boots a small KVM guest (Debian's qemu-system-x86 and linux-image-amd64)
# whose root is this machine's root shared read-only over virtio-9p, with
# cgroup_no_v1=all on its command line; our own initramfs (busybox,
# guest-v2/initramfs-init) mounts it and hands over to guest-v2/init.sh,
# which mounts cgroup2, delegates a group to `sandbox-ci` as systemd's
# Delegate=yes does, runs the prebuilt test binaries (built here, in the
# same target/, by `cargo test --no-run`) and writes its verdict to
# target/guest-v2/ (the one writable share), then powers off.
#
# Fails when /dev/kvm is missing (CI machines have it: a stage that cannot
# run is a failure, not a skip), when the guest does not boot or report,
# and when any test fails. Prints the model the engine exercised.
set -euo pipefail
cd "$(dirname "$0")/.."
checkout=$PWD
stage_started=$(date +%s.%N)
say() { echo "guest-v2: $*" >&2; }
export CARGO_INCREMENTAL=0

if [ ! -c /dev/kvm ] || [ ! -w /dev/kvm ]; then
  say "FAILED: /dev/kvm is missing or not writable here, so the cgroup v2 guest cannot boot"
  say "and pids.max, memory.max and cpu.max were NOT tested. Run this stage on a machine with KVM."
  exit 1
fi

# What the guest needs, on this machine (the guest runs this machine's tree).
kernel=$(ls /boot/vmlinuz-* 2>/dev/null | sort -V | tail -1 || true)
if ! command -v qemu-system-x86_64 >/dev/null || [ -z "$kernel" ] \
  || [ ! -x /bin/busybox ] || ! command -v cpio >/dev/null || ! command -v jq >/dev/null; then
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
    qemu-system-x86 linux-image-amd64 busybox-static cpio jq
  kernel=$(ls /boot/vmlinuz-* | sort -V | tail -1)
fi
if ! busybox --list 2>/dev/null | grep -qx switch_root || ! ldd /bin/busybox 2>&1 | grep -q 'not a dynamic'; then
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends busybox-static
fi
version=${kernel#/boot/vmlinuz-}

# The accelerator. KVM through VMX or SVM (kvm_intel, kvm_amd) runs Debian's
# kernel as it is. These CI machines are themselves guests whose /dev/kvm is
# PVM (kvm_pvm, pagetable-based nested virtualisation), which runs only a
# kernel built as a PVM guest: Debian's stops right after the boot loader
# there. Then the guest runs under QEMU's TCG emulation, said loudly here,
# and slower (see the stage time below).
if [ -d /sys/module/kvm_intel ] || [ -d /sys/module/kvm_amd ]; then
  accel=(-enable-kvm -cpu host)
  accel_said="KVM"
else
  accel=(-accel tcg,thread=multi,tb-size=256 -cpu max)
  accel_said="TCG emulation (NOT KVM: this machine's /dev/kvm is $(ls -d /sys/module/kvm_pvm >/dev/null 2>&1 && echo 'PVM, which cannot run a stock kernel' || echo 'without kvm_intel or kvm_amd'))"
  say "WARNING: /dev/kvm here cannot run Debian's kernel; the guest runs under $accel_said"
fi
id sandbox-ci >/dev/null 2>&1 || useradd -m sandbox-ci

# The test binaries, from the same target/ as the test stage (built there
# already, so this only lists them), and the engine binary they start.
built=$(cargo test -p sandbox-engine --no-run --message-format=json \
  --test machine --test machine_cgroup_v2_limits --test machine_cgroup_v2)
listed() { jq -r "select(.reason == \"compiler-artifact\" and .executable != null and $1) | .executable" <<<"$built"; }
results=$checkout/target/guest-v2
rm -rf "$results" && mkdir -p "$results"
{
  echo "engine _ $(listed '.target.name == "createos-local"')"
  # The in-process suites (the test binary is the engine) run as the user
  # in a delegated scope of their own; a suite that delegates groups itself
  # and starts the engine binary as the user runs as root. (The engine as
  # the user without a group it may write, tests/machine_unprivileged.rs,
  # runs on the CI machine itself.)
  echo "user machine $(listed '.target.name == "machine" and .profile.test')"
  echo "user machine_cgroup_v2_limits $(listed '.target.name == "machine_cgroup_v2_limits" and .profile.test')"
  echo "root machine_cgroup_v2 $(listed '.target.name == "machine_cgroup_v2" and .profile.test')"
} >"$results/tests.list"
if awk 'NF != 3 { bad = 1 } END { exit !bad }' "$results/tests.list"; then
  say "FAILED: a test binary was not found in target/ (cargo test --no-run):"
  cat "$results/tests.list" >&2
  exit 1
fi

# The initramfs: a static busybox, the modules that reach the host's tree
# (with their dependencies, in load order) and our /init.
initramfs=$(mktemp -d)
trap 'rm -rf "$initramfs"' EXIT
mkdir -p "$initramfs"/{bin,proc,sys,dev,modules}
cp /bin/busybox "$initramfs/bin/"
for applet in sh mount umount insmod mkdir cat echo sleep switch_root; do
  ln -s busybox "$initramfs/bin/$applet"
done
cp .ci/guest-v2/initramfs-init "$initramfs/init"
order=()
add_module() {
  local m=$1 dep
  for dep in $(modinfo -k "$version" -F depends "$m" | tr ',' ' '); do add_module "$dep"; done
  [[ " ${order[*]} " == *" $m "* ]] && return
  order+=("$m")
  local file
  file=$(modinfo -k "$version" -n "$m")
  case $file in
    *.ko) cp "$file" "$initramfs/modules/$m.ko" ;;
    *.ko.xz) xz -dc "$file" >"$initramfs/modules/$m.ko" ;;
    *.ko.zst) zstd -qdc "$file" >"$initramfs/modules/$m.ko" ;;
    *) say "FAILED: module $m of $version is built in or missing ($file)"; exit 1 ;;
  esac
}
for m in virtio_pci 9pnet_virtio 9p; do add_module "$m"; done
printf '%s\n' "${order[@]}" >"$initramfs/modules.order"
(cd "$initramfs" && find . | cpio --quiet -o -H newc | gzip -1) >"$results/initramfs.gz"

say "booting $kernel ($accel_said, 2 vCPUs, 2 GiB) with a pure cgroup v2 hierarchy; the suites:"
sed 's/^/guest-v2:   /' "$results/tests.list" >&2
boot_started=$(date +%s.%N)
# The whole guest run is bounded: GUEST_V2_TIMEOUT seconds, 600 unless set
# (measured here under TCG: about 290 s, boot included).
set +e
timeout "${GUEST_V2_TIMEOUT:-600}" qemu-system-x86_64 "${accel[@]}" -smp 2 -m 2048 \
  -nodefaults -no-reboot -display none -serial stdio \
  -kernel "$kernel" -initrd "$results/initramfs.gz" \
  -append "console=ttyS0 quiet loglevel=3 panic=1 cgroup_no_v1=all systemd.unified_cgroup_hierarchy=1 \
GUEST_INIT=$checkout/.ci/guest-v2/init.sh GUEST_RESULTS=$results GUEST_CHECKOUT=$checkout" \
  -virtfs local,path=/,mount_tag=hostroot,security_model=none,readonly=on,multidevs=remap \
  -virtfs "local,path=$results,mount_tag=results,security_model=none,multidevs=remap" \
  </dev/null
qemu_rc=$?
set -e
elapsed() { awk -v a="$1" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }'; }
say "the guest ran $(elapsed "$boot_started") s (qemu exit $qemu_rc); stage $(elapsed "$stage_started") s"
if [ "$qemu_rc" = 124 ]; then
  say "FAILED: the guest did not power off within ${GUEST_V2_TIMEOUT:-600} s"
  exit 1
fi
if [ ! -s "$results/status" ]; then
  say "FAILED: the guest never reported a verdict (it did not boot, or its init broke: see the console above)"
  exit 1
fi
say "model the engine exercised in the guest: $(cat "$results/model" 2>/dev/null || echo unknown)"
verdict=$(cat "$results/status")
if [ "$verdict" != ok ]; then
  say "FAILED: $verdict (logs in $results)"
  exit 1
fi
say "passed: the machine suite and the cgroup v2 limits on a pure cgroup v2 guest"
