'use strict';
// The Node.js baseline of the cold-start benchmark (benches/provider.rs):
// a plugin worker process as orchestrators run them today. It loads one
// plugin module (argv[2], default ./noop-plugin.js) and answers JSON-RPC 2.0
// requests, one JSON object per line, on stdin/stdout. It exits when stdin
// closes.
const path = require('path');
const readline = require('readline');

const pluginPath = path.resolve(process.argv[2] || path.join(__dirname, 'noop-plugin.js'));
const plugin = require(pluginPath);

function reply(message) {
  process.stdout.write(JSON.stringify(message) + '\n');
}

const lines = readline.createInterface({ input: process.stdin, terminal: false });
lines.on('line', async (line) => {
  let request;
  try {
    request = JSON.parse(line);
  } catch (e) {
    reply({ jsonrpc: '2.0', id: null, error: { code: -32700, message: 'parse error' } });
    return;
  }
  const method = plugin[request.method];
  if (typeof method !== 'function') {
    reply({ jsonrpc: '2.0', id: request.id, error: { code: -32601, message: 'method not found' } });
    return;
  }
  try {
    const result = await method(request.params || {});
    reply({ jsonrpc: '2.0', id: request.id, result });
  } catch (e) {
    reply({ jsonrpc: '2.0', id: request.id, error: { code: -32000, message: String(e && e.message) } });
  }
});
lines.on('close', () => process.exit(0));
