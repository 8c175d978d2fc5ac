// The shared decision table (`scenarios/policy-decisions.json`, issue 26
// "one policy, two hosts") against the Node host's pure decisions: the
// call deadline and request budget from an operation-budget, a 429's
// pause, whether a throttled request is repeated, when a start waits for
// the request pacer. The Rust host runs the same table, so the two hosts
// cannot decide differently without one suite failing.
import { test } from "node:test";
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { callBudgetMs, requestBudgetMs } from "../dist/call-deadline.js";
import { throttlePauseMs, throttleRepeatAllowed } from "../dist/outgoing-handler.js";
import { waitFor, windowMargin } from "../dist/rate-ledger.js";

const TABLE = JSON.parse(readFileSync(new URL("./scenarios/policy-decisions.json", import.meta.url), "utf8"));

const wit = (budget) => (budget ? { operationMs: BigInt(budget.operationMs), requestMs: BigInt(budget.requestMs) } : undefined);

test("deadline arithmetic: the call's deadline and one request's budget", () => {
  assert.ok(TABLE.deadlines.length >= 5);
  for (const c of TABLE.deadlines) {
    const args = c.operation === "execute" ? [{}, {}, { timeoutMs: c.commandTimeoutMs === null || c.commandTimeoutMs === undefined ? undefined : BigInt(c.commandTimeoutMs) }] : [{}];
    assert.equal(callBudgetMs(c.operation, wit(c.budget), args), c.deadlineMs, c.name);
    assert.equal(requestBudgetMs(wit(c.budget)), c.requestBudgetMs, c.name);
  }
});

test("a 429's pause: Retry-After in delta-seconds, else one window, at most five minutes", () => {
  assert.ok(TABLE.throttlePause.length >= 8);
  for (const c of TABLE.throttlePause) assert.equal(throttlePauseMs(c.retryAfter ?? undefined, c.windowMs), c.pauseMs, c.name);
});

test("a throttled request is repeated only within the repeats, the call's deadline and one request's budget", () => {
  assert.ok(TABLE.throttleRepeat.length >= 6);
  const now = 1_000_000;
  for (const c of TABLE.throttleRepeat) {
    const deadline = c.remainingMs === null ? Number.POSITIVE_INFINITY : now + c.remainingMs;
    assert.equal(throttleRepeatAllowed(c.repeats, c.pauseMs, now, deadline, c.maxThrottleWaitMs ?? undefined), c.repeat, c.name);
  }
});

test("when a start waits for the request pacer", () => {
  assert.ok(TABLE.startWait.length >= 6);
  for (const c of TABLE.startWait) {
    const counted = c.limit.windowMs + windowMargin(c.limit.windowMs);
    assert.equal(waitFor(c.recent, c.pausedUntil, c.limit, counted, c.now) ?? null, c.waitMs, c.name);
  }
});
