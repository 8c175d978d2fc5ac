# Sourced by the benches that set one of our commands against a bare
# bwrap `true` (lease_exec.sh, run_true.sh). The caller sets DIR (a
# scratch directory), BASE_BIN (empty for no base build), ROUNDS and N,
# and defines `ours` and `base`, each running the command once.

# The baseline: the sandbox's namespaces, as the unprivileged uid the
# engine uses when root.
BARE=(bwrap --unshare-user --unshare-pid --unshare-net --unshare-ipc --unshare-uts
      --ro-bind / / --proc /proc --dev /dev true)
if [ "$(id -u)" = 0 ]; then
  BARE=(setpriv --reuid 65534 --regid 65534 --clear-groups "${BARE[@]}")
fi
# The baseline from a subshell, as the callers start their commands.
bare() { ( exec "${BARE[@]}" ); }
# Wall time of "$@" in ms, from bash's own clock (no `date` started
# around the command).
ms() {
  local t0=$EPOCHREALTIME t1
  "$@" > /dev/null
  t1=$EPOCHREALTIME
  echo "scale=2; (${t1/./} - ${t0/./}) / 1000" | bc
}
median() { sort -n | awk '{a[NR]=$1} END {print (NR % 2) ? a[(NR+1)/2] : (a[NR/2] + a[NR/2+1]) / 2}'; }
ratio() { echo "scale=2; $1 / $2" | bc; }
# compare LABEL: ROUNDS rounds of N runs of `ours`, `base` (with
# BASE_BIN) and `bare`, interleaved; a Markdown row of medians and ratios
# per round.
compare() {
  local label=$1 round e b o load
  if [ -n "${BASE_BIN:-}" ]; then
    echo "| round | \`$label\` | ratio | base build | ratio | bare \`bwrap true\` | load |"
    echo "|---|---|---|---|---|---|---|"
  else
    echo "| round | \`$label\` | bare \`bwrap true\` | ratio | load |"
    echo "|---|---|---|---|---|"
  fi
  for round in $(seq 1 "$ROUNDS"); do
    : > "$DIR/t.new"; : > "$DIR/t.base"; : > "$DIR/t.bare"
    for _ in $(seq 1 "$N"); do
      ms ours >> "$DIR/t.new"
      if [ -n "${BASE_BIN:-}" ]; then ms base >> "$DIR/t.base"; fi
      ms bare >> "$DIR/t.bare"
    done
    e=$(median < "$DIR/t.new"); b=$(median < "$DIR/t.bare"); load=$(cut -d' ' -f1 /proc/loadavg)
    if [ -n "${BASE_BIN:-}" ]; then
      o=$(median < "$DIR/t.base")
      echo "| $round | $e ms | $(ratio "$e" "$b")x | $o ms | $(ratio "$o" "$b")x | $b ms | $load |"
    else
      echo "| $round | $e ms | $b ms | $(ratio "$e" "$b")x | $load |"
    fi
  done
}
