#!/bin/bash
# Issue 37 item 9: the same commands on three host kinds, side by side in
# one run: the embedded engine served by `sandbox engine` (a) as root, (b) as
# an ordinary user with no cgroup it may write (each command's tree held by
# an anchor), (c) as that user in a delegated cgroup v2 group (as systemd's
# `Delegate=yes` gives one). For each: `sandbox lease exec L -- true` on a
# held lease, and a dev-server round trip (`curl` from one command to a
# `python3 -m http.server` an earlier command left running in the same
# sandbox). Interleaved: ROUNDS rounds of N runs of each, medians, and each
# kind's ratio to root's. The goal is an ordinary user within 1.25x of root.
#
# Every client command runs through `setpriv` (to root for the root engine),
# so all three rows pay the same extra exec. Run as root from the repository
# root after `cargo build -p sandbox-host` (or `--release`, then set
# SANDBOX_BIN=target/release/sandbox) and ./build.sh; the checkout must be
# readable by other users. USER_NAME (default sandbox-ci, made if missing),
# N (default 15), ROUNDS (default 3).
set -euo pipefail
BIN=$(realpath "${SANDBOX_BIN:-target/debug/sandbox}")
N=${N:-15}
ROUNDS=${ROUNDS:-3}
USER_NAME=${USER_NAME:-sandbox-ci}
PORT=8731
[ "$(id -u)" = 0 ] || { echo "host_kinds.sh: run as root (it starts engines as $USER_NAME too)" >&2; exit 1; }
id "$USER_NAME" >/dev/null 2>&1 || useradd -m "$USER_NAME"
HOME_OF_USER=$(getent passwd "$USER_NAME" | cut -d: -f6)

DIR=$(mktemp -d)
chmod 755 "$DIR"
PIDS=()
GROUP=
cleanup() {
  for p in "${PIDS[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  for p in "${PIDS[@]}"; do wait "$p" 2>/dev/null || true; done
  if [ -n "$GROUP" ] && [ -d "$GROUP" ]; then
    echo 1 > "$GROUP/cgroup.kill" 2>/dev/null || true
    for _ in $(seq 50); do
      find "$GROUP" -depth -type d -exec rmdir {} + 2>/dev/null || true
      [ -d "$GROUP" ] || break
      sleep 0.1
    done
  fi
  rm -rf "$DIR"
}
trap cleanup EXIT

# A cgroup v2 group delegated to the user (as .ci/host-kind-v2.sh makes it).
if [ "$(stat -f -c %T /sys/fs/cgroup)" = cgroup2fs ]; then
  mount_point=/sys/fs/cgroup
else
  mount_point=/sys/fs/cgroup/unified
  if [ "$(stat -f -c %T "$mount_point" 2>/dev/null)" != cgroup2fs ]; then
    mkdir -p "$mount_point"
    mount -t cgroup2 none "$mount_point"
  fi
fi
GROUP="$mount_point/bench-host-kinds-$$"
mkdir "$GROUP"
chown "$USER_NAME:$USER_NAME" "$GROUP" "$GROUP/cgroup.procs" "$GROUP/cgroup.subtree_control" "$GROUP/cgroup.threads"

as_root=(setpriv --reuid=0 --regid=0 --keep-groups env HOME=/root)
as_user=(setpriv "--reuid=$USER_NAME" "--regid=$USER_NAME" --init-groups env "HOME=$HOME_OF_USER")

# start KIND IN_GROUP OWNER AS...: an engine of that kind and a lease held on it,
# with a dev server running in the lease's sandbox; sets RUN_<KIND> (the
# client command prefix) and LEASE_<KIND>.
start() {
  local kind=$1 in_group=$2 owner=$3
  shift 3
  local data=$DIR/$kind
  mkdir "$data"
  chown "$owner" "$data"
  local engine=(env "SANDBOX_DATA_DIR=$data" "$BIN" engine)
  if [ "$in_group" = yes ]; then
    sh -c 'echo $$ > "$1/cgroup.procs" && shift && exec "$@"' sh "$GROUP" "$@" "${engine[@]}" \
      > "$DIR/$kind.out" 2> "$DIR/$kind.err" &
  else
    "$@" "${engine[@]}" > "$DIR/$kind.out" 2> "$DIR/$kind.err" &
  fi
  PIDS+=($!)
  for _ in $(seq 1 300); do grep -q '^export ' "$DIR/$kind.out" && break; sleep 0.1; done
  grep -q '^export ' "$DIR/$kind.out" || { echo "host_kinds.sh: the $kind engine did not start:" >&2; cat "$DIR/$kind.err" >&2; exit 1; }
  local run=("$@" "SANDBOX_DATA_DIR=$data" $(sed -n 's/^export //p' "$DIR/$kind.out") "$BIN")
  printf -v "RUN_$kind" '%q ' "${run[@]}"
  local lease
  lease=$(cd /tmp && "${run[@]}" lease acquire)
  printf -v "LEASE_$kind" '%s' "$lease"
  (cd /tmp && "${run[@]}" lease exec "$lease" -- sh -c "cd /tmp && nohup python3 -m http.server $PORT >/dev/null 2>&1 &")
  for _ in $(seq 1 100); do
    (cd /tmp && "${run[@]}" lease exec "$lease" -- curl -sf -o /dev/null "http://127.0.0.1:$PORT/") && break
    sleep 0.1
  done
  # What this kind exercised, as `sandbox describe` says it where the engine runs.
  local said
  if [ "$in_group" = yes ]; then
    said=$(cd /tmp && sh -c 'echo $$ > "$1/cgroup.procs" && shift && exec "$@"' sh "$GROUP" "$@" "$BIN" describe 2>&1)
  else
    said=$(cd /tmp && "$@" "$BIN" describe 2>&1)
  fi
  echo "host_kinds.sh: $kind: $(echo "$said" | grep -o 'embedded engine here: [^;]*; tree proof: [^;(]*' | head -n 1)" >&2
}
start root no root "${as_root[@]}"
start user no "$USER_NAME" "${as_user[@]}"
start user_v2 yes "$USER_NAME" "${as_user[@]}"

ms() { local t0 t1; t0=$(date +%s%N); "$@" > /dev/null; t1=$(date +%s%N); echo "scale=2; ($t1 - $t0) / 1000000" | bc; }
median() { sort -n | awk '{a[NR]=$1} END {print (NR % 2) ? a[(NR+1)/2] : (a[NR/2] + a[NR/2+1]) / 2}'; }
ratio() { echo "scale=2; $1 / $2" | bc; }

echo "| round | figure | root | ordinary user | ratio | user, delegated v2 | ratio | load |"
echo "|---|---|---|---|---|---|---|---|"
cd /tmp
for round in $(seq 1 "$ROUNDS"); do
  for kind in root user user_v2; do : > "$DIR/true.$kind"; : > "$DIR/curl.$kind"; done
  for _ in $(seq 1 "$N"); do
    for kind in root user user_v2; do
      run_var=RUN_$kind lease_var=LEASE_$kind
      eval "run=(${!run_var})"
      ms "${run[@]}" lease exec "${!lease_var}" -- true >> "$DIR/true.$kind"
      ms "${run[@]}" lease exec "${!lease_var}" -- curl -sf -o /dev/null "http://127.0.0.1:$PORT/" >> "$DIR/curl.$kind"
    done
  done
  load=$(cut -d' ' -f1 /proc/loadavg)
  for figure in true curl; do
    r=$(median < "$DIR/$figure.root"); u=$(median < "$DIR/$figure.user"); v=$(median < "$DIR/$figure.user_v2")
    case $figure in
      true) name='`lease exec -- true`' ;;
      curl) name='`lease exec -- curl` a dev server' ;;
    esac
    echo "| $round | $name | $r ms | $u ms | $(ratio "$u" "$r")x | $v ms | $(ratio "$v" "$r")x | $load |"
  done
done
