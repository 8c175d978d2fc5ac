// Transpiles the provider component that ./build.sh produced into
// dist/component/ with jco (instantiation mode, so each worker thread builds
// its own instance with its own imports).
import { execFileSync } from "node:child_process";
import { existsSync, rmSync } from "node:fs";
import { fileURLToPath } from "node:url";

const wasm = process.env.CREATEOS_PROVIDER_WASM ?? fileURLToPath(new URL("../../target/wasm32-wasip2/release/createos_provider.wasm", import.meta.url));
if (!existsSync(wasm)) {
  console.error(`The provider component is missing: ${wasm}\nBuild it first: ./build.sh (at the repository root), or set CREATEOS_PROVIDER_WASM.`);
  process.exit(1);
}
const out = fileURLToPath(new URL("../dist/component", import.meta.url));
rmSync(out, { recursive: true, force: true });
const jco = fileURLToPath(new URL("../node_modules/.bin/jco", import.meta.url));
execFileSync(process.execPath, [jco, "transpile", wasm, "-o", out, "--name", "createos", "--instantiation", "async", "--no-typescript", "--quiet"], { stdio: "inherit" });
console.log(`component: ${wasm} -> dist/component/`);
