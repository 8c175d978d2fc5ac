#!/bin/bash
# The guest's init (PID 1), run from the host's tree shared read-only over
# 9p (see ../guest-v2.sh). It makes the host kinds the machine suite needs
# on a pure cgroup v2 hierarchy, runs the prebuilt test binaries listed in
# $GUEST_RESULTS/tests.list and writes the verdict to $GUEST_RESULTS/status,
# then powers the guest off. It never returns: PID 1 exiting panics the
# kernel, which (panic=1, qemu -no-reboot) also ends the guest.
set -uo pipefail
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
results=$GUEST_RESULTS
say() { echo "guest-v2: $*" >&2; }
poweroff_now() { sync; echo o >/proc/sysrq-trigger; sleep 30 2>/dev/null; }
verdict() { echo "$1" >"$results/status"; say "verdict: $1"; poweroff_now; }
trap 'verdict "guest init failed at line $LINENO"' ERR
set -E

mount -t proc proc /proc
mount -t sysfs sysfs /sys
say "booted in $(cut -d' ' -f1 /proc/uptime) s (kernel $(uname -r), guest uptime)"
# Writable places on the read-only root: the tests' data directories
# (/tmp), runtime files, and the home directories the tests' users get.
# The checkout (with its target/ and the results share mounted in it) may
# live under one of them (a CI clone in /tmp): it is kept aside on /dev
# (writable) first and bound back on its path once the tmpfs is there.
checkout=$(cd "$(dirname "$GUEST_INIT")/../.." && pwd)
mkdir -p /dev/.checkout
mount --rbind "$checkout" /dev/.checkout
for dir in /tmp /var/tmp /run /root /home; do
  mount -t tmpfs -o mode=1777,size=768m tmpfs "$dir"
done
if [ ! -d "$checkout/.ci" ]; then
  mkdir -p "$checkout"
  mount --rbind /dev/.checkout "$checkout"
fi
chmod 700 /root
mkdir -p /dev/pts /dev/shm /dev/mqueue
mount -t devpts -o newinstance,ptmxmode=0666 devpts /dev/pts
mount -t tmpfs -o mode=1777 tmpfs /dev/shm
mount -t mqueue mqueue /dev/mqueue
ip link set lo up
hostname guest-v2

# A pure cgroup v2 hierarchy (cgroup_no_v1=all on the command line) with
# the pids, memory and cpu controllers handed down as systemd hands them
# to a user's manager: root's subtree_control, then user.slice and the
# user's slice; user@UID.service is delegated (Delegate=yes: the group
# and its cgroup.procs, cgroup.subtree_control and cgroup.threads belong
# to the user).
cg=/sys/fs/cgroup
mount -t cgroup2 -o nsdelegate cgroup2 "$cg"
if grep -q ' cgroup ' /proc/mounts; then
  say "a cgroup v1 hierarchy is mounted: this is not a pure cgroup v2 guest"
  verdict "not a pure cgroup v2 hierarchy"
fi
say "cgroup2 at $cg offers: $(cat $cg/cgroup.controllers)"
user=sandbox-ci
uid=$(id -u $user)
gid=$(id -g $user)
delegated=$cg/user.slice/user-$uid.slice/user@$uid.service
echo "+pids +memory +cpu" >"$cg/cgroup.subtree_control"
mkdir -p "$delegated"
echo "+pids +memory +cpu" >"$cg/user.slice/cgroup.subtree_control"
echo "+pids +memory +cpu" >"$cg/user.slice/user-$uid.slice/cgroup.subtree_control"
chown "$uid:$gid" "$delegated" "$delegated"/cgroup.{procs,subtree_control,threads}
# The scopes below it get the controllers too (systemd enables them in the
# parent of every unit with Delegate=yes).
echo "+pids +memory +cpu" >"$delegated/cgroup.subtree_control"
say "delegated to $user: ${delegated#"$cg"} (controllers: $(cat "$delegated/cgroup.controllers"))"
# Root's test processes stay outside the delegation, in a group of their own.
mkdir -p "$cg/system.slice/tests.scope"

# A run of its own in the delegated group, as `systemd-run --user --scope
# -p Delegate=yes` gives one: root (the manager) makes the scope, hands it
# to the user and moves the process in before it becomes the user's.
in_user_scope() {
  local scope=$delegated/$1.scope
  shift
  mkdir "$scope"
  [ "$(cat "$scope/cgroup.controllers")" = "cpu memory pids" ] \
    || say "WARNING: the scope $scope offers only: $(cat "$scope/cgroup.controllers")"
  chown "$uid:$gid" "$scope" "$scope"/cgroup.{procs,subtree_control,threads}
  (
    echo 0 >"$scope/cgroup.procs"
    exec setpriv --reuid="$uid" --regid="$gid" --init-groups \
      env HOME="/home/$user" USER=$user "$@"
  )
}
mkdir -m 700 "/home/$user" && chown "$uid:$gid" "/home/$user"

export SANDBOX_TEST_SKIPS=$results/skipped-tests.txt
: >"$SANDBOX_TEST_SKIPS" && chmod 666 "$SANDBOX_TEST_SKIPS"
export SANDBOX_EXPECT_CGROUP_V2_LIMITS=1
# Where cargo runs a package's tests, and what it tells them.
export CARGO_MANIFEST_DIR=$GUEST_CHECKOUT/sandbox-engine
cd "$CARGO_MANIFEST_DIR"

# From here a failing command is a failing test (or a probe ended on
# purpose), counted and said, not a broken guest.
trap - ERR
set +E

# Which model the engine exercises here: its startup line, as the user in
# a delegated scope (what the suite's in-process engines get); the scope's
# cgroup.kill ends it.
engine=$(sed -n 's/^engine _ //p' "$results/tests.list")
CREATEOS_API_KEY=model-probe in_user_scope model "$engine" --port 0 --data-dir /tmp/model-probe \
  </dev/null >/dev/null 2>/tmp/model-probe.err &
for _ in $(seq 200); do
  [ -n "$(head -1 /tmp/model-probe.err)" ] && break
  sleep 0.05
done
echo 1 >"$delegated/model.scope/cgroup.kill"
wait
model=$(head -1 /tmp/model-probe.err)
say "the engine as $user in a delegated cgroup v2 group says: ${model:-nothing (it did not start)}"
echo "$model" >"$results/model"

uptime_s() { cut -d' ' -f1 /proc/uptime; }
failed=0
while read -r -u 3 kind name binary; do
  [ "$kind" = engine ] && continue
  started=$(uptime_s)
  case $kind in
    user) say "running $name as $user in the delegated scope ${delegated#"$cg"}/$name.scope"
          in_user_scope "$name" "$binary" --test-threads=2 </dev/null 2>&1 | tee "$results/$name.log" >&2 ;;
    root) say "running $name as root, outside the delegation (${cg}/system.slice/tests.scope)"
          (echo 0 >"$cg/system.slice/tests.scope/cgroup.procs"; exec "$binary" --test-threads=2) </dev/null 2>&1 \
            | tee "$results/$name.log" >&2 ;;
    *) say "unknown kind '$kind' in tests.list"; false ;;
  esac
  rc=$?
  say "$name: exit $rc after $(awk -v a="$started" -v b="$(uptime_s)" 'BEGIN { printf "%.1f", b - a }') s"
  [ $rc -eq 0 ] || failed=$((failed + 1))
done 3<"$results/tests.list"
if [ -s "$SANDBOX_TEST_SKIPS" ]; then
  say "tests that did not run in the guest (they passed without testing):"
  sort "$SANDBOX_TEST_SKIPS" >&2
fi
if [ $failed -eq 0 ]; then verdict "ok"; else verdict "$failed test binaries failed"; fi
