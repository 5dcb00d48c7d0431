//! A crate's modules and the modules each imports, read from its sources: the
//! layer tests of the crates (`crates/*/tests/layers.rs`, which include this
//! file by path) check with it that imports point one way only.
//!
//! A module is named by its path under `crate::` (`console::access`); the crate
//! root (`lib.rs`) and the binaries are not modules here: they only assemble.
//! An import is every `use crate::…` and `use super::…` (with their braces) and
//! every path written `crate::…` in code, test modules included; it points to the
//! longest module its path starts with. Comments are skipped; a crate that wrote
//! `crate::` inside a string would be read as importing it, which errs on the
//! strict side.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// Every module of a crate and the modules it imports.
#[derive(Debug)]
pub struct ModuleGraph {
    imports: BTreeMap<String, BTreeSet<String>>,
}

impl ModuleGraph {
    /// The graph of the crate whose sources are under `src` (`lib.rs` and its
    /// modules; `bin/` and `main.rs` are left out).
    pub fn read(src: &Path) -> Self {
        let mut files = BTreeMap::new();
        collect(src, src, &mut files);
        let modules: BTreeSet<String> = files.keys().cloned().collect();
        let imports = files
            .iter()
            .map(|(module, text)| {
                let targets = paths(&strip_comments(text), module)
                    .iter()
                    .filter_map(|path| resolve(path, &modules))
                    .filter(|target| target != module)
                    .collect();
                (module.clone(), targets)
            })
            .collect();
        Self { imports }
    }

    /// Every module's name.
    pub fn modules(&self) -> impl Iterator<Item = &str> {
        self.imports.keys().map(String::as_str)
    }

    /// The modules `module` imports; panics on a module the crate does not have,
    /// so that a test naming a module that was moved fails instead of passing.
    pub fn imports(&self, module: &str) -> &BTreeSet<String> {
        self.imports
            .get(module)
            .unwrap_or_else(|| panic!("no module {module}; the modules are {:?}", self.imports.keys()))
    }

    /// The import circles: every set of two or more modules that reach each
    /// other through imports (Tarjan's strongly connected components).
    pub fn cycles(&self) -> Vec<Vec<String>> {
        let mut search = Tarjan {
            graph: self,
            index: BTreeMap::new(),
            low: BTreeMap::new(),
            stack: Vec::new(),
            next: 0,
            components: Vec::new(),
        };
        for module in self.imports.keys() {
            if !search.index.contains_key(module.as_str()) {
                search.visit(module);
            }
        }
        search.components
    }
}

/// Tarjan's algorithm over the graph's modules.
struct Tarjan<'a> {
    graph: &'a ModuleGraph,
    index: BTreeMap<&'a str, usize>,
    low: BTreeMap<&'a str, usize>,
    stack: Vec<&'a str>,
    next: usize,
    components: Vec<Vec<String>>,
}

impl<'a> Tarjan<'a> {
    fn visit(&mut self, module: &'a str) {
        self.index.insert(module, self.next);
        self.low.insert(module, self.next);
        self.next += 1;
        self.stack.push(module);
        for target in &self.graph.imports[module] {
            let target = target.as_str();
            if !self.index.contains_key(target) {
                self.visit(target);
                self.low.insert(module, self.low[module].min(self.low[target]));
            } else if self.stack.contains(&target) {
                self.low.insert(module, self.low[module].min(self.index[target]));
            }
        }
        if self.low[module] == self.index[module] {
            let at = self.stack.iter().rposition(|m| *m == module).expect("on the stack");
            let component: Vec<String> = self.stack.drain(at..).map(str::to_owned).collect();
            if component.len() > 1 {
                self.components.push(component);
            }
        }
    }
}

/// Reads every `.rs` file under `dir` into `files`, keyed by module name.
fn collect(root: &Path, dir: &Path, files: &mut BTreeMap<String, String>) {
    let mut entries: Vec<_> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|entry| entry.expect("a directory entry").path())
        .collect();
    entries.sort();
    for path in entries {
        let relative = path.strip_prefix(root).expect("under the root");
        if path.is_dir() {
            if relative != Path::new("bin") {
                collect(root, &path, files);
            }
            continue;
        }
        if path.extension().is_none_or(|e| e != "rs")
            || relative == Path::new("lib.rs")
            || relative == Path::new("main.rs")
        {
            continue;
        }
        let mut parts: Vec<String> = relative
            .with_extension("")
            .iter()
            .map(|p| p.to_string_lossy().into_owned())
            .collect();
        if parts.last().is_some_and(|p| p == "mod") {
            parts.pop();
        }
        let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        files.insert(parts.join("::"), text);
    }
}

/// `text` without its `//` comments (doc comments included) and `/* */` blocks.
fn strip_comments(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find('/') {
        out.push_str(&rest[..at]);
        let tail = &rest[at..];
        if tail.starts_with("//") {
            rest = tail.find('\n').map_or("", |end| &tail[end..]);
        } else if tail.starts_with("/*") {
            rest = tail.find("*/").map_or("", |end| &tail[end + 2..]);
        } else {
            out.push('/');
            rest = &tail[1..];
        }
    }
    out.push_str(rest);
    out
}

/// Every module path `text` (the source of `module`) imports, as segments
/// from the crate root.
fn paths(text: &str, module: &str) -> Vec<Vec<String>> {
    let own: Vec<String> = module.split("::").map(str::to_owned).collect();
    let parent = &own[..own.len() - 1];
    let inline = inline_modules(text);
    let mut found = Vec::new();
    for (at, _) in text.match_indices("use ") {
        if text[..at].chars().next_back().is_some_and(is_ident) {
            continue;
        }
        let statement = &text[at + "use ".len()..];
        let end = statement.find(';').unwrap_or(statement.len());
        let tree = statement[..end].split_whitespace().collect::<Vec<_>>().join(" ");
        if let Some(tree) = tree.strip_prefix("crate::") {
            expand(&[], tree, &mut found);
        } else if let Some(tree) = tree.strip_prefix("super::") {
            // Inside an inline module (`mod tests`), `super` is this file's module.
            let inside = inline.iter().any(|range| range.contains(&at));
            expand(if inside { &own } else { parent }, tree, &mut found);
        }
    }
    for (at, _) in text.match_indices("crate::") {
        if text[..at].chars().next_back().is_some_and(is_ident) {
            continue;
        }
        let path = &text[at + "crate::".len()..];
        let end = path.find(|c: char| !(is_ident(c) || c == ':')).unwrap_or(path.len());
        let segments = path[..end]
            .split("::")
            .filter(|s| !s.is_empty())
            .map(str::to_owned)
            .collect();
        found.push(segments);
    }
    found
}

fn is_ident(c: char) -> bool {
    c.is_alphanumeric() || c == '_'
}

/// The byte ranges of the inline modules (`mod tests { … }`) of `text`.
fn inline_modules(text: &str) -> Vec<std::ops::Range<usize>> {
    let mut ranges = Vec::new();
    for (at, _) in text.match_indices("mod ") {
        if text[..at].chars().next_back().is_some_and(is_ident) {
            continue;
        }
        let rest = &text[at + "mod ".len()..];
        let name_end = rest.find(|c: char| !is_ident(c)).unwrap_or(rest.len());
        let after = rest[name_end..].trim_start();
        if name_end == 0 || !after.starts_with('{') {
            continue;
        }
        let open = text.len() - after.len();
        let mut depth = 0usize;
        for (i, c) in text[open..].char_indices() {
            match c {
                '{' => depth += 1,
                '}' => {
                    depth -= 1;
                    if depth == 0 {
                        ranges.push(at..open + i);
                        break;
                    }
                }
                _ => {}
            }
        }
    }
    ranges
}

/// The paths of a use tree (`a::{b, c::{d}}`) below `prefix`.
fn expand(prefix: &[String], tree: &str, found: &mut Vec<Vec<String>>) {
    let segments = |path: &str| -> Vec<String> {
        let path = path.split(" as ").next().unwrap_or(path);
        let kept = path
            .split("::")
            .map(str::trim)
            .filter(|s| !s.is_empty() && *s != "self" && *s != "*");
        prefix.iter().cloned().chain(kept.map(str::to_owned)).collect()
    };
    let Some(open) = tree.find('{') else {
        found.push(segments(tree));
        return;
    };
    let base = segments(&tree[..open]);
    let inner = &tree[open + 1..tree.rfind('}').expect("a closing brace")];
    let (mut depth, mut start) = (0, 0);
    for (i, c) in inner.char_indices() {
        match c {
            '{' => depth += 1,
            '}' => depth -= 1,
            ',' if depth == 0 => {
                expand(&base, &inner[start..i], found);
                start = i + 1;
            }
            _ => {}
        }
    }
    if !inner[start..].trim().is_empty() {
        expand(&base, &inner[start..], found);
    }
}

/// The module a path points to: the longest of `modules` it starts with.
fn resolve(path: &[String], modules: &BTreeSet<String>) -> Option<String> {
    (1..=path.len())
        .rev()
        .map(|n| path[..n].join("::"))
        .find(|name| modules.contains(name))
}
