#!/usr/bin/env node
// Turns any sandbox-provider component into a Paperclip plugin package:
//
//   npm run pack -- --component path/to/provider.wasm [--out DIR] [--version X.Y.Z]
//   npm run pack -- --bundled        # every component ./build.sh built
//   npm run pack -- --dev [--component X]   # node/dist's own copy (tests)
//
// The package (default node/packages/<driver key>/) holds the same host code
// for every provider, the component transpiled by jco, and a manifest built
// from the component's describe(). Install it with
// `paperclipai plugin install --local node/packages/<driver key>`, or
// `npm pack` it (a self-contained tarball: exact pins in its
// npm-shrinkwrap.json) and install the unpacked copy anywhere. The package's
// version is the component's: --version, else the provider crate's
// (providers/<name>/Cargo.toml for <name>_provider.wasm), else the host's.
// A component that is not a sandbox-provider component, is built for
// another contract version, or whose describe() is not usable is refused
// with the reason (exit code 2).
import { existsSync } from "node:fs";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { pack, PackError } from "./packer.mjs";

const release = fileURLToPath(new URL("../../target/wasm32-wasip2/release/", import.meta.url));
/** The providers ./build.sh builds. */
const BUNDLED = ["createos_provider.wasm", "daytona_provider.wasm"];

function usage(message) {
  if (message) console.error(message);
  console.error("usage: npm run pack -- --component PATH.wasm [--out DIR] [--version X.Y.Z] | --bundled | --dev [--component PATH.wasm]");
  process.exit(2);
}

const args = process.argv.slice(2);
const options = { components: [], out: undefined, version: undefined, dev: false, bundled: false };
for (let i = 0; i < args.length; i++) {
  const arg = args[i];
  if (arg === "--component") options.components.push(args[++i] ?? usage("--component needs a path"));
  else if (arg.startsWith("--component=")) options.components.push(arg.slice("--component=".length));
  else if (arg === "--out") options.out = args[++i] ?? usage("--out needs a directory");
  else if (arg.startsWith("--out=")) options.out = arg.slice("--out=".length);
  else if (arg === "--version") options.version = args[++i] ?? usage("--version needs a version");
  else if (arg.startsWith("--version=")) options.version = arg.slice("--version=".length);
  else if (arg === "--dev") options.dev = true;
  else if (arg === "--bundled") options.bundled = true;
  else if (arg === "--help" || arg === "-h") usage();
  else usage(`unknown argument ${arg}`);
}

if (options.dev && options.components.length === 0) {
  // The development copy's component: PAPERCLIP_WASM_COMPONENT (alias CREATEOS_PROVIDER_WASM), else CreateOS from ./build.sh.
  options.components.push(process.env.PAPERCLIP_WASM_COMPONENT || process.env.CREATEOS_PROVIDER_WASM || path.join(release, BUNDLED[0]));
}
if (options.bundled) {
  for (const file of BUNDLED) {
    const wasm = path.join(release, file);
    if (!existsSync(wasm)) usage(`${wasm} is missing: run ./build.sh at the repository root first.`);
    options.components.push(wasm);
  }
}
if (options.components.length === 0) usage("name a component (--component PATH.wasm) or --bundled");
if (options.out && options.components.length > 1) usage("--out takes one component");
if (options.version && options.components.length > 1) usage("--version takes one component");

try {
  for (const component of options.components) {
    await pack({ component, out: options.out, version: options.version, devCopy: options.dev, log: (line) => console.log(line) });
  }
} catch (error) {
  if (error instanceof PackError) {
    console.error(`pack: ${error.message}`);
    process.exit(2);
  }
  throw error;
}
