//! The engine's folders form layers, and no import goes up or round in a
//! circle (issue 42 item 3).
//!
//! The test reads the crate's own sources under `src/`, finds every path
//! that leaves a folder (`crate::<folder>`, or `super::` climbing out of
//! it) outside comments and strings, and checks:
//! - the folder-level graph against [`LAYERS`]: a folder uses only
//!   folders of lower layers (its own files aside), so the faces use the
//!   core, never the reverse, and the server composes everything;
//! - that no two folders, and no two files, use each other round a
//!   circle (the circle is named step by step);
//! - that each folder's module doc names every folder it uses;
//! - that the host's cgroup layout and the server's uid are read only in
//!   the files that decide those capabilities (issue 42 item 2).
//!
//! Seen failing: a `use crate::server::Server;` added to
//! `trees/procfs.rs` fails the layer order and the folder circle, a
//! `use super::toolbox::wants_split;` added to `daytona/log_socket.rs`
//! fails the file circle.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The engine's folders (and top-level files), lowest first. Each may use
/// only those of the layers before its own. The module doc of each
/// folder's `mod.rs` says the same in words.
const LAYERS: &[&[&str]] = &[
    // Leaves: small helpers and the fault rules of the test API.
    &["util", "faults"],
    // Process trees, the ids that own them, their limits and proof.
    &["trees"],
    // A sandbox's files, its disk, the durable records, output journals.
    &["storage"],
    // Accept loops, connection limits, rate limits, the egress proxy.
    &["network"],
    // The machine: namespaces, join, the bwrap command line, terminals.
    &["machine"],
    // The sandbox core: the store, the supervisor, proving a sandbox gone.
    &["sandboxes"],
    // The HTTP layer both faces share.
    &["http"],
    // The two faces, side by side: neither uses the other.
    &["api", "daytona"],
    // The composition root.
    &["server"],
];

/// Files that compose the crate and may use anything.
const ROOTS: &[&str] = &["lib.rs", "main.rs"];

/// One use of another folder: which file, which folder.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct Use {
    file: String,
    target: String,
}

fn src_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let mut entries: Vec<_> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("cannot list {}: {e}", dir.display()))
        .map(|e| e.expect("directory entry").path())
        .collect();
    entries.sort();
    for path in entries {
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|x| x == "rs") {
            out.push(path);
        }
    }
}

/// The unit a top-level entry of `src/` names: a folder's name or a
/// file's stem.
fn unit_of(relative: &Path) -> String {
    let first = relative.components().next().expect("a path under src");
    let first = first.as_os_str().to_string_lossy();
    first.strip_suffix(".rs").unwrap_or(&first).to_string()
}

/// The module path of a file under `src/` (`a/b.rs` and `a/b/mod.rs` are
/// `[a, b]`).
fn module_path(relative: &Path) -> Vec<String> {
    let mut parts: Vec<String> = relative
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    let last = parts.pop().expect("a file name");
    if last != "mod.rs" {
        parts.push(last.trim_end_matches(".rs").to_string());
    }
    parts
}

/// The source without comments (line, doc and block comments) and without
/// the contents of string and character literals, so that only code is
/// searched.
fn code_only(source: &str) -> String {
    strip(source, false)
}

/// The source without comments; string and character literals kept when
/// `keep_strings`, else emptied.
fn strip(source: &str, keep_strings: bool) -> String {
    let bytes = source.as_bytes();
    let mut out = String::with_capacity(source.len());
    let mut i = 0;
    while i < bytes.len() {
        let rest = &source[i..];
        if rest.starts_with("//") {
            let end = rest.find('\n').map_or(bytes.len(), |n| i + n);
            i = end;
        } else if rest.starts_with("/*") {
            let mut depth = 0;
            while i < bytes.len() {
                if source[i..].starts_with("/*") {
                    depth += 1;
                    i += 2;
                } else if source[i..].starts_with("*/") {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    i += 1;
                }
            }
        } else if let Some(end) = raw_string_end(rest) {
            out.push_str(if keep_strings { &rest[..end] } else { "\"\"" });
            i += end;
        } else if bytes[i] == b'"' {
            let start = i;
            i += 1;
            while i < bytes.len() && bytes[i] != b'"' {
                i += if bytes[i] == b'\\' { 2 } else { 1 };
            }
            i += 1;
            out.push_str(if keep_strings {
                &source[start..i.min(bytes.len())]
            } else {
                "\"\""
            });
        } else if let Some(end) = char_literal_end(rest) {
            out.push_str(if keep_strings { &rest[..end] } else { "' '" });
            i += end;
        } else {
            let c = rest.chars().next().expect("not at the end");
            out.push(c);
            i += c.len_utf8();
        }
    }
    out
}

/// The length of a raw string literal (`r"…"`, `r#"…"#`, `br"…"`) at the
/// start of `rest`, if one starts there.
fn raw_string_end(rest: &str) -> Option<usize> {
    let after_b = rest.strip_prefix('b').unwrap_or(rest);
    let after_r = after_b.strip_prefix('r')?;
    let hashes = after_r.len() - after_r.trim_start_matches('#').len();
    let body = after_r[hashes..].strip_prefix('"')?;
    let close = format!("\"{}", "#".repeat(hashes));
    let end = body.find(&close)?;
    Some(rest.len() - body.len() + end + close.len())
}

/// The length of a character literal at the start of `rest` (not a
/// lifetime), if one starts there.
fn char_literal_end(rest: &str) -> Option<usize> {
    let body = rest.strip_prefix('\'')?;
    let mut chars = body.char_indices();
    let (_, first) = chars.next()?;
    if first == '\\' {
        return body.find('\'').and_then(|n| {
            // `'\''`: the quote right after the backslash is escaped.
            if n == 1 {
                body[2..].find('\'').map(|m| m + 4)
            } else {
                Some(n + 2)
            }
        });
    }
    let (n, second) = chars.next()?;
    (second == '\'').then_some(n + 2)
}

fn is_ident_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_'
}

/// The path at the start of `text`: `a::b::c` as `[a, b, c]`, up to
/// anything that is not an identifier (a group `{…}`, a glob `*`, a call).
fn leading_path(text: &str) -> Vec<String> {
    let mut path = Vec::new();
    let mut rest = text.trim_start();
    loop {
        let end = rest.find(|c: char| !is_ident_char(c)).unwrap_or(rest.len());
        if end == 0 {
            break;
        }
        path.push(rest[..end].to_string());
        match rest[end..].strip_prefix("::") {
            Some(after) => rest = after,
            None => break,
        }
    }
    path
}

/// The paths a `{ a, b::c, d }` group at the start of `text` names (each
/// item up to a nested group).
fn group_paths(text: &str) -> Vec<Vec<String>> {
    let Some(body) = text.trim_start().strip_prefix('{') else {
        return Vec::new();
    };
    let mut paths = Vec::new();
    let mut depth = 0;
    let mut at_item_start = true;
    for (n, c) in body.char_indices() {
        match c {
            '{' => depth += 1,
            '}' if depth == 0 => break,
            '}' => depth -= 1,
            ',' if depth == 0 => at_item_start = true,
            c if at_item_start && !c.is_whitespace() => {
                at_item_start = false;
                let path = leading_path(&body[n..]);
                if !path.is_empty() {
                    paths.push(path);
                }
            }
            _ => {}
        }
    }
    paths
}

/// The paths from the crate root a file's code names: `crate::a::b`,
/// `crate::{a, b::c}`, and `super::` chains made absolute from the
/// file's module path (`module`).
fn paths_named(code: &str, module: &[String]) -> Vec<Vec<String>> {
    let after_prefix = |after: &str| -> Vec<Vec<String>> {
        let path = leading_path(after);
        if path.is_empty() {
            group_paths(after)
        } else {
            vec![path]
        }
    };
    let mut named = Vec::new();
    for (at, _) in code.match_indices("crate::") {
        let before = code[..at].chars().next_back();
        if before.is_some_and(|c| is_ident_char(c) || c == ':') {
            continue; // `$crate::`, `some_crate::` or a longer path
        }
        named.extend(after_prefix(&code[at + "crate::".len()..]));
    }
    for (at, _) in code.match_indices("super::") {
        let before = code[..at].chars().next_back();
        if before.is_some_and(|c| is_ident_char(c) || c == ':') {
            continue; // counted from the first `super::` of a chain
        }
        let mut rest = &code[at..];
        let mut climbs = 0;
        while let Some(after) = rest.strip_prefix("super::") {
            climbs += 1;
            rest = after;
        }
        let Some(base) = module.len().checked_sub(climbs) else {
            continue;
        };
        for path in after_prefix(rest) {
            let mut absolute = module[..base].to_vec();
            absolute.extend(path);
            named.push(absolute);
        }
    }
    named
}

/// The top-level units a file's code names.
fn units_named(code: &str, module: &[String]) -> BTreeSet<String> {
    paths_named(code, module)
        .into_iter()
        .filter_map(|path| path.into_iter().next())
        .collect()
}

/// Every use of another top-level unit, by the unit that makes it.
fn uses_by_unit() -> BTreeMap<String, BTreeSet<Use>> {
    let src = src_dir();
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let mut top_level = BTreeSet::new();
    for path in &files {
        top_level.insert(unit_of(path.strip_prefix(&src).expect("under src")));
    }
    let mut uses: BTreeMap<String, BTreeSet<Use>> = BTreeMap::new();
    for path in &files {
        let relative = path.strip_prefix(&src).expect("under src");
        let file = relative.to_string_lossy().into_owned();
        if ROOTS.contains(&file.as_str()) {
            continue;
        }
        let unit = unit_of(relative);
        let source = std::fs::read_to_string(path)
            .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
        let code = code_only(&source);
        let entry = uses.entry(unit.clone()).or_default();
        for target in units_named(&code, &module_path(relative)) {
            if target != unit && top_level.contains(&target) {
                entry.insert(Use {
                    file: file.clone(),
                    target,
                });
            }
        }
    }
    uses
}

fn layer_of(unit: &str) -> Option<usize> {
    LAYERS.iter().position(|layer| layer.contains(&unit))
}

/// A circle in the unit graph, as the units along it (the first repeated
/// at the end), if there is one.
fn find_circle(graph: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    #[derive(Clone, Copy, PartialEq)]
    enum Mark {
        New,
        OnPath,
        Done,
    }
    fn visit(
        unit: &str,
        graph: &BTreeMap<String, BTreeSet<String>>,
        marks: &mut BTreeMap<String, Mark>,
        path: &mut Vec<String>,
    ) -> Option<Vec<String>> {
        marks.insert(unit.to_string(), Mark::OnPath);
        path.push(unit.to_string());
        for next in graph.get(unit).into_iter().flatten() {
            match marks.get(next).copied().unwrap_or(Mark::New) {
                Mark::OnPath => {
                    let start = path.iter().position(|u| u == next).expect("on the path");
                    let mut circle = path[start..].to_vec();
                    circle.push(next.clone());
                    return Some(circle);
                }
                Mark::New => {
                    if let Some(circle) = visit(next, graph, marks, path) {
                        return Some(circle);
                    }
                }
                Mark::Done => {}
            }
        }
        path.pop();
        marks.insert(unit.to_string(), Mark::Done);
        None
    }
    let mut marks = BTreeMap::new();
    for unit in graph.keys() {
        if marks.get(unit).copied().unwrap_or(Mark::New) == Mark::New {
            if let Some(circle) = visit(unit, graph, &mut marks, &mut Vec::new()) {
                return Some(circle);
            }
        }
    }
    None
}

fn graph_of(uses: &BTreeMap<String, BTreeSet<Use>>) -> BTreeMap<String, BTreeSet<String>> {
    uses.iter()
        .map(|(unit, uses)| {
            (
                unit.clone(),
                uses.iter().map(|u| u.target.clone()).collect(),
            )
        })
        .collect()
}

/// The files of `from` that use `to`, for a message.
fn files_using(uses: &BTreeMap<String, BTreeSet<Use>>, from: &str, to: &str) -> String {
    uses[from]
        .iter()
        .filter(|u| u.target == to)
        .map(|u| u.file.as_str())
        .collect::<Vec<_>>()
        .join(", ")
}

/// Every file's module path and its code without comments, string
/// contents and its `#[cfg(test)]` part (a file's tests come last), the
/// files that compose the crate aside.
fn modules() -> BTreeMap<Vec<String>, (String, String)> {
    let src = src_dir();
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let mut modules = BTreeMap::new();
    for path in &files {
        let relative = path.strip_prefix(&src).expect("under src");
        let file = relative.to_string_lossy().into_owned();
        if ROOTS.contains(&file.as_str()) {
            continue;
        }
        let source = std::fs::read_to_string(path)
            .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
        let mut code = code_only(&source);
        if let Some(tests) = code.find("#[cfg(test)]") {
            code.truncate(tests);
        }
        modules.insert(module_path(relative), (file, code));
    }
    modules
}

/// No two files use each other, directly or round a longer circle. A
/// folder's `mod.rs` and its files are not counted against each other:
/// it declares them and routes to them, and they may use what it keeps
/// for them.
#[test]
fn no_circle_between_files() {
    let modules = modules();
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (module, (file, code)) in &modules {
        let uses = graph.entry(file.clone()).or_default();
        for path in paths_named(code, module) {
            // The longest prefix of the path that is a file: `crate::a::b::item`
            // is a use of `a/b.rs` (or `a/b/mod.rs`), else of `a`.
            let Some(target) = (1..=path.len())
                .rev()
                .map(|n| &path[..n])
                .find(|prefix| modules.contains_key(*prefix))
            else {
                continue;
            };
            let related = module.starts_with(target) || target.starts_with(module);
            if !related {
                uses.insert(modules[target].0.clone());
            }
        }
    }
    if let Some(circle) = find_circle(&graph) {
        panic!(
            "files of the engine import each other in a circle: {}",
            circle.join(" -> ")
        );
    }
}

#[test]
fn every_folder_has_a_layer() {
    let uses = uses_by_unit();
    let unplaced: Vec<_> = uses.keys().filter(|u| layer_of(u).is_none()).collect();
    assert!(
        unplaced.is_empty(),
        "these parts of sandbox-engine/src have no layer in tests/layers.rs: {unplaced:?}; \
         add each to LAYERS where it belongs"
    );
    let src = src_dir();
    let missing: Vec<_> = LAYERS
        .iter()
        .flat_map(|layer| layer.iter())
        .filter(|unit| !src.join(unit).is_dir() && !src.join(format!("{unit}.rs")).is_file())
        .collect();
    assert!(
        missing.is_empty(),
        "LAYERS names parts that src/ no longer has: {missing:?}"
    );
}

#[test]
fn no_circle_between_folders() {
    let uses = uses_by_unit();
    if let Some(circle) = find_circle(&graph_of(&uses)) {
        let steps: Vec<String> = circle
            .windows(2)
            .map(|pair| {
                let files = files_using(&uses, &pair[0], &pair[1]);
                format!("{} -> {} (in {files})", pair[0], pair[1])
            })
            .collect();
        panic!(
            "the engine's folders import each other in a circle: {}",
            steps.join("; ")
        );
    }
}

#[test]
fn folders_use_only_lower_layers() {
    let uses = uses_by_unit();
    let mut upward = Vec::new();
    for (unit, uses) in &uses {
        let Some(own) = layer_of(unit) else { continue };
        for used in uses {
            match layer_of(&used.target) {
                Some(layer) if layer < own => {}
                _ => upward.push(format!("{} uses {}", used.file, used.target)),
            }
        }
    }
    assert!(
        upward.is_empty(),
        "a folder uses one of its own layer or above (see LAYERS in \
         sandbox-engine/tests/layers.rs):\n{}",
        upward.join("\n")
    );
}

/// Each folder's module doc (`//!` in its `mod.rs`) names every folder
/// and top-level module it uses (`crate::<name>`), so the words a
/// newcomer reads say what the code does.
#[test]
fn each_folder_says_what_it_uses() {
    let src = src_dir();
    let mut unsaid = Vec::new();
    for (unit, uses) in uses_by_unit() {
        let mod_rs = src.join(&unit).join("mod.rs");
        let Ok(source) = std::fs::read_to_string(&mod_rs) else {
            continue; // a top-level file, not a folder
        };
        let doc: String = source
            .lines()
            .filter_map(|line| line.trim_start().strip_prefix("//!"))
            .collect::<Vec<_>>()
            .join("\n");
        let used: BTreeSet<&str> = uses.iter().map(|u| u.target.as_str()).collect();
        for target in used {
            if !doc.contains(&format!("crate::{target}")) {
                unsaid.push(format!("{unit}/mod.rs does not name crate::{target}"));
            }
        }
    }
    assert!(
        unsaid.is_empty(),
        "a folder's module doc does not say what it uses:\n{}",
        unsaid.join("\n")
    );
}

/// The files outside `seams` whose code (tests and comments aside, string
/// literals kept) names any of `names`.
fn named_outside(seams: &[&str], names: &[&str]) -> Vec<String> {
    let src = src_dir();
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let mut outside = Vec::new();
    for path in &files {
        let file = path
            .strip_prefix(&src)
            .expect("under src")
            .to_string_lossy()
            .into_owned();
        if seams.contains(&file.as_str()) {
            continue;
        }
        let source = std::fs::read_to_string(path).expect("a source file");
        let mut code = strip(&source, true);
        if let Some(tests) = code.find("#[cfg(test)]") {
            code.truncate(tests);
        }
        for name in names.iter().filter(|name| code.contains(**name)) {
            outside.push(format!("{file} names {name}"));
        }
    }
    outside
}

/// The host's cgroup layout (its mount points, `/proc/self/cgroup`, the
/// control files of cgroup v1 and v2) is known to the tree backends'
/// seam and the backends behind it (issue 42 item 2): a new kind of host
/// is a change there, not a hunt through the engine.
#[test]
fn only_the_tree_backends_know_the_cgroup_layout() {
    const SEAMS: [&str; 3] = [
        "trees/process_limits.rs",
        "trees/cgroup_v1.rs",
        "trees/cgroup_v2.rs",
    ];
    let outside = named_outside(
        &SEAMS,
        &[
            "/sys/fs/cgroup",
            "/proc/self/cgroup",
            "cgroup.procs",
            "cgroup.threads",
            "cgroup.kill",
            "cgroup.freeze",
            "cgroup.events",
            "cgroup.controllers",
            "cgroup.subtree_control",
            "pids.max",
            "pids.current",
            "memory.max",
            "memory.events",
            "cpu.max",
            "memory.limit_in_bytes",
            "memory.oom_control",
        ],
    );
    assert!(
        outside.is_empty(),
        "only {SEAMS:?} may know where and how the host's cgroups are; ask them instead:\n{}",
        outside.join("\n")
    );
}

/// The tree backend (cgroup v1 pids, delegated cgroup v2, none) is
/// chosen in one place, `TreeBackend::here` in `trees/process_limits.rs`:
/// no other file reaches a backend's file directly (the trees folder's
/// `mod.rs` only declares it).
#[test]
fn the_tree_backend_is_chosen_in_one_place() {
    let outside = named_outside(
        &[
            "trees/process_limits.rs",
            "trees/cgroup_v1.rs",
            "trees/cgroup_v2.rs",
            "trees/mod.rs",
        ],
        &["cgroup_v1", "cgroup_v2"],
    );
    assert!(
        outside.is_empty(),
        "only trees/process_limits.rs chooses and uses the tree backends; ask it \
         (TreeBackend, CommandGroup, SandboxGroups) instead:\n{}",
        outside.join("\n")
    );
}

/// Who the server runs as is asked only where a host capability is
/// decided: the ids a sandbox gets (`trees/id_map.rs`, `ranges_here`),
/// the cgroups it may write (`trees/process_limits.rs` and the cgroup v1
/// backend, `trees/cgroup_v1.rs`) and the disks it may mount
/// (`storage/disk.rs`). The rest of the engine asks them.
#[test]
fn only_the_seams_ask_who_the_server_is() {
    let seams = [
        "trees/id_map.rs",
        "trees/process_limits.rs",
        "trees/cgroup_v1.rs",
        "storage/disk.rs",
    ];
    let outside = named_outside(&seams, &["geteuid", "getuid"]);
    assert!(
        outside.is_empty(),
        "only {seams:?} may ask who the server runs as; ask them instead:\n{}",
        outside.join("\n")
    );
}

#[test]
fn the_reader_sees_code_only() {
    let code = code_only(
        "/// [`crate::a`]\n// crate::b\n/* crate::c /* nested */ */ let s = \"crate::d\";\n\
         let r = r#\"crate::e\"#; let q = '\"'; use crate::f::g;\n",
    );
    assert_eq!(
        units_named(&code, &["x".to_string()]),
        BTreeSet::from(["f".to_string()])
    );
    let path = |p: &str| p.split("::").map(str::to_string).collect::<Vec<_>>();
    let named = paths_named(
        "use crate::{a::b, c}; use super::super::d; use super::e::f; x::crate::g; use super::*;",
        &path("m::n"),
    );
    assert_eq!(
        named,
        vec![path("a::b"), path("c"), path("d"), path("m::e::f")]
    );
}
