/**
 * The environment policy of an acquire (contract 0.7.0) as Paperclip asks
 * for it: the run's adapter, and the egress policy made of the
 * environment's base allow-list (the config's `egressAllowlist`, which the
 * component reads itself) and the run's task-scoped grants
 * (`executionWorkspaceSettings.networkEgress`: `allowFqdns`, `allowCidrs`).
 * Everything here is decided before any request; nothing names a provider.
 */
import { ProviderFailure } from "./mapping.js";
import type { WitAcquireRequest, WitCapabilities } from "./wit-types.js";

/** The egress policy of an acquire request (the WIT `egress-policy`). */
export type EgressPolicy = NonNullable<WitAcquireRequest["egress"]>;

/** The config field of the environment's base allow-list (both providers read it). */
export const BASE_EGRESS_FIELD = "egressAllowlist";

/** A list of strings from a setting, or a typed refusal naming it. */
function stringList(value: unknown, name: string): string[] {
  if (value === undefined || value === null) return [];
  if (!Array.isArray(value) || value.some((entry) => typeof entry !== "string")) {
    throw new ProviderFailure(`${name} must be a list of strings; nothing was created.`, "invalid-request", "none");
  }
  return value as string[];
}

/**
 * The run's task-scoped egress grants: `allowFqdns` then `allowCidrs`, as
 * given (Paperclip has checked them: host names without scheme or path,
 * public IPv4 ranges). None when the run asks for none.
 */
export function runEgressGrants(settings: Record<string, unknown> | null | undefined): string[] {
  const egress = settings?.networkEgress;
  if (egress === undefined || egress === null) return [];
  if (typeof egress !== "object" || Array.isArray(egress)) {
    throw new ProviderFailure("executionWorkspaceSettings.networkEgress must be an object; nothing was created.", "invalid-request", "none");
  }
  const { allowFqdns, allowCidrs } = egress as Record<string, unknown>;
  return [
    ...stringList(allowFqdns, "executionWorkspaceSettings.networkEgress.allowFqdns"),
    ...stringList(allowCidrs, "executionWorkspaceSettings.networkEgress.allowCidrs"),
  ];
}

/**
 * The egress policy to acquire with, or none:
 * - no grants: none, so the component applies the config's base list itself
 *   (and the service's default where there is none);
 * - grants and a base list of `["*"]` (everything): `unrestricted`, since a
 *   grant adds nothing to everything;
 * - grants otherwise: `allow` of the base list and the grants, in that
 *   order, without repeats. With no base list that is the grants alone: a
 *   run that names what it needs gets exactly that, as Paperclip's
 *   Kubernetes and CreateOS peers give it.
 * The component normalises the list once more and refuses an entry its
 * service cannot enforce, before anything is created.
 */
export function mergedEgress(config: Record<string, unknown> | null | undefined, settings: Record<string, unknown> | null | undefined): EgressPolicy | undefined {
  const grants = runEgressGrants(settings);
  if (grants.length === 0) return undefined;
  const base = stringList(config?.[BASE_EGRESS_FIELD], `The config's ${BASE_EGRESS_FIELD}`).map((entry) => entry.trim());
  if (base.includes("*")) return { tag: "unrestricted" };
  const seen = new Set<string>();
  const entries: string[] = [];
  for (const entry of [...base, ...grants.map((grant) => grant.trim())]) {
    const key = entry.toLowerCase();
    if (seen.has(key)) continue;
    seen.add(key);
    entries.push(entry);
  }
  return { tag: "allow", val: entries };
}

/** A policy in words, for messages. */
function policyText(policy: EgressPolicy): string {
  if (policy.tag === "allow") return `only ${policy.val.join(", ")}`;
  return policy.tag === "block-all" ? "no outbound connection" : "the service's default";
}

/**
 * Refuses, before anything is created, a policy the component cannot
 * enforce: any but `unrestricted` from a component without `egress-policy`
 * (it would start a sandbox that reaches more than the run was granted).
 * `provider` is its display name.
 */
export function checkEgressSupported(policy: EgressPolicy | undefined, capabilities: WitCapabilities, provider: string): EgressPolicy | undefined {
  if (policy === undefined) return undefined;
  if (capabilities.egressPolicy) return policy;
  // Without the capability the contract lets a host send `unrestricted` only: that is the default anyway.
  if (policy.tag === "unrestricted") return undefined;
  throw new ProviderFailure(
    `${provider} cannot enforce an egress policy (its component does not declare egress-policy), and this run's networkEgress grants ask for ${policyText(policy)}; nothing was created. Remove the run's networkEgress grants or use a provider that enforces egress.`,
    "unsupported",
    "none",
  );
}

/** The lease metadata key saying the lease's egress holds its acquiring run's grants. */
export const RUN_GRANTS_KEY = "runEgressGrants";

/**
 * The environment's own policy, without any run's grants: `allow` of the
 * base list, or `unrestricted` with none (or `["*"]`). What a reused
 * lease goes back to, since a run's grants are task-scoped.
 */
export function baseEgress(config: Record<string, unknown> | null | undefined): EgressPolicy {
  const base = stringList(config?.[BASE_EGRESS_FIELD], `The config's ${BASE_EGRESS_FIELD}`).map((entry) => entry.trim());
  if (base.length === 0 || base.includes("*")) return { tag: "unrestricted" };
  return { tag: "allow", val: base };
}
