/**
 * The host side of Paperclip's native file sync (`PluginSyncOperation`s):
 * the worker reads and writes the host paths; the component moves the bytes
 * (`sync-in` / `sync-out`) and confines the remote paths.
 *
 * Rules:
 * - Operations run in order; every failure is thrown (nothing is skipped
 *   silently).
 * - A directory mapping walks its tree; `exclude` globs match the path
 *   relative to the mapping root, its base name, or any parent directory.
 * - Nothing leaves a mapping: a relative path with `..`, or a symlink whose
 *   target resolves outside the mapping root, is refused. A symlink inside
 *   the mapping is copied as its target's bytes when `followSymlinks` is set
 *   and recreated as a link otherwise (tar's `-h` semantics).
 * - `mode` on a sandbox target is applied with `chmod` right after the
 *   upload; on a host target the file is created with the mode (no
 *   world-readable window) and renamed into place (atomic replace).
 * - `postUploadCommands` run verbatim with `sh -c`, in order, stopping at the
 *   first failure.
 */
import { lstat, mkdir, open, readdir, readFile, realpath, rename, rm, symlink } from "node:fs/promises";
import { randomUUID } from "node:crypto";
import path from "node:path";
import type { WitExecuteResult, WitFileDownload, WitFileUpload } from "./wit-types.js";

/** One mapping of a sync operation (`PluginSyncFileMapping`). */
export interface SyncMapping {
  sourcePath: string;
  targetPath: string;
  kind: "file" | "directory";
  mode?: number;
  exclude?: string[];
  followSymlinks?: boolean;
}

/** One sync operation (`PluginSyncOperation`). */
export interface SyncOperation {
  operationId: string;
  files: SyncMapping[];
  postUploadCommands?: { command: string; cwd?: string; timeoutMs?: number }[];
}

/** What the sync code needs from the component, through the pool. */
export interface SyncBackend {
  upload(files: WitFileUpload[]): Promise<{ files: number; bytes: bigint }>;
  download(remotePaths: string[]): Promise<WitFileDownload[]>;
  run(command: string, args: string[], options?: { cwd?: string; timeoutMs?: number }): Promise<WitExecuteResult>;
}

/** Per-operation accounting (`PluginEnvironmentSyncResult`). */
export interface SyncReport {
  operationId: string;
  filesTransferred: number;
  bytesTransferred: number;
}

/** A sync refusal or failure, with a message for people. */
export class SyncError extends Error {
  constructor(message: string) {
    super(message);
    this.name = "SyncError";
  }
}

function isExcluded(relative: string, patterns: readonly string[]): boolean {
  if (patterns.length === 0) return false;
  const parts = relative.split("/");
  for (const pattern of patterns) {
    if (path.matchesGlob(relative, pattern) || path.matchesGlob(parts[parts.length - 1], pattern)) return true;
    for (let i = 1; i < parts.length; i++) {
      const parent = parts.slice(0, i).join("/");
      if (path.matchesGlob(parent, pattern) || path.matchesGlob(parts[i - 1], pattern)) return true;
    }
  }
  return false;
}

function within(root: string, candidate: string): boolean {
  const relative = path.relative(root, candidate);
  return relative === "" || (!relative.startsWith("..") && !path.isAbsolute(relative));
}

function checkRelative(relative: string, where: string) {
  if (relative.split("/").some((part) => part === ".." || part.includes("\0"))) {
    throw new SyncError(`${where}: the path ${JSON.stringify(relative)} leaves its mapping; nothing was synced for it.`);
  }
}

interface HostEntry {
  relative: string;
  kind: "file" | "link";
  hostPath: string;
  /** For links kept as links: the link text (relative, inside the mapping). */
  linkText?: string;
}

/** Walks a host source of a mapping; refuses symlinks out of it. */
async function collectHost(mapping: SyncMapping): Promise<HostEntry[]> {
  const source = path.resolve(mapping.sourcePath);
  const rootReal = await realpath(mapping.kind === "directory" ? source : path.dirname(source));
  const excludes = mapping.exclude ?? [];
  const out: HostEntry[] = [];
  const visit = async (hostPath: string, relative: string) => {
    const info = await lstat(hostPath);
    if (info.isSymbolicLink()) {
      let resolved: string;
      try {
        resolved = await realpath(hostPath);
      } catch {
        throw new SyncError(`The symlink ${hostPath} points to nothing; it was not synced.`);
      }
      if (!within(rootReal, resolved)) {
        throw new SyncError(`The symlink ${hostPath} points outside its mapping (${mapping.sourcePath}); nothing was synced.`);
      }
      if (mapping.followSymlinks) {
        const target = await lstat(resolved);
        if (target.isDirectory()) return visitDirectory(resolved, relative);
        if (target.isFile()) out.push({ relative, kind: "file", hostPath: resolved });
        return;
      }
      // Kept as a link, rewritten relative so it stays inside the mapping remotely too.
      out.push({ relative, kind: "link", hostPath, linkText: path.relative(path.dirname(path.join(rootReal, relative)), resolved) || "." });
      return;
    }
    if (info.isDirectory()) return visitDirectory(hostPath, relative);
    if (info.isFile()) out.push({ relative, kind: "file", hostPath });
    else throw new SyncError(`${hostPath} is neither a file, a directory nor a symlink; it cannot be synced.`);
  };
  const visitDirectory = async (hostPath: string, relative: string) => {
    const names = (await readdir(hostPath)).sort();
    for (const name of names) {
      const childRelative = relative === "" ? name : `${relative}/${name}`;
      if (isExcluded(childRelative, excludes)) continue;
      await visit(path.join(hostPath, name), childRelative);
    }
  };
  if (mapping.kind === "directory") {
    const info = await lstat(source);
    if (!info.isDirectory()) throw new SyncError(`${mapping.sourcePath} is not a directory.`);
    await visitDirectory(source, "");
  } else {
    await visit(source, "");
  }
  return out;
}

function joinRemote(root: string, relative: string): string {
  return relative === "" ? root : path.posix.join(root, relative);
}

function checkExit(result: WitExecuteResult, what: string) {
  if (result.timedOut) throw new SyncError(`${what} timed out.`);
  if (result.exitCode !== 0) {
    throw new SyncError(`${what} failed with exit code ${result.exitCode ?? "none"}${result.signal ? ` (${result.signal})` : ""}: ${result.stderr.slice(-500)}`);
  }
}

/** Runs `syncIn` operations: host -> sandbox. */
export async function syncIn(operations: SyncOperation[], backend: SyncBackend): Promise<SyncReport[]> {
  const reports: SyncReport[] = [];
  for (const operation of operations) {
    let files = 0;
    let bytes = 0;
    for (const mapping of operation.files) {
      const entries = await collectHost(mapping);
      const uploads: WitFileUpload[] = [];
      const links: { remote: string; text: string }[] = [];
      for (const entry of entries) {
        checkRelative(entry.relative, mapping.sourcePath);
        const remote = joinRemote(mapping.targetPath, entry.relative);
        if (entry.kind === "link") links.push({ remote, text: entry.linkText! });
        else uploads.push({ remotePath: remote, contents: new Uint8Array(await readFile(entry.hostPath)) });
      }
      if (uploads.length > 0) {
        const report = await backend.upload(uploads);
        files += report.files;
        bytes += Number(report.bytes);
      }
      for (const link of links) {
        checkExit(await backend.run("ln", ["-sfn", link.text, link.remote]), `Creating the link ${link.remote}`);
      }
      if (mapping.mode !== undefined && uploads.length > 0) {
        const mode = (mapping.mode & 0o7777).toString(8);
        checkExit(
          await backend.run("chmod", [mode, "--", ...uploads.map((upload) => upload.remotePath)]),
          `Applying mode ${mode} in the sandbox`,
        );
      }
    }
    for (const command of operation.postUploadCommands ?? []) {
      checkExit(
        await backend.run("sh", ["-c", command.command], { cwd: command.cwd, timeoutMs: command.timeoutMs }),
        `The post-upload command ${JSON.stringify(command.command)}`,
      );
    }
    reports.push({ operationId: operation.operationId, filesTransferred: files, bytesTransferred: bytes });
  }
  return reports;
}

/** Lists a remote directory through the component: regular files and links. */
async function listRemote(root: string, backend: SyncBackend): Promise<{ files: string[]; links: { relative: string; target: string }[] }> {
  const result = await backend.run("find", [root, "-mindepth", "1", "(", "-type", "f", "-o", "-type", "l", ")", "-printf", "%y %P\\0%l\\0"]);
  checkExit(result, `Listing ${root} in the sandbox`);
  const parts = result.stdout.split("\0");
  const files: string[] = [];
  const links: { relative: string; target: string }[] = [];
  for (let i = 0; i + 1 < parts.length; i += 2) {
    const [kind, ...rest] = parts[i].split(" ");
    const relative = rest.join(" ");
    if (kind === "f") files.push(relative);
    else if (kind === "l") links.push({ relative, target: parts[i + 1] });
  }
  return { files: files.sort(), links };
}

/** Makes sure every existing parent of `target` under `root` is a real directory. */
async function ensureParents(root: string, target: string) {
  const relative = path.relative(root, path.dirname(target));
  let current = root;
  await mkdir(root, { recursive: true });
  for (const part of relative === "" ? [] : relative.split(path.sep)) {
    current = path.join(current, part);
    try {
      const info = await lstat(current);
      if (!info.isDirectory()) throw new SyncError(`${current} is not a directory (a symlink is never followed out of a mapping).`);
    } catch (error) {
      if ((error as NodeJS.ErrnoException).code !== "ENOENT") throw error;
      await mkdir(current);
    }
  }
}

/** Writes a host file atomically, created with its mode from the start. */
async function writeHostFile(root: string, target: string, contents: Uint8Array, mode: number | undefined) {
  if (!within(root, target)) throw new SyncError(`${target} is outside the mapping ${root}.`);
  await ensureParents(root, target);
  const temporary = path.join(path.dirname(target), `.paperclip-sync-${randomUUID()}`);
  const handle = await open(temporary, "wx", mode ?? 0o644);
  try {
    await handle.writeFile(contents);
    if (mode !== undefined) await handle.chmod(mode);
  } finally {
    await handle.close();
  }
  try {
    await rename(temporary, target);
  } catch (error) {
    await rm(temporary, { force: true });
    throw error;
  }
}

/** Runs `syncOut` operations: sandbox -> host. */
export async function syncOut(operations: SyncOperation[], backend: SyncBackend): Promise<SyncReport[]> {
  const reports: SyncReport[] = [];
  for (const operation of operations) {
    let files = 0;
    let bytes = 0;
    for (const mapping of operation.files) {
      const hostRoot = path.resolve(mapping.kind === "directory" ? mapping.targetPath : path.dirname(mapping.targetPath));
      if (mapping.kind === "file") {
        const [download] = await backend.download([mapping.sourcePath]);
        await writeHostFile(hostRoot, path.resolve(mapping.targetPath), download.contents, mapping.mode);
        files += 1;
        bytes += download.contents.length;
        continue;
      }
      const listing = await listRemote(mapping.sourcePath, backend);
      const excludes = mapping.exclude ?? [];
      const wanted = listing.files.filter((relative) => !isExcluded(relative, excludes));
      const links = listing.links.filter((link) => !isExcluded(link.relative, excludes));
      for (const relative of [...wanted, ...links.map((link) => link.relative)]) checkRelative(relative, mapping.sourcePath);
      const remoteRoot = mapping.sourcePath.replace(/\/+$/, "");
      const linkTargets = new Map<string, string>();
      for (const link of links) {
        const remoteTarget = path.posix.resolve(path.posix.dirname(joinRemote(remoteRoot, link.relative)), link.target);
        linkTargets.set(link.relative, path.posix.relative(path.posix.dirname(joinRemote(remoteRoot, link.relative)), remoteTarget) || ".");
        if (!within(remoteRoot, remoteTarget)) {
          throw new SyncError(`The sandbox symlink ${link.relative} points outside ${mapping.sourcePath}; nothing more was synced.`);
        }
        if (mapping.followSymlinks) wanted.push(link.relative);
      }
      const downloads = wanted.length > 0 ? await backend.download(wanted.map((relative) => joinRemote(remoteRoot, relative))) : [];
      for (let i = 0; i < downloads.length; i++) {
        await writeHostFile(hostRoot, path.join(hostRoot, wanted[i]), downloads[i].contents, mapping.mode);
        files += 1;
        bytes += downloads[i].contents.length;
      }
      if (!mapping.followSymlinks) {
        for (const link of links) {
          const hostLink = path.join(hostRoot, link.relative);
          await ensureParents(hostRoot, hostLink);
          await rm(hostLink, { force: true });
          await symlink(linkTargets.get(link.relative)!, hostLink);
          files += 1;
        }
      }
    }
    reports.push({ operationId: operation.operationId, filesTransferred: files, bytesTransferred: bytes });
  }
  return reports;
}
