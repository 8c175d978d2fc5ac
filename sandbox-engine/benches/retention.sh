#!/bin/bash
# 300 managed processes of 1 MB output each; server RSS before, right after, and after the retention.
BIN=${BIN:-target/debug/createos-local}
export CREATEOS_API_KEY=bench-key
$BIN --port 0 --finished-ttl ${TTL:-5} > ${TMPDIR:-/tmp}/rb.out 2>${TMPDIR:-/tmp}/rb.err &
PID=$!
for i in $(seq 1 100); do grep -q listening ${TMPDIR:-/tmp}/rb.out && break; sleep 0.1; done
URL=$(sed -n 's/listening on //p' ${TMPDIR:-/tmp}/rb.out)
rss() { awk '/VmRSS/{print int($2/1024)}' /proc/$PID/status; }
H="X-Api-Key: bench-key"
SB=$(curl -s -H "$H" -H 'content-type: application/json' -d '{"shape":"s-1vcpu-1gb"}' $URL/v1/sandboxes | sed 's/.*"id":"\([^"]*\)".*/\1/')
sleep 1
echo "baseline_rss_mib=$(rss)"
for i in $(seq 1 300); do
  P=$(curl -s -H "$H" -H 'content-type: application/json' -d '{"cmd":"/bin/sh","args":["-c","head -c 1048576 /dev/zero"]}' $URL/v1/sandboxes/$SB/processes | sed 's/.*"process_id":"\([^"]*\)".*/\1/')
  curl -s -H "$H" "$URL/v1/sandboxes/$SB/processes/$P/wait?scope=tree&timeout_ms=60000" > /dev/null
done
echo "after_300_rss_mib=$(rss)"
sleep $(( ${TTL:-5} + 7 ))
echo "after_retention_rss_mib=$(rss)"
kill -TERM $PID; wait $PID
