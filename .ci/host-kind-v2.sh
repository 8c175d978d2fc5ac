#!/usr/bin/env bash
# CI stage (issue 37 items 3 and 8): the engine's machine and isolation
# suites as an ordinary user (sandbox-ci) inside a cgroup v2 group
# delegated to it, made here as systemd's Delegate=yes makes one: a group
# under the cgroup2 mount, it and its cgroup.procs, cgroup.subtree_control
# and cgroup.threads owned by the user. Each suite's test process moves
# itself in before it becomes the user and runs (alone in the group, so
# that the engine may enable the controllers the group offers).
#
# Reuses the build of `cargo test --workspace` (the test binaries are
# only looked up). Prints the model exercised, and fails when the engine
# did not choose the delegated cgroup v2 backend. Run as root from the
# checkout's root, after `cargo test --workspace`.
set -euo pipefail
cd "$(dirname "$0")/.."
[ "$(id -u)" = 0 ] || { echo "host-kind-v2: needs root to delegate a cgroup" >&2; exit 1; }
id sandbox-ci >/dev/null 2>&1 || useradd -m sandbox-ci

# The cgroup2 mount: /sys/fs/cgroup on a pure v2 host, else (hybrid, as
# this CI kind of machine) /sys/fs/cgroup/unified, mounted when missing.
if [ "$(stat -f -c %T /sys/fs/cgroup)" = cgroup2fs ]; then
  mount_point=/sys/fs/cgroup
else
  mount_point=/sys/fs/cgroup/unified
  if [ "$(stat -f -c %T "$mount_point" 2>/dev/null)" != cgroup2fs ]; then
    mkdir -p "$mount_point"
    mount -t cgroup2 none "$mount_point"
  fi
fi
group="$mount_point/ci-host-kind-v2-$$"
remove_group() {
  [ -d "$group" ] || return 0
  echo 1 > "$group/cgroup.kill" 2>/dev/null || true
  for _ in $(seq 50); do
    find "$group" -depth -type d -exec rmdir {} + 2>/dev/null || true
    [ -d "$group" ] || return 0
    sleep 0.1
  done
  echo "host-kind-v2: $group could not be removed" >&2
}
trap remove_group EXIT
mkdir "$group"
chown sandbox-ci:sandbox-ci "$group" "$group/cgroup.procs" "$group/cgroup.subtree_control" "$group/cgroup.threads"
echo "host-kind-v2: delegated $group to sandbox-ci (controllers offered: $(cat "$group/cgroup.controllers"))" >&2

# Runs CMD as sandbox-ci from inside the group; its pid (the same process
# after the exec) on stdout once it ends, its status as ours.
as_user_in_group() {
  local pid status=0
  sh -c 'echo $$ > "$1/cgroup.procs" && shift && exec "$@"' sh "$group" \
    setpriv --reuid=sandbox-ci --regid=sandbox-ci --init-groups \
    env HOME=/home/sandbox-ci PATH=/usr/local/bin:/usr/bin:/bin "$@" >&2 &
  pid=$!
  wait "$pid" || status=$?
  echo "$pid"
  return "$status"
}

# The engine's own word: its startup line names the tree proof.
data=$(mktemp -d) && chown sandbox-ci "$data"
sh -c 'echo $$ > "$1/cgroup.procs" && exec setpriv --reuid=sandbox-ci --regid=sandbox-ci --init-groups env HOME=/home/sandbox-ci CREATEOS_API_KEY=ci "$2" --port 0 --data-dir "$3"' \
  sh "$group" "$PWD/target/debug/createos-local" "$data" >/dev/null 2>"$data.err" &
engine=$!
for _ in $(seq 200); do
  [ -s "$data.err" ] && break
  sleep 0.1
done
kill "$engine" 2>/dev/null || true
wait "$engine" 2>/dev/null || true
line=$(head -n 1 "$data.err")
rm -rf "$data" "$data.err"
echo "host-kind-v2: the engine says: $line" >&2
case "$line" in
  *"cgroup v2 delegated"*"$group"*) ;;
  *) echo "host-kind-v2: the engine did not choose the delegated cgroup v2 group $group" >&2; exit 1 ;;
esac

export SANDBOX_TEST_SKIPS="$PWD/target/skipped-tests-v2.txt"
rm -f "$SANDBOX_TEST_SKIPS"
touch "$SANDBOX_TEST_SKIPS" && chown sandbox-ci "$SANDBOX_TEST_SKIPS"
binaries=$(cargo test -p sandbox-engine --test machine --test isolation --no-run 2>&1 |
  sed -n 's/.*Executable tests\/\(machine\|isolation\)\.rs (\(.*\))$/\1 \2/p')
while read -r suite binary; do
  [ -n "$binary" ] || continue
  echo "host-kind-v2: running the $suite suite as sandbox-ci in $group" >&2
  # The model test (machine.rs) fails unless the engine chose this model.
  pid=$(as_user_in_group env SANDBOX_TEST_SKIPS="$SANDBOX_TEST_SKIPS" \
    CREATEOS_LOCAL_EXPECT_MODEL=machine+cgroup-v2 "$PWD/$binary")
  # The suite's in-process engines chose the delegated group when they
  # made their subtree there (createos-local-<pid>, left until the next
  # engine in the group removes it).
  if [ ! -d "$group/createos-local-$pid" ]; then
    echo "host-kind-v2: the $suite suite's engine (pid $pid) did not use the delegated cgroup v2 group" >&2
    exit 1
  fi
  echo "host-kind-v2: $suite suite exercised: one machine per sandbox, tree proof cgroup v2 delegated ($group)" >&2
done <<< "$binaries"
if [ -s "$SANDBOX_TEST_SKIPS" ]; then
  echo "host-kind-v2: tests that did not run as sandbox-ci in a delegated group:" >&2
  sort "$SANDBOX_TEST_SKIPS" >&2
fi
