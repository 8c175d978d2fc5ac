/**
 * The WIT types of `sandbox:provider@0.7.0` as jco lowers them to
 * JavaScript, generated from the WIT itself (`scripts/wit-types.mjs` runs
 * jco's type generator on `../wit/since_v0.7.0` into `src/generated/`
 * before `tsc`). This module only gives them the names the host code uses:
 * records are camelCase objects, variants `{tag, val}`, options
 * `value | undefined`, `u64` is `bigint`, `list<u8>` is `Uint8Array`,
 * flags are objects of optional booleans.
 */
import type * as Provider from "./generated/interfaces/sandbox-provider-provider.js";

export type {
  EnvironmentContext as WitEnvironmentContext,
  SecretField as WitSecretField,
  OriginField as WitOriginField,
  Capabilities as WitCapabilities,
  ProviderDescription as WitProviderDescription,
  RateLimit as WitRateLimit,
  ConfigValidation as WitConfigValidation,
  OperationBudget as WitOperationBudget,
  Lease as WitLease,
  AcquireRequest as WitAcquireRequest,
  ResumeOutcome as WitResumeOutcome,
  TerminationAction as WitTerminationAction,
  TerminationReceipt as WitTerminationReceipt,
  WorkspaceRequest as WitWorkspaceRequest,
  ProbeReport as WitProbeReport,
  ExecuteRequest as WitExecuteRequest,
  ExecuteResult as WitExecuteResult,
  InteractionRequest as WitInteractionRequest,
  InteractionEvent as WitInteractionEvent,
  InteractionSignal as WitInteractionSignal,
  TerminalSize as WitTerminalSize,
  FileUpload as WitFileUpload,
  FileDownload as WitFileDownload,
  SyncReport as WitSyncReport,
  PartialOutput as WitPartialOutput,
  CleanupPhase as WitCleanupPhase,
  CleanupCause as WitCleanupCause,
  CleanupFailure as WitCleanupFailure,
  TransportKind as WitTransportKind,
  OutputLoss as WitOutputLoss,
  ProviderError as WitProviderError,
  EgressPolicy as WitEgressPolicy,
  PortEndpoint as WitPortEndpoint,
  TemplateInfo as WitTemplateInfo,
  TemplateDeletion as WitTemplateDeletion,
} from "./generated/interfaces/sandbox-provider-types.js";

/** The operations of `sandbox:provider/provider` the pool can call (the generated export names). */
export type ProviderOperation = keyof typeof Provider;
