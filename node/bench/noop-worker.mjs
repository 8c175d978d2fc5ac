// Baseline for "worker spawn to first answer": a plugin worker written with
// the same SDK that does nothing (no component, no threads).
import { definePlugin, runWorker } from "@paperclipai/plugin-sdk";

const plugin = definePlugin({
  async setup() {},
  async onHealth() {
    return { status: "ok" };
  },
});
export default plugin;
runWorker(plugin, import.meta.url);
