# Sourced by the benches that run commands on a held lease against a
# `sandbox engine` of their own (lease_exec.sh, volume.sh). The caller
# sets DIR (a scratch directory) and PIDS (an array), and stops every pid
# in PIDS on exit.

# start NAME BIN PROVIDER: an engine and a held lease; sets ENV_NAME, LEASE_NAME.
start() {
  local name=$1 bin=$2 provider=$3 data=$DIR/$1
  SANDBOX_DATA_DIR=$data SANDBOX_PROVIDER=$provider "$bin" engine > "$DIR/$name.out" 2> "$DIR/$name.err" &
  PIDS+=($!)
  for _ in $(seq 1 100); do grep -q '^export ' "$DIR/$name.out" && break; sleep 0.1; done
  local vars="SANDBOX_DATA_DIR=$data $(sed -n 's/^export //p' "$DIR/$name.out")"
  printf -v "ENV_$name" '%s' "$vars"
  local lease
  lease=$(env $vars "$bin" lease acquire)
  printf -v "LEASE_$name" '%s' "$lease"
  env $vars "$bin" lease exec "$lease" -- true  # warm: the machine and the component cache
}
# in_env NAME CMD...: CMD with engine NAME's variables, set by the shell
# itself (an `env` in front would be one more program start on our side).
in_env() {
  local vars=ENV_$1
  shift
  (
    for v in ${!vars}; do export "${v?}"; done
    exec "$@"
  )
}
