#!/bin/sh
# A stand-in for the `claude` CLI, for the Paperclip e2e's agent run (no LLM).
# Paperclip's `claude_local` adapter runs it as it would run `claude --print
# --output-format stream-json --verbose ...` (the arguments are ignored),
# with the prompt on stdin, in the run's working directory, and parses the
# stream-json lines it prints: a `system` init, `assistant` messages and a
# final `result`. Between them it does what an agent's shell work does:
# reads a file Paperclip synced in, runs a subcommand that fails, calls back
# into Paperclip (through the in-sandbox bridge in a sandbox environment),
# prints to both streams and writes a file Paperclip must bring back.
set -u
cat >/dev/null # the prompt
session="e2e-standin-$$"
printf '{"type":"system","subtype":"init","session_id":"%s","model":"e2e-stand-in"}\n' "$session"

if ! input=$(cat e2e-input.txt); then
  echo "stand-in: cannot read e2e-input.txt in $(pwd)" >&2
  exit 1
fi
echo "stand-in: read the synced file: $input"
echo "stand-in: a line on stderr" >&2

sh -c 'echo "stand-in: this subcommand fails on purpose" >&2; exit 7'
echo "stand-in: the subcommand exited with $?"

# Paperclip's API as the agent sees it: PAPERCLIP_API_URL and PAPERCLIP_API_KEY
# (in a sandbox, the bridge's loopback address and token). node:http, which
# needs no WebAssembly.
if ! me=$(node -e '
  const http = require("node:http");
  const url = new URL("/api/agents/me", process.env.PAPERCLIP_API_URL);
  http
    .get(url, { headers: { authorization: "Bearer " + process.env.PAPERCLIP_API_KEY } }, (res) => {
      let body = "";
      res.on("data", (chunk) => (body += chunk));
      res.on("end", () => {
        if (res.statusCode !== 200) {
          console.error("GET /api/agents/me answered HTTP " + res.statusCode + ": " + body.slice(0, 300));
          process.exit(1);
        }
        console.log(JSON.parse(body).name);
      });
    })
    .on("error", (error) => {
      console.error("GET /api/agents/me failed: " + error.message);
      process.exit(1);
    });
'); then
  echo "stand-in: the call back into Paperclip failed" >&2
  exit 1
fi
echo "stand-in: Paperclip says I am $me"

printf 'written by the stand-in after reading: %s\n' "$input" >e2e-output.txt
printf '{"type":"assistant","session_id":"%s","message":{"content":[{"type":"text","text":"stand-in %s did its work"}]}}\n' "$session" "$me"
printf '{"type":"result","subtype":"success","is_error":false,"result":"stand-in finished","session_id":"%s","usage":{"input_tokens":1,"output_tokens":1}}\n' "$session"
