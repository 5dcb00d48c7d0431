//! The library's layers (lib.rs, "Layout"): every module lives in the folder of
//! its layer, and every `crate::` path in a folder's code (its `use` lines and
//! paths written in place) names its own folder or one below it. A path
//! pointing up, a module outside the folders, or a path through the crate
//! root's re-exports fails here, naming the file and the path. The files
//! themselves import one way only, and none grows past
//! `module_graph::FILE_LINES_MAX` lines (`tests/module_graph.rs`).
//!
//! `RATELIMITER_LAYERS_SRC` checks another tree (such as an older checkout's
//! `crates/ratelimiter/src`) instead of this crate's.

#[path = "../../../tests/module_graph.rs"]
mod module_graph;

use std::path::{Path, PathBuf};

use module_graph::ModuleGraph;

/// The folders, lowest first: each may use only itself and those before it.
/// `testkit` (feature `testkit`) is last: it drives every backend and helper.
const LAYERS: [&str; 13] = [
    "base",
    "model",
    "limiting",
    "provider",
    "price",
    "spend",
    "directory",
    "memory",
    "tigerbeetle",
    "feedback",
    "scheduler",
    "client",
    "testkit",
];

/// The files of the crate root that are not a layer: the crate's own file.
const ROOT_FILES: [&str; 1] = ["lib.rs"];

/// A `crate::` path of `file` that breaks the layering, with why.
#[derive(Debug, PartialEq, Eq)]
struct Violation {
    file: String,
    path: String,
    why: String,
}

/// The code of a Rust file without its comments (line comments, doc comments
/// included), so that a doc link is not taken for a dependency.
fn code_of(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for line in text.lines() {
        let code = match line.find("//") {
            // A `//` inside a string ("http://") is code; the library's sources
            // write no `crate::` path after one.
            Some(at) if !line[..at].contains('"') => &line[..at],
            _ => line,
        };
        out.push_str(code);
        out.push('\n');
    }
    out
}

/// The first segment of every `crate::` path in `code`: `crate::a::b` gives
/// `a`; `crate::{a::X, b}` gives `a` and `b`.
fn first_segments(code: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = code;
    while let Some(at) = rest.find("crate::") {
        let before = rest[..at].chars().next_back();
        rest = &rest[at + "crate::".len()..];
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_') {
            continue; // `mycrate::`, not this crate
        }
        if let Some(group) = rest.strip_prefix('{') {
            let end = matching_brace(group);
            out.extend(top_level_items(&group[..end]).iter().map(|item| segment(item)));
        } else {
            out.push(segment(rest));
        }
    }
    out.retain(|s| !s.is_empty());
    out
}

/// The index of the brace that closes a group opened just before `text`.
fn matching_brace(text: &str) -> usize {
    let mut depth = 0usize;
    for (i, c) in text.char_indices() {
        match c {
            '{' => depth += 1,
            '}' if depth == 0 => return i,
            '}' => depth -= 1,
            _ => {}
        }
    }
    text.len()
}

/// The items of a `{...}` group's inside, split at its top-level commas.
fn top_level_items(group: &str) -> Vec<&str> {
    let (mut items, mut depth, mut start) = (Vec::new(), 0usize, 0);
    for (i, c) in group.char_indices() {
        match c {
            '{' => depth += 1,
            '}' => depth = depth.saturating_sub(1),
            ',' if depth == 0 => {
                items.push(&group[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    items.push(&group[start..]);
    items
}

/// The leading identifier of `path`.
fn segment(path: &str) -> String {
    (path.trim_start().chars())
        .take_while(|c| c.is_alphanumeric() || *c == '_')
        .collect()
}

/// The violations of one file at `relative` (such as `memory/state.rs`) with `text`.
fn check_file(relative: &str, text: &str) -> Vec<Violation> {
    let violation = |path: &str, why: String| Violation {
        file: relative.to_owned(),
        path: path.to_owned(),
        why,
    };
    let Some((folder, _)) = relative.split_once('/') else {
        if ROOT_FILES.contains(&relative) {
            return Vec::new();
        }
        return vec![violation("", "a module outside the layer folders".to_owned())];
    };
    let Some(rank) = LAYERS.iter().position(|l| *l == folder) else {
        return vec![violation("", format!("folder {folder:?} is no layer"))];
    };
    let mut out = Vec::new();
    for first in first_segments(&code_of(text)) {
        match LAYERS.iter().position(|l| *l == first) {
            Some(used) if used <= rank => {}
            Some(_) => out.push(violation(
                &format!("crate::{first}"),
                format!("{folder} may not use {first}, a layer above it"),
            )),
            None => out.push(violation(
                &format!("crate::{first}"),
                "a path through the crate root: name the folder".to_owned(),
            )),
        }
    }
    out
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("the source folder is readable") {
        let path = entry.expect("a readable entry").path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// Every violation in the tree at `src`.
fn check_tree(src: &Path) -> Vec<Violation> {
    let mut files = Vec::new();
    rust_files(src, &mut files);
    files.sort();
    assert!(!files.is_empty(), "no source under {}", src.display());
    let mut out = Vec::new();
    for file in files {
        let relative = file
            .strip_prefix(src)
            .expect("under src")
            .to_string_lossy()
            .replace('\\', "/");
        let text = std::fs::read_to_string(&file).expect("a readable source");
        out.extend(check_file(&relative, &text));
    }
    out
}

/// The tree the tests read: this crate's sources, or `RATELIMITER_LAYERS_SRC`.
fn source_tree() -> PathBuf {
    std::env::var_os("RATELIMITER_LAYERS_SRC")
        .map_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("src"), PathBuf::from)
}

#[test]
fn every_layer_uses_only_the_layers_below_it() {
    let violations = check_tree(&source_tree());
    let listed: Vec<String> = (violations.iter())
        .map(|v| format!("{}: {} ({})", v.file, v.path, v.why))
        .collect();
    assert!(
        listed.is_empty(),
        "{} layering violations:\n{}",
        listed.len(),
        listed.join("\n")
    );
}

#[test]
fn the_layer_check_sees_paths_up_groups_and_root_paths_and_skips_comments() {
    let up = check_file("memory/state.rs", "use crate::tigerbeetle::ids::resource_account_id;\n");
    assert_eq!(up.len(), 1, "{up:?}");
    assert_eq!(up[0].path, "crate::tigerbeetle");
    let grouped = check_file(
        "model/wire.rs",
        "use crate::{\n    base::id::LeaseId,\n    limiting::{limiter::Limiter, admin},\n};\n",
    );
    assert_eq!(grouped.len(), 1, "{grouped:?}");
    assert_eq!(grouped[0].path, "crate::limiting");
    let in_code = check_file("base/clock.rs", "fn f() { crate::model::key::LimitKey::new(x); }\n");
    assert_eq!(in_code.len(), 1, "a path in code counts: {in_code:?}");
    let root = check_file("memory/state.rs", "use crate::LeaseId;\n");
    assert_eq!(root.len(), 1, "{root:?}");
    assert!(root[0].why.contains("crate root"), "{root:?}");
    assert!(check_file("testkit/fixture.rs", "use crate::memory::X;\nuse crate::testkit::y;\n").is_empty());
    assert!(check_file(
        "base/clock.rs",
        "/// See [`crate::memory::MemoryBackend`].\nstruct A;\n"
    )
    .is_empty());
    assert_eq!(check_file("clock.rs", "").len(), 1, "a module outside the folders");
    assert_eq!(check_file("extra/x.rs", "").len(), 1, "a folder that is no layer");
    assert!(check_file("lib.rs", "pub use base::clock;\n").is_empty());
}

#[test]
fn no_circle_of_files_and_no_long_file() {
    module_graph::assert_shape(&source_tree());
}

#[test]
fn the_tigerbeetle_backends_state_sits_below_its_paths() {
    let graph = ModuleGraph::read(&source_tree());
    // The paths of the backend are `impl` blocks of its shared state, in files
    // above it: the state imports none of them, nor the backend over it.
    let paths = [
        "backend",
        "reserve",
        "complete",
        "admin",
        "definitions",
        "bucket_refills",
        "clock_probe",
    ];
    let above: Vec<&String> = (graph.imports("tigerbeetle::shared").iter())
        .filter(|m| paths.iter().any(|p| m.as_str() == format!("tigerbeetle::{p}")))
        .collect();
    assert!(above.is_empty(), "the shared state imports {above:?}");
    let backend_paths: Vec<&str> = (graph.modules())
        .filter(|m| paths[1..].iter().any(|p| *m == format!("tigerbeetle::{p}")))
        .collect();
    assert_eq!(
        backend_paths.len(),
        paths.len() - 1,
        "each path is a file: {backend_paths:?}"
    );
}
