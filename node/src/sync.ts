/**
 * The host side of Paperclip's native file sync (`PluginSyncOperation`s):
 * the worker reads and writes the host paths; the component moves the bytes
 * (`sync-in` / `sync-out`) and confines the remote paths.
 *
 * Rules:
 * - Operations run in order; a failure of a transfer is thrown.
 * - A directory mapping walks its tree; `exclude` globs match the path
 *   relative to the mapping root, its base name, or any parent directory.
 * - Symlinks sync like tar: a link is copied as a link, its target text
 *   exactly as it is (absolute, relative, pointing outside the mapping or
 *   dangling alike: a Python venv's `bin/python -> /usr/bin/python3`
 *   arrives as that link). Copying a link never reads what it points to.
 * - A link is never *followed* out of its mapping, on either side. With
 *   `followSymlinks` (tar's `-h`) a link inside the mapping is copied as
 *   its target's bytes (or tree); one that leads outside it, or nowhere,
 *   fails the operation (the user asked for its contents), naming it.
 * - Anything else a sync cannot carry (a FIFO, socket or device, a sandbox
 *   path with `..`, a host path whose parent is a link) is refused alone:
 *   the entry is named in a warning (`warn`) and skipped; the rest of the
 *   operation goes on. Nothing is skipped without a warning that names it.
 * - `mode` on a sandbox target is applied with `chmod` right after the
 *   upload; on a host target the file is created with the mode (no
 *   world-readable window) and renamed into place (atomic replace).
 * - `postUploadCommands` run verbatim with `sh -c`, in order, stopping at the
 *   first failure.
 */
import { lstat, mkdir, open, readdir, readFile, readlink, realpath, rename, rm, symlink } from "node:fs/promises";
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
  /** Receives the message for each entry refused and skipped (none: the message is dropped by the caller's choice). */
  warn?(message: string): void;
}

/** An entry refused alone: named for people, then skipped. */
class Skipped extends Error {}

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

function leavesMapping(relative: string): boolean {
  return relative.split("/").some((part) => part === ".." || part.includes("\0"));
}

interface HostEntry {
  relative: string;
  kind: "file" | "link";
  hostPath: string;
  /** For links copied as links: the link text, exactly as it is. */
  linkText?: string;
}

/** Walks a host source of a mapping; never follows a link out of it; skips (and names) what it cannot carry. */
async function collectHost(mapping: SyncMapping, warn: (message: string) => void): Promise<HostEntry[]> {
  const source = path.resolve(mapping.sourcePath);
  const rootReal = await realpath(mapping.kind === "directory" ? source : path.dirname(source));
  const excludes = mapping.exclude ?? [];
  const out: HostEntry[] = [];
  const visit = async (hostPath: string, relative: string) => {
    const info = await lstat(hostPath);
    if (info.isSymbolicLink()) {
      if (!mapping.followSymlinks) {
        // Copied as a link, its text exactly as it is; what it points to is never read.
        out.push({ relative, kind: "link", hostPath, linkText: await readlink(hostPath) });
        return;
      }
      // The user asked for the contents: a link that leads nowhere or out of the mapping fails the operation.
      let resolved: string;
      try {
        resolved = await realpath(hostPath);
      } catch {
        throw new SyncError(`The symlink ${hostPath} points to nothing, and followSymlinks asks for its contents; nothing was synced.`);
      }
      if (!within(rootReal, resolved)) {
        throw new SyncError(`The symlink ${hostPath} points outside its mapping (${mapping.sourcePath}), and followSymlinks would copy what it points to; nothing was synced.`);
      }
      const target = await lstat(resolved);
      if (target.isDirectory()) return visitDirectory(resolved, relative);
      if (target.isFile()) out.push({ relative, kind: "file", hostPath: resolved });
      else warn(`Skipped ${hostPath}: it points to something that is neither a file nor a directory.`);
      return;
    }
    if (info.isDirectory()) return visitDirectory(hostPath, relative);
    if (info.isFile()) out.push({ relative, kind: "file", hostPath });
    else warn(`Skipped ${hostPath}: it is neither a file, a directory nor a symlink (a FIFO, socket or device cannot be synced).`);
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
/**
 * Creates every link of a mapping in the sandbox in one command (parents
 * first; `ln -sfn` replaces an old link, never writes through it), each
 * with its text exactly as given.
 */
const MAKE_LINKS = 'while [ "$#" -gt 0 ]; do mkdir -p -- "$(dirname -- "$2")" && ln -sfn -- "$1" "$2" || exit 1; shift 2; done';

export async function syncIn(operations: SyncOperation[], backend: SyncBackend): Promise<SyncReport[]> {
  const reports: SyncReport[] = [];
  const warn = (message: string) => backend.warn?.(message);
  for (const operation of operations) {
    let files = 0;
    let bytes = 0;
    for (const mapping of operation.files) {
      const entries = await collectHost(mapping, warn);
      const uploads: WitFileUpload[] = [];
      const links: { remote: string; text: string }[] = [];
      for (const entry of entries) {
        const remote = joinRemote(mapping.targetPath, entry.relative);
        if (entry.kind === "link") links.push({ remote, text: entry.linkText! });
        else uploads.push({ remotePath: remote, contents: new Uint8Array(await readFile(entry.hostPath)) });
      }
      if (uploads.length > 0) {
        const report = await backend.upload(uploads);
        files += report.files;
        bytes += Number(report.bytes);
      }
      if (links.length > 0) {
        checkExit(
          await backend.run("sh", ["-c", MAKE_LINKS, "sh", ...links.flatMap((link) => [link.text, link.remote])]),
          `Creating ${links.length} symlink(s) under ${mapping.targetPath}`,
        );
        files += links.length;
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
      if (!info.isDirectory()) throw new Skipped(`Skipped ${target}: ${current} is not a directory (a symlink is never written through).`);
    } catch (error) {
      if ((error as NodeJS.ErrnoException).code !== "ENOENT") throw error;
      await mkdir(current);
    }
  }
}

/** Writes a host file atomically, created with its mode from the start. */
async function writeHostFile(root: string, target: string, contents: Uint8Array, mode: number | undefined) {
  if (!within(root, target)) throw new Skipped(`Skipped ${target}: it is outside the mapping ${root}.`);
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
/** Runs `write`; an entry it refuses alone ({@link Skipped}) is named and skipped. Whether it was written. */
async function orSkip(write: () => Promise<void>, warn: (message: string) => void): Promise<boolean> {
  try {
    await write();
    return true;
  } catch (error) {
    if (!(error instanceof Skipped)) throw error;
    warn(error.message);
    return false;
  }
}

export async function syncOut(operations: SyncOperation[], backend: SyncBackend): Promise<SyncReport[]> {
  const reports: SyncReport[] = [];
  const warn = (message: string) => backend.warn?.(message);
  for (const operation of operations) {
    let files = 0;
    let bytes = 0;
    for (const mapping of operation.files) {
      const hostRoot = path.resolve(mapping.kind === "directory" ? mapping.targetPath : path.dirname(mapping.targetPath));
      if (mapping.kind === "file") {
        const [download] = await backend.download([mapping.sourcePath]);
        if (await orSkip(() => writeHostFile(hostRoot, path.resolve(mapping.targetPath), download.contents, mapping.mode), warn)) {
          files += 1;
          bytes += download.contents.length;
        }
        continue;
      }
      const listing = await listRemote(mapping.sourcePath, backend);
      const excludes = mapping.exclude ?? [];
      const named = (relative: string) => {
        if (!leavesMapping(relative)) return true;
        warn(`Skipped the sandbox path ${JSON.stringify(relative)} under ${mapping.sourcePath}: it leaves its mapping.`);
        return false;
      };
      const wanted = listing.files.filter((relative) => !isExcluded(relative, excludes) && named(relative));
      const links = listing.links.filter((link) => !isExcluded(link.relative, excludes) && named(link.relative));
      const remoteRoot = mapping.sourcePath.replace(/\/+$/, "");
      if (mapping.followSymlinks) {
        // The user asked for the contents: a link out of the mapping fails the operation rather than be read.
        for (const link of links) {
          const remoteTarget = path.posix.resolve(path.posix.dirname(joinRemote(remoteRoot, link.relative)), link.target);
          if (!within(remoteRoot, remoteTarget)) {
            throw new SyncError(`The sandbox symlink ${link.relative} points outside ${mapping.sourcePath}, and followSymlinks would copy what it points to; nothing more was synced.`);
          }
          wanted.push(link.relative);
        }
      }
      const downloads = wanted.length > 0 ? await backend.download(wanted.map((relative) => joinRemote(remoteRoot, relative))) : [];
      for (let i = 0; i < downloads.length; i++) {
        if (await orSkip(() => writeHostFile(hostRoot, path.join(hostRoot, wanted[i]), downloads[i].contents, mapping.mode), warn)) {
          files += 1;
          bytes += downloads[i].contents.length;
        }
      }
      if (!mapping.followSymlinks) {
        for (const link of links) {
          // Recreated as a link with its text exactly as it is; what it points to is never read or written.
          const hostLink = path.join(hostRoot, link.relative);
          const made = await orSkip(async () => {
            await ensureParents(hostRoot, hostLink);
            await rm(hostLink, { force: true });
            await symlink(link.target, hostLink);
          }, warn);
          if (made) files += 1;
        }
      }
    }
    reports.push({ operationId: operation.operationId, filesTransferred: files, bytesTransferred: bytes });
  }
  return reports;
}
