// The shared secret-routing table (`scenarios/secret-routing.json`, issue 26
// "one policy, two hosts") against the Node host's real decisions:
// splitConfig (which origin gets which secret, in which header and scheme;
// https or loopback only; a key from the environment only for the
// provider's default origins) and checkAskedOrigins (validate-config may ask
// only for the config's origins). The Rust host runs the same table
// (shared_decisions_secret_routing in sandbox-host/src/network/secrets.rs).
import { test } from "node:test";
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { checkAskedOrigins, originOf, splitConfig } from "../dist/secrets.js";

const TABLE = JSON.parse(readFileSync(new URL("./scenarios/secret-routing.json", import.meta.url), "utf8"));

/** What the Node host decides for one case: refused, or each route and its secret header. */
function decide(c) {
  const description = TABLE.providers[c.provider];
  assert.ok(description, `${c.name}: provider ${c.provider}`);
  const split = splitConfig(structuredClone(c.config), description, { ...(c.env ?? {}) });
  if (split.errors.length > 0) return { refused: true, why: split.errors.join("; ") };
  const asked = c.asked ?? split.routes.map((r) => r.origin);
  const problem = checkAskedOrigins(asked, split.routes);
  if (problem !== undefined) return { refused: true, why: problem };
  return {
    routes: split.routes.map((r) => ({ field: r.field, origin: r.origin, header: r.secret?.header.toLowerCase() ?? null, value: r.secret?.value })),
  };
}

test("every shared secret-routing case decides as the table says", () => {
  assert.ok(TABLE.cases.length >= 20, "the shared table lost cases");
  for (const c of TABLE.cases) {
    const decision = decide(c);
    if (c.expect.refused) {
      assert.equal(decision.refused, true, `${c.name}: expected a refusal, got ${JSON.stringify(decision.routes?.map((r) => [r.field, r.origin, r.header]))}`);
      continue;
    }
    assert.equal(decision.refused, undefined, `${c.name}: refused (${decision.why})`);
    const expected = c.expect.routes.map((r) => ({ field: r.field, origin: originOf(r.origin), header: r.header?.toLowerCase() ?? null, value: r.value }));
    assert.deepEqual(decision.routes, expected, c.name);
  }
});

test("the table holds no secret: every secret value is a placeholder", () => {
  const secretFields = new Set(Object.values(TABLE.providers).flatMap((p) => p.secrets.map((s) => s.configField)));
  for (const c of TABLE.cases) {
    for (const [field, value] of Object.entries(c.config)) if (secretFields.has(field)) assert.match(value, /^PLACEHOLDER-/, c.name);
    for (const value of Object.values(c.env ?? {})) assert.match(value, /^PLACEHOLDER-/, c.name);
  }
});
