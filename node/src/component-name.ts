/**
 * The name jco gives the transpiled component's files (`<name>.js`,
 * `<name>.core.wasm`, ...) in every packed package: the same for every
 * provider, so the host code never names one.
 */
export const COMPONENT_NAME = "provider";
