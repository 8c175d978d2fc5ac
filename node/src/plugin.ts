/**
 * The Paperclip plugin: `definePlugin` hooks that run an unchanged
 * `sandbox-provider` component (any provider: the packed package's
 * `dist/component/`) through the worker-thread pool. Nothing here names a
 * provider: the driver key, names, secrets and origins come from the
 * component's `describe()`.
 *
 * What the hooks add to the component (the host duties):
 * - secrets are taken out of the config (Paperclip resolved their
 *   secret-refs) and injected by the outgoing handler as the headers the
 *   component declares, only to the origins its `origin-fields` list them
 *   for (`secrets.ts`); the origins `validate-config` asks for must be the
 *   ones the config names, or nothing is sent;
 * - a lease is bound to its company: another company's lease is refused
 *   before any request (the component binds the environment);
 * - a lease whose cleanup could not be confirmed is poisoned durably in
 *   `ctx.state` and refused for execute and resume; releasing it destroys
 *   it instead of pausing it; only a confirmed destroy clears the poison;
 * - a sandbox that a failed acquire created and could not delete is
 *   recorded in `ctx.state` with its id and origin (Paperclip never learns
 *   the id), and the environment's next acquire, release or destroy without
 *   a lease deletes it (`orphans.ts`);
 * - release, destroy and shutdown cancel the commands running on the lease
 *   and wait for their cleanup before going on;
 * - live output goes to `ctx.execution.log` in order, each stream's bytes
 *   decoded as UTF-8 with a streaming decoder (`LiveText`), so a character
 *   split between chunks arrives whole;
 * - where the component's capabilities say so (`login-pty`,
 *   `duplex-channels`), the login terminal and duplex channel hooks run one
 *   `interact` call per session (`interactive-sessions.ts`): output through
 *   `ctx.loginPty` / `ctx.duplexChannel` once the open reply went out, the
 *   exit reported once, an unproven end poisoning the lease as `execute`'s
 *   does, and a session a stopped worker left open (`session-records.ts`)
 *   poisoning its lease too;
 * - contract 0.7.0's environment policy (`environment-policy.ts`): the
 *   run's adapter and its egress grants merged with the environment's base
 *   list go into the acquire request (grants a component cannot enforce
 *   are refused before anything is created), and a reused lease goes back
 *   to the base policy, since grants are the acquiring run's;
 * - where the component says so, the runner's WebSocket ingress from an
 *   opened port (`ports`, `runner-ingress.ts`) and Paperclip's custom-image
 *   flow over templates (`templates`, `setup-sessions.ts`).
 */
import { offeredToPaperclip } from "./paperclip-features.js";
import { baseEgress, checkEgressSupported, mergedEgress, RUN_GRANTS_KEY } from "./environment-policy.js";
import { runnerPath, runnerPort, toRunnerIngress } from "./runner-ingress.js";
import { SetupStore, takeTemplate, templateName, TEMPLATE_FIELD, TEMPLATE_KIND, type SetupRecord } from "./setup-sessions.js";
import { AsyncResource } from "node:async_hooks";
import { randomUUID } from "node:crypto";
import type { PluginContext } from "@paperclipai/plugin-sdk";
import { decodeChannelBytes } from "@paperclipai/plugin-sdk/protocol";
import { definePlugin } from "./sdk.js";
import type {
  PluginEnvironmentAcquireLeaseParams,
  PluginEnvironmentDestroyLeaseParams,
  PluginEnvironmentDriverBaseParams,
  PluginEnvironmentExecuteParams,
  PluginEnvironmentLease,
  PluginEnvironmentProbeParams,
  PluginEnvironmentRealizeWorkspaceParams,
  PluginEnvironmentReleaseLeaseParams,
  PluginEnvironmentResumeLeaseParams,
  PluginEnvironmentRunnerIngressEndpointParams,
  PluginEnvironmentStartInteractiveSetupParams,
  PluginEnvironmentInteractiveSetupSession,
  PluginEnvironmentGetInteractiveSetupParams,
  PluginEnvironmentCaptureTemplateParams,
  PluginEnvironmentCaptureTemplateResult,
  PluginEnvironmentCancelInteractiveSetupParams,
  PluginEnvironmentCancelInteractiveSetupResult,
  PluginEnvironmentDeleteTemplateParams,
  PluginEnvironmentDeleteTemplateResult,
  PluginEnvironmentSyncInParams,
  PluginEnvironmentSyncOutParams,
  PluginEnvironmentValidateConfigParams,
} from "@paperclipai/plugin-sdk";
import type {
  PluginDuplexChannelCloseParams,
  PluginDuplexChannelOpenParams,
  PluginDuplexChannelStopParams,
  PluginDuplexChannelWriteParams,
  PluginLoginPtyCloseParams,
  PluginLoginPtyInputParams,
  PluginLoginPtyOpenParams,
  PluginLoginPtyStopParams,
} from "@paperclipai/plugin-sdk/protocol";
import { channelRequest, loginRequest, Session, SessionRegistry, type SessionKind } from "./interactive-sessions.js";
import { SessionRecords } from "./session-records.js";
import {
  AGENT_WORKDIR,
  COMPONENT_LEASE_KEY,
  leaseCompany,
  ProviderFailure,
  redact,
  toContext,
  toExecuteRequest,
  toExecuteResult,
  toFailure,
  toPaperclipLease,
  toReceipt,
  toResumeResult,
  toWitLease,
  sinkFailedOutput,
  unconsumedOutput,
  type Operation,
} from "./mapping.js";
import { OrphanStore } from "./orphans.js";
import { PoisonStore } from "./poison.js";
import { defaultLedgerPath } from "./rate-ledger.js";
import { packedDescription, packedDescriptionSync, ProviderCallError, ProviderPool, type RunningCall, type RunningInteraction } from "./pool.js";
import type { OutputStream } from "./provider-thread.js";
import { checkAskedOrigins, splitConfig, type OriginRoute, type SecretOperator } from "./secrets.js";
import { syncIn, syncOut, type SyncBackend } from "./sync.js";
import type {
  ProviderOperation,
  WitConfigValidation,
  WitExecuteResult,
  WitFileDownload,
  WitInteractionRequest,
  WitLease,
  WitProbeReport,
  WitProviderDescription,
  WitPortEndpoint,
  WitProviderError,
  WitTemplateDeletion,
  WitTemplateInfo,
  WitRateLimit,
  WitResumeOutcome,
  WitSyncReport,
  WitTerminationReceipt,
} from "./wit-types.js";

/** Options of {@link createPlugin}. */
export interface PluginOptions {
  /** Number of worker threads (default: up to 4). */
  poolSize?: number;
  /**
   * The transpiled component (a `file:` URL of its directory, ending in
   * `/`); default `./component/` beside the host code, as a packed package
   * has it.
   */
  componentDir?: string;
  /** Environment the operator's named variables (`secretEnv`) are read from (default `process.env`). */
  env?: NodeJS.ProcessEnv;
  /**
   * The operator's variables, per secret config field (`PAPERCLIP_WASM_SECRET_ENV`
   * in the worker): read when the config holds no secret, and sent only to
   * `trustedOrigins`. The variable a provider names (`env-var`) is never read.
   */
  secretEnv?: Readonly<Record<string, string>>;
  /**
   * Origins the operator trusts with secrets (`PAPERCLIP_WASM_TRUSTED_ORIGINS`
   * in the worker): a provider's default origin receives a secret only when
   * listed here (else the config must name it), and a key from `secretEnv`
   * goes only to these.
   */
  trustedOrigins?: readonly string[];
  /** Test-only: output containing this marker makes the component trap. */
  testTrapMarker?: string;
  /** Undelivered live output (bytes; the name is from before contract 0.4.0) beyond which a command's stream waits for `ctx.execution.log` (default 4 Mi). */
  outputHighWaterChars?: number;
  /**
   * Replaces the declared rate limit: the operator's account limit
   * (`PAPERCLIP_WASM_RATE_LIMIT` in the worker), spent on every origin,
   * or in benchmarks and tests `null` for no limit (the benchmarks
   * compare per-command cost without a limit, as the Rust host's do).
   * Undefined: the limit `describe()` declares, which an origin that
   * answers as our embedded engine does not spend.
   */
  rateLimit?: WitRateLimit | null;
  /**
   * The in-process queue table of the request pacer (`createPacerBuffer()`);
   * default a new one.
   */
  pacerBuffer?: SharedArrayBuffer;
  /**
   * The request pacer's machine-wide ledger file; default `PAPERCLIP_WASM_RATE_LEDGER`
   * from `env`, else a per-user file in the temporary directory
   * (`defaultLedgerPath`).
   */
  rateLedgerPath?: string;
}

/** A command (or sync) in flight on a lease. */
interface InFlight {
  cancel(): void;
  /** Settles after the hook finished, including any poison record. */
  settled: Promise<unknown>;
}

/** What the worker keeps of a lease it saw, in memory only (the config holds the resolved secret): the open hooks of sessions name only the lease. */
interface KnownLease {
  base: PluginEnvironmentDriverBaseParams;
  metadata: Record<string, unknown> | null | undefined;
}

/** The most bytes of one `duplexChannel.data` notification (its base64 well under Paperclip's 262,144 characters). */
const CHANNEL_FRAME_BYTES = 96 * 1024;

/** How much of a duplex channel command's stderr is logged (its stdout is the channel). */
const CHANNEL_STDERR_LOG_BYTES = 2048;

/** How long shutdown waits for cancelled commands (Paperclip drains for 10 s). */
const SHUTDOWN_WAIT_MS = 8_000;

/** Paperclip's host drops an `execute.log` chunk above 1,000,000 characters. */
const LOG_PIECE_CHARS = 256 * 1024;

/**
 * One command's live output as text for `ctx.execution.log`: the component
 * forwards the bytes the command printed, and a chunk may end inside a
 * UTF-8 character, so each stream has its own streaming decoder that
 * carries an incomplete character over to that stream's next chunk.
 * `finish` ends both streams: an incomplete character left at the end (and
 * any invalid byte on the way) becomes U+FFFD, as in the result's text.
 */
export class LiveText {
  readonly #decoders = { stdout: new TextDecoder("utf-8"), stderr: new TextDecoder("utf-8") };

  /** The text of `chunk` of `stream` that is complete so far. */
  push(stream: "stdout" | "stderr", chunk: Uint8Array): string {
    return this.#decoders[stream].decode(chunk, { stream: true });
  }

  /** What each stream still held (an incomplete last character), as text. */
  finish(): Array<["stdout" | "stderr", string]> {
    const rest: Array<["stdout" | "stderr", string]> = [];
    for (const stream of ["stdout", "stderr"] as const) {
      const text = this.#decoders[stream].decode();
      if (text) rest.push([stream, text]);
    }
    return rest;
  }
}

/** Splits a chunk into pieces the host accepts, never inside a surrogate pair. */
export function logPieces(chunk: string): string[] {
  const pieces: string[] = [];
  let start = 0;
  while (chunk.length - start > LOG_PIECE_CHARS) {
    let end = start + LOG_PIECE_CHARS;
    const code = chunk.charCodeAt(end - 1);
    if (code >= 0xd800 && code <= 0xdbff) end -= 1;
    pieces.push(chunk.slice(start, end));
    start = end;
  }
  if (start < chunk.length) pieces.push(chunk.slice(start));
  return pieces;
}

/** Builds the plugin; `worker.ts` exports the default instance. */
export function createPlugin(options: PluginOptions = {}) {
  const env = options.env ?? process.env;
  const operator: SecretOperator = { env, secretEnv: options.secretEnv, trustedOrigins: options.trustedOrigins };
  let pool: ProviderPool | undefined;
  let context: PluginContext | undefined;
  let description: WitProviderDescription | undefined;
  const poison = new PoisonStore(() => {
    if (!context) throw new Error("the plugin is not set up");
    return context.state;
  });
  const setups = new SetupStore(() => {
    if (!context) throw new Error("the plugin is not set up");
    return context.state;
  });
  const orphans = new OrphanStore(() => {
    if (!context) throw new Error("the plugin is not set up");
    return context.state;
  });
  const inFlight = new Map<string, Set<InFlight>>();
  /** The leases this worker saw (acquire, resume, execute, ...), so that a session's open, which names only the lease, can reach its sandbox. */
  const leases = new Map<string, KnownLease>();
  const sessions = new SessionRegistry();
  const sessionRecords = new SessionRecords(() => {
    if (!context) throw new Error("the plugin is not set up");
    return context.state;
  });
  /** This worker process, in session records (a record of another one was left by a worker that stopped). */
  const workerInstance = randomUUID();
  /** What the packed component can do, known before `setup` (it decides which hooks exist). */
  // Defined where the component runs them; Paperclip calls only what the manifest declares (less what the packer held back).
  const packedCapabilities = offeredToPaperclip(packedDescriptionSync(options.componentDir) as WitProviderDescription | undefined);

  function remember(params: PluginEnvironmentDriverBaseParams, providerLeaseId: string | null | undefined, metadata: Record<string, unknown> | null | undefined) {
    if (typeof providerLeaseId !== "string") return;
    const { driverKey, companyId, environmentId, config } = params;
    leases.set(providerLeaseId, { base: { driverKey, companyId, environmentId, config }, metadata });
  }

  function activePool(): ProviderPool {
    if (!pool) throw new ProviderFailure("The provider worker is not set up yet.", "trap", "none");
    return pool;
  }

  function describeOrThrow(): WitProviderDescription {
    if (!description) throw new ProviderFailure("The provider worker is not set up yet.", "trap", "none");
    return description;
  }

  /** The provider's name for messages (its `display-name`). */
  function providerName(): string {
    return description?.displayName ?? "The provider";
  }

  /** Splits the config; refuses it when a secret or origin field is unusable. */
  /** The config the component sees: without the host's `template` field where templates are offered (setup-sessions.ts). */
  function componentSide(config: Record<string, unknown> | null | undefined): { config: Record<string, unknown> | null | undefined; template: string | undefined } {
    return packedCapabilities.templates ? takeTemplate(config) : { config, template: undefined };
  }

  function prepare(params: PluginEnvironmentDriverBaseParams) {
    const split = splitConfig(componentSide(params.config).config, describeOrThrow(), operator);
    if (split.errors.length > 0) {
      throw new ProviderFailure(`The ${providerName()} config is invalid: ${split.errors.join("; ")}; nothing was sent.`, "invalid-config", "none");
    }
    return { ctx: toContext(params, JSON.stringify(split.componentConfig)), secret: split.routes };
  }

  /** Every secret value a message must never show: each header value, and the bare secret after its scheme. */
  function secretsOf(routes: readonly OriginRoute[] | undefined): string[] {
    const values = new Set<string>();
    for (const route of routes ?? []) {
      for (const secret of route.secrets) {
        values.add(secret.value);
        const bare = secret.value.slice(secret.value.indexOf(" ") + 1);
        if (bare.length >= 8) values.add(bare);
      }
    }
    return [...values];
  }

  /** Runs one component call; maps its failure to what Paperclip sees. */
  function start<T>(
    operation: Operation,
    witOperation: ProviderOperation,
    args: unknown[],
    secret: OriginRoute[] | undefined,
    onOutput?: (stream: OutputStream, chunk: Uint8Array) => void | Promise<void>,
  ): RunningCall<T> & Partial<Pick<RunningInteraction<T>, "started" | "send">> {
    const callOptions = {
      routes: secret,
      rateLimit: options.rateLimit === undefined ? describeOrThrow().rateLimit : (options.rateLimit ?? undefined),
      // The declared budget protects the real service, not our engine (outgoing-handler.ts).
      rateLimitDeclared: options.rateLimit === undefined,
      onOutput,
    };
    const interactive = witOperation === "interact" ? activePool().interact<T>(args, callOptions) : undefined;
    const running = interactive ?? activePool().call<T>(witOperation, args, callOptions);
    // Whatever may still run in the sandbox after a trap poisons the lease.
    const mayLeaveRunning = operation === "execute" || interactive !== undefined;
    // Output the live sink did not take: never a clean result.
    const checked = running.result.then((value) => {
      const unconsumed = running.unconsumedBytes();
      if ((witOperation !== "execute" && witOperation !== "interact") || unconsumed === 0) return value;
      throw toFailure(unconsumedOutput(value as WitExecuteResult, unconsumed), operation, secretsOf(secret), providerName(), running.sinkFailure());
    });
    const result = checked.catch((error: unknown) => {
      if (error instanceof ProviderCallError) {
        const payload = error.failure.kind === "provider" ? (error.failure.payload as WitProviderError) : undefined;
        // Cancelled because the execution log failed: the output it could
        // not take is lost, the command's tree confirmed gone.
        const sinkFailure = running.sinkFailure();
        if (witOperation === "execute" && payload?.tag === "cancelled" && sinkFailure !== undefined) {
          throw toFailure(sinkFailedOutput(payload.val, running.unconsumedBytes()), operation, secretsOf(secret), providerName(), sinkFailure);
        }
        if (error.failure.kind === "provider") {
          throw toFailure(error.failure.payload as WitProviderError, operation, secretsOf(secret), providerName());
        }
        throw new ProviderFailure(
          redact(
            `The provider component failed during ${operation} (${error.failure.message}); its instance was replaced.` +
              (mayLeaveRunning ? " The command may still run: the lease is poisoned until it is destroyed." : ""),
            secretsOf(secret),
          ),
          "trap",
          mayLeaveRunning ? "poison-lease" : "none",
          // A sandbox the failed acquire (or probe) had created: where it is.
          error.recordedSandboxes.length > 0 ? { providerLeaseId: error.recordedSandboxes[0] } : undefined,
        );
      }
      throw error;
    });
    result.catch(() => {});
    return { result, cancel: running.cancel, unconsumedBytes: running.unconsumedBytes, sinkFailure: running.sinkFailure, started: interactive?.started, send: interactive?.send };
  }

  function call<T>(operation: Operation, witOperation: ProviderOperation, args: unknown[], secret: OriginRoute[] | undefined) {
    return start<T>(operation, witOperation, args, secret).result;
  }

  /**
   * Acquires a lease: the run's egress and adapter, and `template` (the
   * environment's, or a setup session's source), into the component's
   * acquire request. The lease's metadata records the template, so that
   * a resume under another one expires it before any request.
   */
  async function acquireLease(params: PluginEnvironmentAcquireLeaseParams, template: string | undefined): Promise<PluginEnvironmentLease> {
    const { ctx, secret } = prepare(params);
    // The run's egress grants merged with the environment's base list; one the component cannot enforce is refused here, before anything is created.
    const egress = checkEgressSupported(mergedEgress(params.config, params.executionWorkspaceSettings), describeOrThrow().capabilities, providerName());
    await sweepOrphans(params);
    try {
      const lease = await call<WitLease>(
        "acquire",
        "acquireLease",
        [
          ctx,
          {
            runId: params.runId,
            // A directory of its own under the provider's workspace (see
            // AGENT_WORKDIR): Paperclip wipes it before each workspace sync.
            requestedCwd: params.requestedCwd ?? AGENT_WORKDIR,
            workspaceMode: params.workspaceMode ?? undefined,
            requestedExpiresAt: params.requestedExpiresAt ?? undefined,
            // Contract 0.7.0's environment policy: the merged egress
            // (none: the config's base list, else the service's default)
            // and the run's adapter, whose image the config may name
            // (`rootfsByAdapter`, `snapshotByAdapter`).
            egress,
            adapterType: params.adapterType ?? undefined,
            image: undefined,
            template,
          },
        ],
        secret,
      );
      const answer = toPaperclipLease(lease, params.companyId);
      if (packedCapabilities.templates) answer.metadata = { ...answer.metadata, [TEMPLATE_FIELD]: template ?? null };
      // A policy with the run's own grants: a resume puts the base policy back (onEnvironmentResumeLease).
      if (egress !== undefined) answer.metadata = { ...answer.metadata, [RUN_GRANTS_KEY]: true };
      remember(params, answer.providerLeaseId, answer.metadata);
      return answer;
    } catch (error) {
      if (
        error instanceof ProviderFailure &&
        (error.kind === "cleanup-failed" || error.kind === "trap") &&
        error.data?.providerLeaseId
      ) {
        // The sandbox may still exist: keep it refused until someone destroys it,
        // and remember where it is, since Paperclip never learns its id.
        const recordedAt = new Date().toISOString();
        await poison.record(params.companyId, {
          providerLeaseId: error.data.providerLeaseId,
          environmentId: params.environmentId,
          reason: error.message,
          recordedAt,
        });
        const [apiOrigin] = apiOriginsOf(params);
        if (apiOrigin) {
          await orphans.record(params.companyId, params.environmentId, {
            providerLeaseId: error.data.providerLeaseId,
            apiOrigin,
            runId: params.runId,
            reason: error.message,
            recordedAt,
          });
        }
      }
      throw error;
    }
  }

  /** A setup session's recorded lease, or a typed refusal (nothing sent). */
  async function setupRecord(params: PluginEnvironmentDriverBaseParams & { providerLeaseId?: string | null }, what: string): Promise<SetupRecord> {
    const record = typeof params.providerLeaseId === "string" ? await setups.get(params.companyId, params.providerLeaseId) : null;
    if (!record) {
      throw new ProviderFailure(`There is no setup session with lease ${JSON.stringify(params.providerLeaseId)} for this company (it was cancelled, or never started here); cannot ${what}. Start a new setup session.`, "invalid-request", "none");
    }
    if (record.environmentId !== params.environmentId) throw foreignSetup();
    return record;
  }

  function foreignSetup() {
    return new ProviderFailure(`The setup session belongs to another environment; nothing was sent to ${providerName()}.`, "foreign-company", "none");
  }

  /** Refuses a lease recorded for another company, before any request. */
  function checkCompany(params: PluginEnvironmentDriverBaseParams, metadata: Record<string, unknown> | null | undefined) {
    const owner = leaseCompany(metadata);
    const holdsComponentLease = typeof metadata?.[COMPONENT_LEASE_KEY] === "string";
    if ((holdsComponentLease && owner === undefined) || (owner !== undefined && owner !== params.companyId)) {
      throw new ProviderFailure(
        `The lease does not belong to this environment (it was acquired for another company); nothing was sent to ${providerName()}.`,
        "foreign-company",
        "none",
      );
    }
  }

  /**
   * Sessions recorded on the lease that no live session of this worker
   * holds were left open by a worker that stopped: their processes may
   * still run, so the lease is poisoned (destroy clears it).
   */
  async function poisonStrandedSessions(params: PluginEnvironmentDriverBaseParams, providerLeaseId: string) {
    const recorded = await sessionRecords.list(params.companyId, providerLeaseId);
    if (recorded.length === 0) return;
    // Paperclip's host takes `ctx.state` calls only within a call it made,
    // so a session's end is written here, by the next call on its lease (or
    // by its close, release or destroy), not when the process ended.
    const stranded: string[] = [];
    for (const record of recorded) {
      const session = record.workerInstance === workerInstance ? sessions.known(record.workerSessionId) : undefined;
      if (!session) {
        stranded.push(record.kind === "login-pty" ? "a login terminal" : "a duplex channel");
        continue;
      }
      if (session.done) await settleSession(session, params);
    }
    const unknown = recorded.filter((record) => record.workerInstance !== workerInstance || !sessions.known(record.workerSessionId));
    if (unknown.length === 0) return;
    await poison.record(params.companyId, {
      providerLeaseId,
      environmentId: params.environmentId,
      reason: `${stranded.join(" and ")} opened on it by a worker that stopped before ending it may still run`,
      recordedAt: new Date().toISOString(),
    });
    await sessionRecords.remove(params.companyId, providerLeaseId, unknown.map((record) => record.workerSessionId));
  }

  /**
   * Writes an ended session's outcome to `ctx.state`, once: its lease
   * poisoned when its end is not proven, its record removed. Called from
   * within a call of Paperclip (close, release, destroy, the next call on
   * the lease).
   */
  async function settleSession(session: Session, params: PluginEnvironmentDriverBaseParams) {
    if (session.settled) return;
    session.settled = true;
    try {
      if (session.failure !== undefined) await poisonOnFailure(params, session.providerLeaseId, session.failure);
      await sessionRecords.remove(session.companyId, session.providerLeaseId, [session.workerSessionId]);
    } catch (error) {
      // Tried again by the next call on the lease.
      session.settled = false;
      throw error;
    }
  }

  async function refuseIfPoisoned(params: PluginEnvironmentDriverBaseParams, providerLeaseId: string, what: string) {
    await poisonStrandedSessions(params, providerLeaseId);
    const record = await poison.get(params.companyId, providerLeaseId);
    if (record) {
      throw new ProviderFailure(
        `The lease ${providerLeaseId} is poisoned (${record.reason.slice(0, 300)}); ${what} is refused until it is destroyed (environmentDestroyLease).`,
        "poisoned",
        "none",
      );
    }
  }

  async function poisonOnFailure(params: PluginEnvironmentDriverBaseParams, providerLeaseId: string, error: unknown) {
    if (error instanceof ProviderFailure && error.consequence === "poison-lease") {
      await poison.record(params.companyId, {
        providerLeaseId,
        environmentId: params.environmentId,
        reason: error.message,
        processId: error.data?.processId,
        recordedAt: new Date().toISOString(),
      });
    }
  }

  function track(providerLeaseId: string, entry: InFlight) {
    let set = inFlight.get(providerLeaseId);
    if (!set) inFlight.set(providerLeaseId, (set = new Set()));
    set.add(entry);
    const forget = () => {
      set!.delete(entry);
      if (set!.size === 0 && inFlight.get(providerLeaseId) === set) inFlight.delete(providerLeaseId);
    };
    entry.settled.then(forget, forget);
  }

  /** The lease's sandbox is gone or paused: its sessions are over, and so are their records. */
  async function forgetSessions(params: PluginEnvironmentDriverBaseParams, providerLeaseId: string) {
    for (const session of sessions.onLease(providerLeaseId)) {
      await session.ended;
      sessions.remove(session);
    }
    const recorded = await sessionRecords.list(params.companyId, providerLeaseId);
    if (recorded.length > 0) await sessionRecords.remove(params.companyId, providerLeaseId, recorded.map((record) => record.workerSessionId));
    leases.delete(providerLeaseId);
  }

  /** Cancels what runs on a lease and waits until each finished its cleanup. */
  async function stopInFlight(providerLeaseId: string) {
    const entries = [...(inFlight.get(providerLeaseId) ?? [])];
    for (const entry of entries) entry.cancel();
    await Promise.allSettled(entries.map((entry) => entry.settled));
  }

  function leaseOf(lease: PluginEnvironmentLease): WitLease {
    if (typeof lease?.providerLeaseId !== "string") {
      throw new ProviderFailure("The lease has no provider lease id; acquire a lease first.", "invalid-request", "none");
    }
    return toWitLease(lease.providerLeaseId, lease.metadata);
  }

  async function destroy(params: PluginEnvironmentDriverBaseParams, providerLeaseId: string, metadata: Record<string, unknown> | null | undefined) {
    const { ctx, secret } = prepare(params);
    await stopInFlight(providerLeaseId);
    try {
      const receipt = await call<WitTerminationReceipt>("destroy", "destroyLease", [ctx, toWitLease(providerLeaseId, metadata)], secret);
      // Proof: the component confirmed the sandbox deleted or already gone.
      await poison.clear(params.companyId, providerLeaseId);
      await forgetSessions(params, providerLeaseId);
      if ((await orphans.list(params.companyId, params.environmentId)).some((o) => o.providerLeaseId === providerLeaseId)) {
        await orphans.remove(params.companyId, params.environmentId, providerLeaseId);
      }
      return toReceipt(receipt);
    } catch (error) {
      await poisonOnFailure(params, providerLeaseId, error);
      throw error;
    }
  }

  /** The API origins a config sends to (from its origin fields, no component call). */
  function apiOriginsOf(params: PluginEnvironmentDriverBaseParams): string[] {
    return splitConfig(params.config, describeOrThrow(), operator).routes.map((route) => route.origin);
  }

  /**
   * Deletes the sandboxes failed acquires of this environment left behind
   * (see `orphans.ts`), those at the origin this config sends to. A record
   * goes only with a confirmed receipt; a failure is logged and kept for the
   * next sweep, and never stops the call that swept.
   */
  async function sweepOrphans(params: PluginEnvironmentDriverBaseParams) {
    const recorded = await orphans.list(params.companyId, params.environmentId);
    if (recorded.length === 0) return;
    const { ctx, secret } = prepare(params);
    const origins = apiOriginsOf(params);
    for (const orphan of recorded) {
      if (!origins.includes(orphan.apiOrigin)) continue;
      try {
        await call<WitTerminationReceipt>("destroy", "destroyLease", [ctx, toWitLease(orphan.providerLeaseId, {})], secret);
        await poison.clear(params.companyId, orphan.providerLeaseId);
        await orphans.remove(params.companyId, params.environmentId, orphan.providerLeaseId);
        context?.logger.info(`Deleted sandbox ${orphan.providerLeaseId}, left behind by a failed acquire.`);
      } catch (error) {
        context?.logger.warn(
          `Sandbox ${orphan.providerLeaseId}, left behind by a failed acquire, could not be deleted yet (${error instanceof Error ? error.message : String(error)}); the next acquire of this environment tries again.`,
        );
      }
    }
  }

  function syncBackend(params: PluginEnvironmentDriverBaseParams, lease: WitLease): SyncBackend {
    const { ctx, secret } = prepare(params);
    return {
      upload: (files) => call<WitSyncReport>("sync-in", "syncIn", [ctx, lease, files], secret),
      download: (paths) => call<WitFileDownload[]>("sync-out", "syncOut", [ctx, lease, paths], secret),
      run: (command, args, options) =>
        call<WitExecuteResult>(
          "execute",
          "execute",
          [ctx, lease, toExecuteRequest({ command, args, cwd: options?.cwd, timeoutMs: options?.timeoutMs })],
          secret,
        ),
      // An entry a sync refuses alone is named here and skipped (sync.ts).
      warn: (message) => context?.logger.warn(message),
    };
  }

  /** The lease a session's open names, as this worker saw it; a typed refusal when it never did. */
  function knownLease(params: { providerLeaseId: string; companyId: string; environmentId: string }, what: string): KnownLease {
    const known = typeof params.providerLeaseId === "string" ? leases.get(params.providerLeaseId) : undefined;
    if (!known) {
      throw new ProviderFailure(
        `The lease ${JSON.stringify(params.providerLeaseId)} is not known to this worker (it was not acquired or resumed here since the worker started); acquire or resume it, then open the ${what} again. Nothing was opened.`,
        "invalid-request",
        "none",
      );
    }
    if (known.base.companyId !== params.companyId || known.base.environmentId !== params.environmentId) {
      throw new ProviderFailure(
        `The lease does not belong to this environment (it was acquired for another company or environment); nothing was sent to ${providerName()}.`,
        "foreign-company",
        "none",
      );
    }
    return known;
  }

  /** Reports a session's exit to Paperclip, once. */
  function reportExit(session: Session, exitCode: number | null, transportClosed: boolean) {
    if (session.exitReported || !session.bound) return;
    session.exitReported = true;
    if (session.kind === "login-pty") context?.loginPty.exit(session.hostRouteId, session.workerSessionId, exitCode);
    else context?.duplexChannel.exit(session.hostRouteId, session.workerSessionId, exitCode, transportClosed || undefined);
  }

  /**
   * Opens one session: refusals before anything is created (capability,
   * lease, poison, route), a durable record, then the `interact` call; it
   * resolves once the process exists in the sandbox (or rejects with the
   * call's failure, its end proven or the lease poisoned).
   */
  async function openSession(
    kind: SessionKind,
    params: { hostRouteId: string; providerLeaseId: string; companyId: string; environmentId: string },
    request: WitInteractionRequest,
  ): Promise<Session> {
    const info = describeOrThrow();
    const what = kind === "login-pty" ? "login terminal" : "duplex channel";
    if (kind === "login-pty" ? !info.capabilities.loginPty : !info.capabilities.duplexChannels) {
      throw new ProviderFailure(`${providerName()} cannot run a ${what} (its component does not declare ${kind === "login-pty" ? "login-pty" : "duplex-channels"}); nothing was opened.`, "unsupported", "none");
    }
    const known = knownLease(params, what);
    await refuseIfPoisoned(known.base, params.providerLeaseId, `opening a ${what}`);
    const session = new Session(kind, params.hostRouteId, params.providerLeaseId, params.companyId, params.environmentId, request.terminal, info.capabilities.terminalResize ?? false);
    sessions.add(session);
    try {
      await sessionRecords.add(params.companyId, params.providerLeaseId, {
        hostRouteId: session.hostRouteId,
        workerSessionId: session.workerSessionId,
        kind,
        workerInstance,
        openedAt: new Date().toISOString(),
      });
    } catch (error) {
      sessions.remove(session);
      throw error;
    }
    const { ctx, secret } = prepare(known.base);
    const terminalText = new TextDecoder("utf-8");
    let stderrBytes = 0;
    let stderrHead = "";
    const onOutput = async (stream: OutputStream, chunk: Uint8Array) => {
      // Paperclip binds output to the session id its open reply carries: none goes out before it.
      await session.whenBound;
      if (!session.bound) return;
      if (session.kind === "login-pty") {
        // Pieces the host accepts (it drops a chunk above 1,000,000 characters).
        for (const piece of logPieces(terminalText.decode(chunk, { stream: true }))) context?.loginPty.output(session.hostRouteId, session.workerSessionId, piece);
      } else if (stream === "stderr") {
        // The channel is the command's stdout; its stderr is only logged (a little of it).
        if (stderrBytes < CHANNEL_STDERR_LOG_BYTES) stderrHead += Buffer.from(chunk.subarray(0, CHANNEL_STDERR_LOG_BYTES - stderrBytes)).toString("utf8");
        stderrBytes += chunk.byteLength;
      } else {
        // Frames the host accepts (it ends a route on a data notification above 262,144 base64 characters).
        for (let at = 0; at < chunk.byteLength; at += CHANNEL_FRAME_BYTES) {
          context?.duplexChannel.data(session.hostRouteId, session.workerSessionId, chunk.subarray(at, at + CHANNEL_FRAME_BYTES));
        }
      }
    };
    const running = start<WitExecuteResult>(kind, "interact", [ctx, toWitLease(params.providerLeaseId, known.metadata), request], secret, onOutput);
    session.attach(running as RunningInteraction<WitExecuteResult>);
    const finishOutput = () => {
      const rest = terminalText.decode();
      if (rest && session.kind === "login-pty" && session.bound) context?.loginPty.output(session.hostRouteId, session.workerSessionId, rest);
      if (stderrBytes > 0) context?.logger.warn(`The duplex channel ${session.workerSessionId} wrote ${stderrBytes} bytes to stderr, beginning: ${stderrHead}`);
    };
    // The outcome is written to `ctx.state` later, within a call of Paperclip (settleSession).
    // The exit waits for the open reply too (a process may end, silent, before it went out).
    session.ended = running.result.then(
      async (result) => {
        session.done = true;
        await session.whenBound;
        finishOutput();
        reportExit(session, result.exitCode ?? null, false);
      },
      async (error: unknown) => {
        session.done = true;
        await session.whenBound;
        finishOutput();
        // Ended by this worker with proof (stop, close, release, shutdown): not a transport loss.
        const cancelled = error instanceof ProviderFailure && error.kind === "cancelled";
        if (!cancelled) session.failure = error;
        reportExit(session, null, !cancelled);
        if (!cancelled) context?.logger.warn(`The ${what} ${session.workerSessionId} on lease ${params.providerLeaseId} failed: ${error instanceof Error ? error.message : String(error)}`);
      },
    );
    track(params.providerLeaseId, { cancel: () => session.cancel(), settled: session.ended });
    try {
      await Promise.race([running.started, running.result]);
    } catch (error) {
      session.abandon();
      await session.ended;
      sessions.remove(session);
      await settleSession(session, known.base);
      throw error;
    }
    // The reply is written when this hook's promise settles; output follows it.
    setImmediate(() => session.bind());
    return session;
  }

  /** Ends a session by its route (Paperclip's close): its end proven, its exit reported, then forgotten. */
  async function closeSession(kind: SessionKind, hostRouteId: unknown): Promise<Session | undefined> {
    const session = sessions.byRoute(hostRouteId);
    if (!session || session.kind !== kind) {
      // Closed before (or ended with its lease): acknowledged again, with the same pair.
      const closed = sessions.closedByRoute(hostRouteId);
      return closed?.kind === kind ? closed : undefined;
    }
    await session.end();
    await session.ended;
    sessions.remove(session);
    const known = leases.get(session.providerLeaseId);
    // Written now if Paperclip lets this call write its state, else by the next call on the lease.
    if (known) await settleSession(session, known.base).catch(() => {});
    return session;
  }

  /** Text input of a login terminal, as its UTF-8 bytes. */
  function textBytes(data: unknown): Uint8Array {
    if (typeof data !== "string") throw new ProviderFailure("Login terminal input must be a string; nothing was written.", "invalid-request", "none");
    return new TextEncoder().encode(data);
  }

  const loginPtyHooks = {
    async onLoginPtyOpen(params: PluginLoginPtyOpenParams) {
      const request = loginRequest(params.loginCommandKey, params.sessionHome);
      const session = await openSession("login-pty", params, request);
      return { workerSessionId: session.workerSessionId };
    },
    async onLoginPtyInput(params: PluginLoginPtyInputParams) {
      const bytes = textBytes(params.data);
      await sessions.find("login-pty", params.workerSessionId).write(bytes);
    },
    async onLoginPtyStop(params: PluginLoginPtyStopParams) {
      await sessions.find("login-pty", params.workerSessionId).end();
    },
    async onLoginPtyClose(params: PluginLoginPtyCloseParams) {
      await closeSession("login-pty", params.hostRouteId);
      return { hostRouteId: params.hostRouteId };
    },
  };

  const runnerIngressHooks = {
    /**
     * The in-sandbox runner's port opened (`open-port`) and handed to
     * Paperclip as an authenticated WebSocket (`runner-ingress.ts`; its
     * scheme is the provider's: `wss:` over TLS, `ws:` from our loopback
     * engine, which Paperclip 2026.916.1 refuses).
     */
    async onEnvironmentRunnerIngressEndpoint(params: PluginEnvironmentRunnerIngressEndpointParams) {
      checkCompany(params, params.lease?.metadata);
      const lease = leaseOf(params.lease);
      const port = runnerPort(params.port);
      const path = runnerPath(params.path);
      await refuseIfPoisoned(params, lease.providerLeaseId, "opening the runner's ingress");
      remember(params, lease.providerLeaseId, params.lease.metadata);
      const { ctx, secret } = prepare(params);
      const endpoint = await call<WitPortEndpoint>("open-port", "openPort", [ctx, lease, port], secret);
      return toRunnerIngress(endpoint, path, providerName());
    },
  };

  /**
   * Paperclip's custom-image flow over the component's templates
   * (`setup-sessions.ts`): a setup session is a lease; capture keeps its
   * files as a template; cancel destroys it; delete removes a template.
   */
  const templateHooks = {
    async onEnvironmentStartInteractiveSetup(params: PluginEnvironmentStartInteractiveSetupParams): Promise<PluginEnvironmentInteractiveSetupSession> {
      const source = typeof params.sourceTemplateRef === "string" && params.sourceTemplateRef !== "" ? params.sourceTemplateRef : componentSide(params.config).template;
      const lease = await acquireLease({ ...params, runId: `setup-${params.sessionId}` }, source);
      if (typeof lease.providerLeaseId !== "string") throw new ProviderFailure(`${providerName()} gave the setup lease no id.`, "invalid-response", "none");
      try {
        await setups.record(params.companyId, {
          providerLeaseId: lease.providerLeaseId,
          sessionId: params.sessionId,
          environmentId: params.environmentId,
          leaseMetadata: lease.metadata ?? {},
          expiresAt: lease.expiresAt ?? null,
          startedAt: new Date().toISOString(),
        });
      } catch (error) {
        // Unrecorded, the session could never be cancelled: its sandbox goes now.
        await destroy(params, lease.providerLeaseId, lease.metadata);
        throw error;
      }
      // No connection to hand out: the sandbox is reached through Paperclip's own calls, not SSH.
      return { providerLeaseId: lease.providerLeaseId, status: "waiting_for_user", connectionSummary: null, connectionPayload: null, expiresAt: lease.expiresAt ?? null };
    },

    async onEnvironmentGetInteractiveSetup(params: PluginEnvironmentGetInteractiveSetupParams): Promise<PluginEnvironmentInteractiveSetupSession> {
      const record = typeof params.providerLeaseId === "string" ? await setups.get(params.companyId, params.providerLeaseId) : null;
      if (!record || record.environmentId !== params.environmentId) {
        return { providerLeaseId: params.providerLeaseId ?? null, status: "missing", connectionSummary: null, connectionPayload: null };
      }
      if (await poison.get(params.companyId, record.providerLeaseId)) {
        return { providerLeaseId: record.providerLeaseId, status: "failed", connectionSummary: null, connectionPayload: null, expiresAt: record.expiresAt };
      }
      return { providerLeaseId: record.providerLeaseId, status: "waiting_for_user", connectionSummary: null, connectionPayload: null, expiresAt: record.expiresAt };
    },

    async onEnvironmentCaptureTemplate(params: PluginEnvironmentCaptureTemplateParams): Promise<PluginEnvironmentCaptureTemplateResult> {
      const record = await setupRecord(params, "capture a template");
      await refuseIfPoisoned(params, record.providerLeaseId, "capturing a template");
      await stopInFlight(record.providerLeaseId);
      const { ctx, secret } = prepare(params);
      const info = await call<WitTemplateInfo>("capture-template", "captureTemplate", [ctx, toWitLease(record.providerLeaseId, record.leaseMetadata), templateName(params.templateLabel)], secret);
      // The setup sandbox stays (paused) until Paperclip cancels the session, which it does after promoting the template.
      return { templateRef: info.templateRef, templateKind: TEMPLATE_KIND, metadata: { templateName: info.name, capturedAt: info.createdAt ?? null } };
    },

    async onEnvironmentCancelInteractiveSetup(params: PluginEnvironmentCancelInteractiveSetupParams): Promise<PluginEnvironmentCancelInteractiveSetupResult> {
      const record = typeof params.providerLeaseId === "string" ? await setups.get(params.companyId, params.providerLeaseId) : null;
      // Not a session of this worker's records (cancelled before, or never started): nothing to send.
      if (!record) return { status: "missing" };
      if (record.environmentId !== params.environmentId) throw foreignSetup();
      await destroy(params, record.providerLeaseId, record.leaseMetadata);
      await setups.clear(params.companyId, record.providerLeaseId);
      return { status: "cancelled" };
    },

    async onEnvironmentDeleteTemplate(params: PluginEnvironmentDeleteTemplateParams): Promise<PluginEnvironmentDeleteTemplateResult> {
      const { ctx, secret } = prepare(params);
      const outcome = await call<WitTemplateDeletion>("delete-template", "deleteTemplate", [ctx, params.templateRef], secret);
      // Either way the template is not there any more.
      return { deleted: true, metadata: { outcome } };
    },
  };

  const duplexChannelHooks = {
    async onDuplexChannelOpen(params: PluginDuplexChannelOpenParams) {
      const request = channelRequest(params.command);
      const session = await openSession("duplex-channel", params, request);
      return { hostRouteId: session.hostRouteId, workerSessionId: session.workerSessionId };
    },
    async onDuplexChannelWrite(params: PluginDuplexChannelWriteParams) {
      const session = sessions.find("duplex-channel", params.workerSessionId, params.hostRouteId);
      const bytes = decodeChannelBytes(params.data);
      if (bytes === null) throw new ProviderFailure("The duplex channel frame is not well-formed base64; nothing was written.", "invalid-request", "none");
      if (bytes.byteLength > 0) await session.write(bytes);
    },
    async onDuplexChannelStop(params: PluginDuplexChannelStopParams) {
      await sessions.find("duplex-channel", params.workerSessionId, params.hostRouteId).end();
    },
    async onDuplexChannelClose(params: PluginDuplexChannelCloseParams) {
      const session = await closeSession("duplex-channel", params.hostRouteId);
      // Paperclip's host closes by the route alone and checks the echoed session id of a bound route; a session whose open reply never went out was never bound.
      return session?.bound ? { hostRouteId: params.hostRouteId, workerSessionId: session.workerSessionId } : { hostRouteId: params.hostRouteId };
    },
  };

  return definePlugin({
    // Only what the component can do: Paperclip lists a hook's method as supported when it is defined.
    ...(packedCapabilities.loginPty ? loginPtyHooks : {}),
    ...(packedCapabilities.duplexChannels ? duplexChannelHooks : {}),
    ...(packedCapabilities.runnerIngress ? runnerIngressHooks : {}),
    ...(packedCapabilities.templates ? templateHooks : {}),
    async setup(ctx) {
      context = ctx;
      pool = new ProviderPool({
        size: options.poolSize,
        testTrapMarker: options.testTrapMarker,
        outputHighWaterChars: options.outputHighWaterChars,
        pacerBuffer: options.pacerBuffer,
        componentDir: options.componentDir,
        ledgerPath: options.rateLedgerPath ?? defaultLedgerPath(env),
      });
      // The packer stored describe()'s answer beside the component: the worker answers
      // `initialize` at once while the pool's first thread instantiates in the background.
      description =
        ((await packedDescription(options.componentDir)) as WitProviderDescription | undefined) ??
        (await pool.call<WitProviderDescription>("describe", []).result);
    },

    async onHealth() {
      const stats = pool?.stats;
      return {
        status: pool ? "ok" : "error",
        message: pool ? `${providerName()} provider component ready in ${stats?.threads} worker threads` : "not set up",
        details: {
          ...stats,
          rateLimitStarts: pool?.rateLimitStarts ?? 0,
          rateLimitWaits: pool?.rateLimitWaits ?? 0,
          rateLimitThrottled: pool?.rateLimitThrottled ?? 0,
          outputBacklogMaxChars: pool?.stats.outputBacklogMax ?? 0,
          runningCommands: [...inFlight.values()].reduce((n, set) => n + set.size, 0),
          interactiveSessions: sessions.size,
          interactionChecks: pool?.interactionChecks ?? 0,
        },
      };
    },

    async onShutdown() {
      const entries = [...inFlight.values()].flatMap((set) => [...set]);
      for (const entry of entries) entry.cancel();
      await Promise.race([
        Promise.allSettled(entries.map((entry) => entry.settled)),
        new Promise((resolve) => setTimeout(resolve, SHUTDOWN_WAIT_MS).unref()),
      ]);
      // Sessions ended with proof leave no record; where the host refuses the
      // write (or the end is not proven), the record poisons the lease at its next use.
      await Promise.allSettled(
        sessions.all().filter((session) => session.done).map((session) => {
          const known = leases.get(session.providerLeaseId);
          return known ? settleSession(session, known.base) : Promise.resolve();
        }),
      );
      await pool?.close();
    },

    async onEnvironmentValidateConfig(params: PluginEnvironmentValidateConfigParams) {
      const info = describeOrThrow();
      if (params.driverKey !== undefined && params.driverKey !== info.driverKey) {
        return { ok: false, errors: [`driverKey: this plugin provides "${info.driverKey}", not "${params.driverKey}"`] };
      }
      let side: ReturnType<typeof componentSide>;
      try {
        side = componentSide(params.config);
      } catch (error) {
        if (error instanceof ProviderFailure) return { ok: false, errors: [error.message] };
        throw error;
      }
      const split = splitConfig(side.config, info, operator);
      if (split.errors.length > 0) return { ok: false, errors: split.errors };
      const validation = await call<WitConfigValidation>("validate", "validateConfig", [JSON.stringify(split.componentConfig)], undefined);
      if (!validation.ok || validation.normalizedConfig === undefined) {
        return { ok: false, warnings: validation.warnings, errors: validation.errors };
      }
      const originProblem = checkAskedOrigins(validation.apiOrigins, split.routes);
      if (originProblem) return { ok: false, warnings: validation.warnings, errors: [originProblem] };
      const normalizedConfig = JSON.parse(validation.normalizedConfig) as Record<string, unknown>;
      // Secret-ref fields go back exactly as Paperclip gave them.
      for (const field of info.secrets) {
        if (params.config && field.configField in params.config) normalizedConfig[field.configField] = params.config[field.configField];
      }
      // The host's own field (the environment's template) goes back as given.
      if (side.template !== undefined) normalizedConfig[TEMPLATE_FIELD] = side.template;
      return { ok: true, warnings: validation.warnings, normalizedConfig };
    },

    async onEnvironmentProbe(params: PluginEnvironmentProbeParams) {
      const { ctx, secret } = prepare(params);
      try {
        const report = await call<WitProbeReport>("probe", "probe", [ctx], secret);
        return {
          ok: report.ok,
          summary: report.summary,
          diagnostics: report.diagnostics.map((message) => ({ severity: report.ok ? ("info" as const) : ("warning" as const), message })),
        };
      } catch (error) {
        if (!(error instanceof ProviderFailure)) throw error;
        return { ok: false, summary: error.message, diagnostics: [{ severity: "error" as const, message: error.message, code: error.kind }] };
      }
    },

    async onEnvironmentAcquireLease(params: PluginEnvironmentAcquireLeaseParams) {
      return acquireLease(params, componentSide(params.config).template);
    },

    async onEnvironmentResumeLease(params: PluginEnvironmentResumeLeaseParams) {
      checkCompany(params, params.leaseMetadata);
      await refuseIfPoisoned(params, params.providerLeaseId, "resume");
      const { ctx, secret } = prepare(params);
      if (packedCapabilities.templates) {
        // The environment's template is the host's field: a lease started from another one is not what this config asks for.
        const wanted = componentSide(params.config).template ?? null;
        const had = typeof params.leaseMetadata?.[TEMPLATE_FIELD] === "string" ? params.leaseMetadata[TEMPLATE_FIELD] : null;
        if (wanted !== had) {
          return { providerLeaseId: null, metadata: { expired: true, reason: "the environment's template changed since the lease was acquired" } };
        }
      }
      // A config that changed since the acquire is the component's to judge (its resume answers `expired`).
      const outcome = await call<WitResumeOutcome>("resume", "resumeLease", [ctx, toWitLease(params.providerLeaseId, params.leaseMetadata)], secret);
      let answer = toResumeResult(outcome, params.companyId);
      if (answer.providerLeaseId !== null && params.leaseMetadata?.[RUN_GRANTS_KEY] === true) {
        // The grants were the acquiring run's (task-scoped), and Paperclip's
        // resume names no run: the sandbox goes back to the environment's
        // base policy before it is handed to whoever reuses it. A failure
        // is an error (Paperclip then destroys the lease and acquires anew).
        const reset = await call<WitLease>("set-egress", "setEgress", [ctx, toWitLease(answer.providerLeaseId, answer.metadata), baseEgress(params.config)], secret);
        answer = toPaperclipLease(reset, params.companyId);
      }
      if (packedCapabilities.templates && answer.providerLeaseId !== null) answer.metadata = { ...answer.metadata, [TEMPLATE_FIELD]: params.leaseMetadata?.[TEMPLATE_FIELD] ?? null };
      remember(params, answer.providerLeaseId, answer.metadata);
      return answer;
    },

    async onEnvironmentReleaseLease(params: PluginEnvironmentReleaseLeaseParams) {
      // A lease without a sandbox (its acquire failed): what that acquire left behind goes now.
      if (params.providerLeaseId === null || params.providerLeaseId === undefined) return sweepOrphans(params);
      const providerLeaseId = params.providerLeaseId;
      checkCompany(params, params.leaseMetadata);
      // Commands and sessions still running on the lease are cancelled and their trees confirmed gone first.
      await stopInFlight(providerLeaseId);
      await poisonStrandedSessions(params, providerLeaseId);
      if (await poison.get(params.companyId, providerLeaseId)) {
        // Never pause a poisoned lease: delete it, which is also what clears it.
        return destroy(params, providerLeaseId, params.leaseMetadata);
      }
      const { ctx, secret } = prepare(params);
      try {
        const receipt = await call<WitTerminationReceipt>("release", "releaseLease", [ctx, toWitLease(providerLeaseId, params.leaseMetadata)], secret);
        await forgetSessions(params, providerLeaseId);
        return toReceipt(receipt);
      } catch (error) {
        await poisonOnFailure(params, providerLeaseId, error);
        throw error;
      }
    },

    async onEnvironmentDestroyLease(params: PluginEnvironmentDestroyLeaseParams) {
      if (params.providerLeaseId === null || params.providerLeaseId === undefined) return sweepOrphans(params);
      checkCompany(params, params.leaseMetadata);
      return destroy(params, params.providerLeaseId, params.leaseMetadata);
    },

    async onEnvironmentRealizeWorkspace(params: PluginEnvironmentRealizeWorkspaceParams) {
      checkCompany(params, params.lease?.metadata);
      const lease = leaseOf(params.lease);
      await refuseIfPoisoned(params, lease.providerLeaseId, "realizing a workspace");
      remember(params, lease.providerLeaseId, params.lease.metadata);
      const { ctx, secret } = prepare(params);
      const cwd = await call<string>("realize", "realizeWorkspace", [ctx, lease, { remotePath: params.workspace?.remotePath ?? undefined }], secret);
      return { cwd, metadata: {} };
    },

    async onEnvironmentExecute(params: PluginEnvironmentExecuteParams) {
      checkCompany(params, params.lease?.metadata);
      const lease = leaseOf(params.lease);
      await refuseIfPoisoned(params, lease.providerLeaseId, "execute");
      remember(params, lease.providerLeaseId, params.lease.metadata);
      const { ctx, secret } = prepare(params);
      const log = context?.execution;
      // Output arrives on worker-thread message events; bind the callback to this
      // call's async context so the SDK stamps the chunk with this invocation's id.
      // A sink that returns a promise is awaited piece by piece (the pool holds the component meanwhile).
      const text = new LiveText();
      const emit = AsyncResource.bind(async (stream: OutputStream, chunk: Uint8Array) => {
        // `execute` has no terminal: its output is stdout and stderr only.
        const name = stream === "stderr" ? "stderr" : "stdout";
        for (const piece of logPieces(text.push(name, chunk))) await (log?.log(name, piece) as unknown);
      });
      // After the last chunk was delivered (the result waits for it): an
      // incomplete character left at the end, unless the log stopped
      // taking output (its loss is reported instead).
      const finish = AsyncResource.bind(async () => {
        if (running.sinkFailure() !== undefined || running.unconsumedBytes() > 0) return;
        for (const [stream, rest] of text.finish()) await (log?.log(stream, rest) as unknown);
      });
      const running = start<WitExecuteResult>("execute", "execute", [ctx, lease, toExecuteRequest(params)], secret, emit);
      const settled = running.result.then(
        async (result) => {
          // A log that fails on this last piece loses at most a U+FFFD.
          await finish().catch(() => {});
          return toExecuteResult(result);
        },
        async (error: unknown) => {
          await finish().catch(() => {});
          await poisonOnFailure(params, lease.providerLeaseId, error);
          throw error;
        },
      );
      track(lease.providerLeaseId, { cancel: running.cancel, settled });
      return settled;
    },

    async onEnvironmentSyncIn(params: PluginEnvironmentSyncInParams) {
      checkCompany(params, params.lease?.metadata);
      const lease = leaseOf(params.lease);
      await refuseIfPoisoned(params, lease.providerLeaseId, "sync-in");
      return { operations: await syncIn(params.operations, syncBackend(params, lease)) };
    },

    async onEnvironmentSyncOut(params: PluginEnvironmentSyncOutParams) {
      checkCompany(params, params.lease?.metadata);
      const lease = leaseOf(params.lease);
      await refuseIfPoisoned(params, lease.providerLeaseId, "sync-out");
      return { operations: await syncOut(params.operations, syncBackend(params, lease)) };
    },
  });
}
