//! A crate's layer folders (its lib.rs "Layout"), checked from its sources by
//! the crates' layer tests (`crates/*/tests/layers.rs`, which include this file
//! by path): every module lives in a layer folder, and every `crate::` path in
//! a folder's code (its `use` lines and paths written in place) names its own
//! folder or one below it. A path pointing up, a module outside the folders, or
//! a path through the crate root's re-exports is a violation naming the file and
//! the path. Comments are skipped, so a doc link is not taken for a dependency.

#![allow(dead_code)] // each crate's layer test uses the part it needs

use std::path::{Path, PathBuf};

/// The files of a crate root that are not a layer: the crate's own file.
const ROOT_FILES: [&str; 1] = ["lib.rs"];

/// A `crate::` path of `file` that breaks the layering, with why.
#[derive(Debug, PartialEq, Eq)]
pub struct Violation {
    /// The file, relative to `src`.
    pub file: String,
    /// The path that breaks the layering (empty for a misplaced file).
    pub path: String,
    /// Why it breaks it.
    pub why: String,
}

/// The code of a Rust file without its comments (line comments, doc comments
/// included), so that a doc link is not taken for a dependency.
fn code_of(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for line in text.lines() {
        let code = match line.find("//") {
            // A `//` inside a string ("http://") is code; the crates' sources
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

/// The violations of one file at `relative` (such as `routing/pool.rs`) with
/// `text`, in a crate whose layer folders are `layers`, lowest first.
pub fn check_file(layers: &[&str], relative: &str, text: &str) -> Vec<Violation> {
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
    let Some(rank) = layers.iter().position(|l| *l == folder) else {
        return vec![violation("", format!("folder {folder:?} is no layer"))];
    };
    let mut out = Vec::new();
    for first in first_segments(&code_of(text)) {
        match layers.iter().position(|l| *l == first) {
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

/// Every violation in the tree at `src` of a crate whose layer folders are
/// `layers`, lowest first.
pub fn check_tree(layers: &[&str], src: &Path) -> Vec<Violation> {
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
        out.extend(check_file(layers, &relative, &text));
    }
    out
}

/// Fails, listing each, on a violation of the layers in the tree at `src`.
pub fn assert_layers(layers: &[&str], src: &Path) {
    let violations = check_tree(layers, src);
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
