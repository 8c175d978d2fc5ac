// The shared secret-routing table (`scenarios/secret-routing.json`, issue 26
// "one policy, two hosts") against the Node host's real decisions:
// splitConfig (which origin gets which secret, in which header and scheme;
// https or loopback only; a default origin only when the operator trusts
// it; a variable only when the operator names it; two secrets in one
// header of one origin and empty secrets refused) and checkAskedOrigins
// (validate-config may ask only for the config's origins). The Rust host
// runs the same table (shared_decisions_secret_routing in
// sandbox-host/src/secret_routing_table.rs).
import { test } from "node:test";
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { checkAskedOrigins, originOf, splitConfig } from "../dist/secrets.js";

const TABLE = JSON.parse(readFileSync(new URL("./scenarios/secret-routing.json", import.meta.url), "utf8"));

/** A route's secret headers, lower-case names, sorted: the table's `header`/`value` or `secrets`. */
function headersOf(route) {
  const list = route.secrets ?? (route.header ? [{ header: route.header, value: route.value }] : []);
  return list.map((s) => ({ header: s.header.toLowerCase(), value: s.value })).sort((a, b) => a.header.localeCompare(b.header));
}

/** What the Node host decides for one case: refused (and why), or each route and its secret headers. */
function decide(c) {
  const description = TABLE.providers[c.provider];
  assert.ok(description, `${c.name}: provider ${c.provider}`);
  const operator = TABLE.operators[c.operator ?? "none"];
  assert.ok(operator, `${c.name}: operator ${c.operator}`);
  const split = splitConfig(structuredClone(c.config), description, {
    env: { ...(c.env ?? {}) },
    secretEnv: operator.secretEnv,
    trustedOrigins: operator.trustedOrigins,
  });
  if (split.errors.length > 0) return { refused: true, why: split.errors.join("; ") };
  const asked = c.asked ?? split.routes.map((r) => r.origin);
  const problem = checkAskedOrigins(asked, split.routes);
  if (problem !== undefined) return { refused: true, why: problem };
  return { routes: split.routes.map((r) => ({ field: r.field, origin: r.origin, secrets: headersOf(r) })) };
}

test("every shared secret-routing case decides as the table says", () => {
  assert.ok(TABLE.cases.length >= 36, "the shared table lost cases");
  const wrong = [];
  for (const c of TABLE.cases) {
    const decision = decide(c);
    try {
      if (c.expect.refused) {
        assert.equal(decision.refused, true, `expected a refusal, got ${JSON.stringify(decision.routes?.map((r) => [r.field, r.origin, r.secrets.map((s) => s.header)]))}`);
        for (const word of c.expect.mentions ?? []) assert.ok(decision.why.includes(word), `the refusal does not name ${word}: ${decision.why}`);
        continue;
      }
      assert.equal(decision.refused, undefined, `refused (${decision.why})`);
      const expected = c.expect.routes.map((r) => ({ field: r.field, origin: originOf(r.origin), secrets: headersOf(r) }));
      assert.deepEqual(decision.routes, expected);
    } catch (error) {
      wrong.push(`${c.name}: ${error.message.split("\n")[0]}`);
    }
  }
  assert.deepEqual(wrong, [], `cases decided otherwise:\n${wrong.join("\n")}`);
});

test("the table holds no secret: every secret value is a placeholder (or blank)", () => {
  const secretFields = new Set(Object.values(TABLE.providers).flatMap((p) => p.secrets.map((s) => s.configField)));
  for (const c of TABLE.cases) {
    for (const [field, value] of Object.entries(c.config)) if (secretFields.has(field)) assert.match(value, /^(PLACEHOLDER-|\s*$)/, c.name);
    for (const value of Object.values(c.env ?? {})) assert.match(value, /^(PLACEHOLDER-|$)/, c.name);
  }
});
