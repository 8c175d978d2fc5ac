// The packer: turns any `sandbox-provider` component (contract 0.7.0, or
// 0.6.0 without its environment policy operations, or
// 0.5.0 without `provider.interact`, or 0.4.0 without `execute-request.result-chars`, or 0.3.0 whose live output
// is text, or 0.2.0 which also lacks `provider-error.output-lost`) into
// a Paperclip plugin package. Everything provider-specific comes from the
// component's describe(); the host code (../dist/*.js, built by tsc) is the
// same for every package. Used by scripts/pack.mjs (the command) and by
// scripts/build-dev.mjs (the development copy in ../dist).
import { execFileSync } from "node:child_process";
import { cpSync, existsSync, mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync, statSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import path from "node:path";
import { fileURLToPath, pathToFileURL } from "node:url";

const nodeDir = fileURLToPath(new URL("..", import.meta.url));
const hostDist = path.join(nodeDir, "dist");
/** The current contract version this host speaks. */
export const CONTRACT_VERSION = "0.7.0";
/**
 * Every contract version this host loads, newest first (jco keys imports
 * without their version, so one set of imports serves them all). 0.7.0
 * added the environment policy (egress, images, templates, idle pause,
 * ports: optional acquire fields this host leaves unset, and operations it
 * does not call yet) and `termination-action.idle-pause`, mapped like
 * `paused`; it changed no import, so a 0.6.0 component is served by the
 * same imports. 0.6.0
 * only added `provider.interact` and three host imports for it, which this
 * host provides without ever calling `interact` yet (Paperclip's login PTY
 * and duplex channel hooks come later): `interaction-events` is a pollable
 * that never becomes ready, `next-interaction-event` has none, and
 * `interaction-started` does nothing; so a 0.5.0 component is served by
 * the same imports. 0.5.0 only added `execute-request.result-chars`, which this host leaves unset
 * (Paperclip's result carries the output's text), so a 0.4.0 component
 * gets the same request without it. 0.4.0 only changed `host.emit-output` to carry bytes (`list<u8>`, a
 * `Uint8Array`) where 0.3.0 carries text (a string), which the provider
 * thread takes both ways; 0.3.0 only added the `provider-error.output-lost`
 * case, so a 0.2.0 component's values are 0.3.0 values as they are.
 */
export const SERVED_VERSIONS = [CONTRACT_VERSION, "0.6.0", "0.5.0", "0.4.0", "0.3.0", "0.2.0"];
/** The interface every provider exports. */
const PROVIDER_EXPORT = "sandbox:provider/provider";
/** How long describe() may take before the packer gives up. */
const DESCRIBE_TIMEOUT_MS = 60_000;

/**
 * What a driver's package does not offer Paperclip although its component
 * carries it, each with why (the manifest does not declare it). Nothing
 * today: Daytona's duplex channel was held back while its e2e agent run
 * stalled, which was the Node host's events pollable saying nothing waits
 * while events queued together did (`src/interaction-channel.ts`).
 */
export const HELD_BACK = {};

/** A refusal the packer explains in words (no stack trace). */
export class PackError extends Error {
  constructor(message) {
    super(message);
    this.name = "PackError";
  }
}

async function hostModule(name) {
  const file = path.join(hostDist, name);
  if (!existsSync(file)) throw new PackError(`The host code is not built (${file} is missing): run \`npm run build\` in node/ first.`);
  return import(pathToFileURL(file).href);
}

/**
 * The contract version `wasm` (bytes) exports, or a PackError saying why it
 * is not a sandbox-provider component at all.
 */
export async function contractVersionOf(bytes, name) {
  if (bytes.length < 8 || bytes[0] !== 0 || bytes[1] !== 0x61 || bytes[2] !== 0x73 || bytes[3] !== 0x6d) {
    throw new PackError(`${name} is not a WebAssembly file.`);
  }
  // Byte 4..7: version and layer; a component has layer 1 (`0d 00 01 00`).
  if (!(bytes[6] === 1 && bytes[7] === 0)) {
    throw new PackError(`${name} is a core WebAssembly module, not a component: build the provider for wasm32-wasip2 (see ../build.sh) or wrap it with \`wasm-tools component new\`.`);
  }
  const { componentWit } = await import("@bytecodealliance/jco-transpile/wasm-tools");
  let wit;
  try {
    wit = await componentWit(bytes);
  } catch (error) {
    throw new PackError(`${name} is not a valid WebAssembly component (${String(error?.message ?? error).split("\n")[0]}).`);
  }
  const exported = [...wit.matchAll(/^\s*export\s+([^;]+);/gm)].map((m) => m[1].trim());
  const provider = exported.find((e) => e === PROVIDER_EXPORT || e.startsWith(`${PROVIDER_EXPORT}@`));
  if (!provider) {
    throw new PackError(
      `${name} does not export ${PROVIDER_EXPORT} (it exports ${exported.length ? exported.join(", ") : "nothing"}), so it has no describe() to pack from: it is not a sandbox-provider component.`,
    );
  }
  const version = provider.includes("@") ? provider.slice(provider.indexOf("@") + 1) : "";
  return version;
}

/** Transpiles `wasm` into `outDir` with jco (instantiation mode; files named `provider.*`). */
export async function transpile(wasm, outDir) {
  const { COMPONENT_NAME } = await hostModule("component-name.js");
  rmSync(outDir, { recursive: true, force: true });
  const bin = path.join(nodeDir, "node_modules", ".bin", "jco");
  try {
    execFileSync(process.execPath, [bin, "transpile", wasm, "-o", outDir, "--name", COMPONENT_NAME, "--instantiation", "async", "--no-typescript", "--quiet"], {
      stdio: ["ignore", "ignore", "pipe"],
    });
  } catch (error) {
    throw new PackError(`jco could not transpile ${wasm}: ${String(error.stderr ?? error.message).trim().split("\n").slice(0, 3).join(" ")}`);
  }
}

/** Calls describe() of the transpiled component in `componentDir`. */
export async function describeComponent(componentDir, name) {
  const { ProviderPool } = await hostModule("pool.js");
  const ledgerDir = mkdtempSync(path.join(tmpdir(), "paperclip-wasm-pack-"));
  const pool = new ProviderPool({
    size: 1,
    componentDir: pathToFileURL(componentDir + path.sep).href,
    ledgerPath: path.join(ledgerDir, "rate-budget.sqlite"),
  });
  let timer;
  try {
    const described = pool.call("describe", []).result;
    const timeout = new Promise((_, reject) => {
      timer = setTimeout(() => reject(new PackError(`describe() of ${name} did not answer within ${DESCRIBE_TIMEOUT_MS / 1000} s.`)), DESCRIBE_TIMEOUT_MS);
    });
    return await Promise.race([described, timeout]);
  } catch (error) {
    if (error instanceof PackError) throw error;
    const reason = error?.failure?.message ?? error?.message ?? String(error);
    throw new PackError(`describe() of ${name} failed (${reason}); a provider's describe() must answer without any request.`);
  } finally {
    clearTimeout(timer);
    await pool.close();
    rmSync(ledgerDir, { recursive: true, force: true });
  }
}

/** Checks a description and returns the manifest, or a PackError listing every problem. */
export async function manifestFor(description, facts, name) {
  const { descriptionProblems, buildManifest } = await hostModule("manifest-builder.js");
  const shaped =
    typeof description === "object" &&
    description !== null &&
    Array.isArray(description.secrets) &&
    Array.isArray(description.originFields) &&
    typeof description.capabilities === "object";
  const problems = shaped
    ? descriptionProblems(description)
    : [`it answered ${JSON.stringify(description)?.slice(0, 200)}, not a provider-description`];
  if (problems.length > 0) {
    throw new PackError(`describe() of ${name} is not usable:\n${problems.map((p) => `  - ${p}`).join("\n")}`);
  }
  const manifest = buildManifest(description, facts);
  const { pluginManifestV1Schema } = await import("@paperclipai/shared");
  const checked = pluginManifestV1Schema.safeParse(manifest);
  if (!checked.success) {
    throw new PackError(
      `The manifest built from describe() of ${name} is not valid for Paperclip:\n${checked.error.issues.map((i) => `  - ${i.path.join(".")}: ${i.message}`).join("\n")}`,
    );
  }
  return manifest;
}

/** The text of `dist/manifest.js`. */
export function manifestModule(manifest, source) {
  return `// Generated by node/scripts/pack.mjs from describe() of ${source}; do not edit.\nconst manifest = ${JSON.stringify(manifest, null, 2)};\nexport default manifest;\n`;
}

/**
 * The version of the provider crate that built `wasm`, when it is one of
 * this repository's (`<name>_provider.wasm`, with `providers/<name>/Cargo.toml`
 * beside node/), else undefined. A component carries no version of its own
 * in `describe()`; the `sandbox` CLI names an embedded one by this same
 * crate version.
 */
export function crateVersionOf(wasm) {
  const match = /^([a-z0-9-]+)_provider\.wasm$/.exec(path.basename(wasm));
  if (!match) return undefined;
  const toml = path.join(nodeDir, "..", "providers", match[1], "Cargo.toml");
  if (!existsSync(toml)) return undefined;
  const section = readFileSync(toml, "utf8").split(/^\[/m).find((s) => s.startsWith("package]"));
  return /^version\s*=\s*"([^"]+)"/m.exec(section ?? "")?.[1];
}

/** Exact semver: what a package's dependencies and its own version must be. */
const EXACT_VERSION = /^\d+\.\d+\.\d+(-[0-9A-Za-z.-]+)?$/;

/**
 * `npm-shrinkwrap.json` for a package whose `dependencies` are `deps`: the
 * entries of node/package-lock.json those dependencies reach (their
 * dependencies, optional ones and required peers, found as npm finds them,
 * in the nearest node_modules up the tree), each with its exact version
 * and integrity (the lockfile names no registry: npm fetches from the one
 * it is configured with and checks the bytes). npm installs exactly these wherever the package is
 * installed (`npm ci --omit=dev` in an unpacked copy, or as a dependency),
 * so a packed plugin runs on the very packages its tests ran on.
 */
export function shrinkwrapFor(root) {
  const lockFile = path.join(nodeDir, "package-lock.json");
  if (!existsSync(lockFile)) throw new PackError(`${lockFile} is missing: the packages a plugin pins come from node/'s lockfile.`);
  const lock = JSON.parse(readFileSync(lockFile, "utf8"));
  const entries = lock.packages ?? {};
  const find = (from, name) => {
    for (let base = from; ; ) {
      const key = `${base ? `${base}/` : ""}node_modules/${name}`;
      if (entries[key] && !entries[key].link) return key;
      if (!base) return undefined;
      base = base.slice(0, base.lastIndexOf("node_modules/")).replace(/\/$/, "");
    }
  };
  const packages = { "": { name: root.name, version: root.version, license: root.license, dependencies: root.dependencies, engines: root.engines } };
  const queue = Object.keys(root.dependencies).map((name) => ["", name, root.name]);
  while (queue.length > 0) {
    const [from, name, neededBy] = queue.shift();
    const key = find(from, name);
    if (!key) throw new PackError(`node/package-lock.json has no entry for ${name} (needed by ${neededBy}): run \`npm install\` in node/ and pack again.`);
    if (packages[key]) continue;
    const { dev, devOptional, ...entry } = entries[key];
    if (!EXACT_VERSION.test(entry.version ?? "") || !entry.integrity) {
      throw new PackError(`node/package-lock.json's entry ${key} has no exact version and integrity; a packed plugin pins each package it installs.`);
    }
    packages[key] = entry;
    const optionalPeers = entry.peerDependenciesMeta ?? {};
    const needs = [
      ...Object.keys(entry.dependencies ?? {}),
      ...Object.keys(entry.optionalDependencies ?? {}),
      ...Object.keys(entry.peerDependencies ?? {}).filter((peer) => !optionalPeers[peer]?.optional),
    ];
    for (const dependency of needs) queue.push([key, dependency, entry.name ?? key.slice(key.lastIndexOf("node_modules/") + "node_modules/".length)]);
  }
  // npm skips an optional package it cannot find; every optional one here is in the lockfile already.
  return { name: root.name, version: root.version, lockfileVersion: 3, requires: true, packages };
}

/** The host code files a package carries (compiled JS only; no manifest, no component, no types). */
function hostFiles() {
  return readdirSync(hostDist).filter((f) => f.endsWith(".js") && f !== "manifest.js" && statSync(path.join(hostDist, f)).isFile());
}

/**
 * Packs `component` (a .wasm path) into a Paperclip plugin package in `out`
 * (default `packages/<driver key>` under node/). With `devCopy`, writes
 * only `dist/component/` and `dist/manifest.js` of node/ itself (the copy
 * the tests run). Returns `{out, manifest, description, contract}`.
 */
export async function pack({ component, out, version, devCopy = false, log = () => {} }) {
  if (version !== undefined && !EXACT_VERSION.test(version)) throw new PackError(`--version ${version} is not a version (MAJOR.MINOR.PATCH).`);
  const wasm = path.resolve(component);
  const name = path.basename(wasm);
  if (!existsSync(wasm) || !statSync(wasm).isFile()) throw new PackError(`The component ${wasm} does not exist. Build it first (./build.sh at the repository root builds the bundled providers).`);
  const bytes = readFileSync(wasm);
  const contract = await contractVersionOf(bytes, name);
  if (!SERVED_VERSIONS.includes(contract)) {
    throw new PackError(
      `${name} is built for the sandbox-provider contract ${contract || "without a version"}; this host speaks ${SERVED_VERSIONS.slice(0, -1).join(", ")} and ${SERVED_VERSIONS.at(-1)} only. Rebuild the provider against wit/since_v${CONTRACT_VERSION} (the provider SDK's current version).`,
    );
  }
  const staging = mkdtempSync(path.join(tmpdir(), "paperclip-wasm-pack-"));
  try {
    const componentDir = path.join(staging, "component");
    await transpile(wasm, componentDir);
    const description = await describeComponent(componentDir, name);
    const pkg = JSON.parse(readFileSync(path.join(nodeDir, "package.json"), "utf8"));
    // The plugin's version is the component's: named, else its crate's, else (a component from elsewhere) the host's.
    const pluginVersion = version ?? crateVersionOf(wasm) ?? pkg.version;
    const versionSource = version ? "as named" : crateVersionOf(wasm) ? "its crate's" : "the host's: pass --version to name the component's";
    const manifest = await manifestFor(description, { version: pluginVersion, author: pkg.author, heldBack: HELD_BACK[description.driverKey] }, name);
    // The worker answers `initialize` from this instead of instantiating the component first.
    const { PACKED_DESCRIPTION } = await hostModule("pool.js");
    writeFileSync(path.join(componentDir, PACKED_DESCRIPTION), `${JSON.stringify(description, null, 2)}\n`);
    if (devCopy) {
      rmSync(path.join(hostDist, "component"), { recursive: true, force: true });
      cpSync(componentDir, path.join(hostDist, "component"), { recursive: true });
      writeFileSync(path.join(hostDist, "manifest.js"), manifestModule(manifest, name));
      log(`development copy: ${name} (driver ${description.driverKey}) -> dist/component/, dist/manifest.js`);
      return { out: hostDist, manifest, description, contract };
    }
    const { packageNameFor, packageDescription } = await hostModule("manifest-builder.js");
    const target = path.resolve(out ?? path.join(nodeDir, "packages", description.driverKey));
    rmSync(path.join(target, "dist"), { recursive: true, force: true });
    mkdirSync(path.join(target, "dist"), { recursive: true });
    for (const file of hostFiles()) cpSync(path.join(hostDist, file), path.join(target, "dist", file));
    cpSync(componentDir, path.join(target, "dist", "component"), { recursive: true });
    writeFileSync(path.join(target, "dist", "manifest.js"), manifestModule(manifest, name));
    const packageJson = {
      name: packageNameFor(description.driverKey),
      version: pluginVersion,
      description: packageDescription(description),
      author: pkg.author,
      license: pkg.license,
      type: "module",
      engines: pkg.engines,
      dependencies: {
        "@bytecodealliance/preview2-shim": pkg.dependencies["@bytecodealliance/preview2-shim"],
        "@paperclipai/plugin-sdk": pkg.dependencies["@paperclipai/plugin-sdk"],
      },
      paperclipPlugin: { manifest: "./dist/manifest.js", worker: "./dist/worker.js" },
      files: ["dist", "npm-shrinkwrap.json"],
    };
    for (const [dependency, spec] of Object.entries(packageJson.dependencies)) {
      if (!EXACT_VERSION.test(spec ?? "")) throw new PackError(`node/package.json pins ${dependency} as ${spec}; a packed plugin needs an exact version.`);
    }
    writeFileSync(path.join(target, "package.json"), `${JSON.stringify(packageJson, null, 2)}\n`);
    writeFileSync(path.join(target, "npm-shrinkwrap.json"), `${JSON.stringify(shrinkwrapFor(packageJson), null, 2)}\n`);
    log(
      `packed ${name} (contract ${contract}) as ${packageJson.name}@${pluginVersion} (version ${versionSource}): driver ${description.driverKey}, plugin ${manifest.id}, ` +
        `${Object.keys(manifest.environmentDrivers[0].configSchema.properties ?? {}).length} config fields, ` +
        `secrets ${description.secrets.map((s) => `${s.configField} -> ${s.header}${s.scheme ? ` (${s.scheme})` : ""}`).join(", ") || "none"}, ` +
        `origins ${description.originFields.map((o) => o.configField).join(", ")} -> ${path.relative(process.cwd(), target) || "."}`,
    );
    return { out: target, manifest, description, contract };
  } finally {
    rmSync(staging, { recursive: true, force: true });
  }
}
