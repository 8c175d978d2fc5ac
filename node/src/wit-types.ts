/**
 * The WIT types of `sandbox:provider@0.2.0` (`../wit/since_v0.2.0/types.wit`) as jco
 * lowers them to JavaScript: records are camelCase objects, variants are
 * `{tag, val}`, options are `value | undefined`, `u64` is `bigint`,
 * `list<u8>` is `Uint8Array`, flags are objects of booleans.
 *
 * Only the shapes this package reads or builds are spelled out.
 */

/** `environment-context`. */
export interface WitEnvironmentContext {
  driverKey: string;
  companyId: string;
  environmentId: string;
  issueId?: string;
  /** The normalised config as JSON, with the secret fields removed. */
  config: string;
}

/** `secret-field`. */
export interface WitSecretField {
  configField: string;
  header: string;
  envVar?: string;
}

/** `capabilities` flags. */
export interface WitCapabilities {
  reusableLeases: boolean;
  incrementalOutput: boolean;
  nativeSync: boolean;
  loginPty: boolean;
  duplexChannels: boolean;
}

/** `provider-description`. */
export interface WitProviderDescription {
  driverKey: string;
  displayName: string;
  configSchema: string;
  capabilities: WitCapabilities;
  secrets: WitSecretField[];
  /** The API's request budget per origin; none when the API has no limit. */
  rateLimit?: WitRateLimit;
}

/** `rate-limit`: at most `requests` starts in any sliding `windowMs`, and optionally `perSecond` in any second. */
export interface WitRateLimit {
  requests: number;
  windowMs: number;
  perSecond?: number;
}

/** `config-validation`. */
export interface WitConfigValidation {
  ok: boolean;
  warnings: string[];
  errors: string[];
  normalizedConfig?: string;
  /** The origins the config names, in the provider's `origin-fields` order. */
  apiOrigins: string[];
  /** The provider's plan for this config (contract 0.2.0). */
  budget?: WitOperationBudget;
}

/** `operation-budget`. */
export interface WitOperationBudget {
  operationMs: bigint;
  requestMs: bigint;
}

/** `lease`. */
export interface WitLease {
  providerLeaseId: string;
  metadata: string;
  expiresAt?: string;
}

/** `acquire-request`. */
export interface WitAcquireRequest {
  runId: string;
  requestedCwd?: string;
  workspaceMode?: string;
  requestedExpiresAt?: string;
}

/** `resume-outcome`. */
export type WitResumeOutcome = { tag: "resumed"; val: WitLease } | { tag: "expired"; val: string };

/** `termination-action`. */
export type WitTerminationAction = "paused" | "deleted" | "already-gone";

/** `termination-receipt`. */
export interface WitTerminationReceipt {
  sandboxId: string;
  action: WitTerminationAction;
}

/** `probe-report`. */
export interface WitProbeReport {
  ok: boolean;
  summary: string;
  diagnostics: string[];
}

/** `execute-request`. */
export interface WitExecuteRequest {
  command: string;
  args: string[];
  cwd?: string;
  env: [string, string][];
  stdin?: Uint8Array;
  timeoutMs?: bigint;
}

/** `execute-result`. */
export interface WitExecuteResult {
  exitCode?: number;
  signal?: string;
  timedOut: boolean;
  stdout: string;
  stderr: string;
  processId: string;
  outputTruncated: boolean;
}

/** `file-upload`. */
export interface WitFileUpload {
  remotePath: string;
  contents: Uint8Array;
}

/** `file-download`. */
export interface WitFileDownload {
  remotePath: string;
  contents: Uint8Array;
}

/** `sync-report`. */
export interface WitSyncReport {
  files: number;
  bytes: bigint;
}

/** `partial-output`. */
export interface WitPartialOutput {
  stdout: string;
  stderr: string;
  timedOut: boolean;
  outputTruncated: boolean;
}

/** `cleanup-phase`. */
export type WitCleanupPhase = "process-creation" | "process-termination" | "lease-setup" | "sandbox-deletion";

/** `cleanup-cause`. */
export type WitCleanupCause =
  | { tag: "http-status"; val: number }
  | { tag: "transport"; val: string }
  | { tag: "deadline" }
  | { tag: "tree-still-running" }
  | { tag: "invalid-response"; val: string };

/** `cleanup-failure`. */
export interface WitCleanupFailure {
  sandboxId?: string;
  processId?: string;
  phase: WitCleanupPhase;
  cause: WitCleanupCause;
  partial?: WitPartialOutput;
}

/** `transport-kind`. */
export type WitTransportKind = "denied" | "unreachable" | "connection" | "deadline" | "other";

/** `provider-error`. */
export type WitProviderError =
  | { tag: "invalid-config"; val: string[] }
  | { tag: "invalid-request"; val: string }
  | { tag: "foreign-lease"; val: string }
  | { tag: "unsupported"; val: string }
  | { tag: "api-rejected"; val: { operation: string; status: number; partial?: WitPartialOutput } }
  | { tag: "transport-failed"; val: { operation: string; kind: WitTransportKind; detail: string; partial?: WitPartialOutput } }
  | { tag: "invalid-response"; val: { operation: string; reason: string; partial?: WitPartialOutput } }
  | { tag: "cancelled"; val?: WitPartialOutput }
  | { tag: "cleanup-failed"; val: WitCleanupFailure };

/** The operations of `sandbox:provider/provider` the pool can call. */
export type ProviderOperation =
  | "describe"
  | "validateConfig"
  | "probe"
  | "acquireLease"
  | "resumeLease"
  | "releaseLease"
  | "destroyLease"
  | "realizeWorkspace"
  | "syncIn"
  | "syncOut"
  | "execute";
