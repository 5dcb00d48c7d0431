//! A crate's modules and the modules each imports, read from its sources: the
//! layer tests of the crates (`crates/*/tests/layers.rs`, which include this
//! file by path) check with it that imports point one way only, that no files
//! form a circle, and that no source file outgrows [`FILE_LINES_MAX`].
//!
//! A module is named by its path under `crate::` (`console::access`); the crate
//! root (`lib.rs`) and the binaries are not modules here: they only assemble.
//! An import is every `use` of `crate::`, `super::` or `self::` (with their
//! braces), every `use` in a folder's `mod.rs` of one of its own files, and
//! every path written `crate::…` or `super::…` in code, test modules included.
//! It points to the longest module its path starts with; when the next segment
//! is a name that module only re-exports (`pub use backend::Backend` in a
//! `mod.rs` or in `lib.rs`) or imported itself, the import follows it to the file
//! that defines it, so a circle through a folder's re-exports is still a circle.
//! The `pub use` lines of `lib.rs` and of a `mod.rs` assemble and are no import.
//! Comments are skipped; a crate that wrote `crate::` inside a string would be
//! read as importing it, which errs on the strict side.

#![allow(dead_code)] // each crate's layer test uses the part it needs

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// The most lines a source file may have: past it a file holds more than one
/// noun and is split (the style guide's "one noun per file", with functions of
/// about 70 lines).
pub const FILE_LINES_MAX: usize = 700;

/// How many re-exports an import follows before it stops: a chain longer than
/// this is a re-export circle, which the compiler refuses anyway.
const REEXPORT_HOPS_MAX: usize = 8;

/// Every module of a crate, the modules it imports and the names it takes.
#[derive(Debug)]
pub struct ModuleGraph {
    /// module → imported module → the names that import takes from it.
    imports: BTreeMap<String, BTreeMap<String, BTreeSet<String>>>,
    /// module → the modules it imports (the keys of `imports`).
    modules_imported: BTreeMap<String, BTreeSet<String>>,
    /// module → its file, relative to `src`.
    files: BTreeMap<String, String>,
}

/// One source file as read: its module, file and code without comments.
struct Source {
    file: String,
    code: String,
}

/// Names a module binds with `use` (re-exported or not): name → the absolute
/// path it stands for, as segments from the crate root.
type Bindings = BTreeMap<String, BTreeMap<String, Vec<String>>>;

impl ModuleGraph {
    /// The graph of the crate whose sources are under `src` (`lib.rs` and its
    /// modules; `bin/` and `main.rs` are left out).
    pub fn read(src: &Path) -> Self {
        let mut sources = BTreeMap::new();
        collect(src, src, &mut sources);
        let mut modules: BTreeSet<String> = sources.keys().cloned().collect();
        let bindings: Bindings = (sources.iter())
            .map(|(module, source)| (module.clone(), uses(&source.code, module, &modules, assembles(source))))
            .map(|(module, found)| (module, found.into_iter().filter_map(|u| u.binding).collect()))
            .collect();
        modules.remove("");
        let resolver = Resolver {
            modules: &modules,
            bindings: &bindings,
        };
        let mut imports = BTreeMap::new();
        let mut files = BTreeMap::new();
        for (module, source) in &sources {
            if module.is_empty() {
                continue;
            }
            let mut targets: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
            for path in imported_paths(source, module, &modules) {
                if let Some((target, name)) = resolver.resolve(&path, 0) {
                    if target != *module {
                        targets.entry(target).or_default().insert(name);
                    }
                }
            }
            imports.insert(module.clone(), targets);
            files.insert(module.clone(), source.file.clone());
        }
        let modules_imported = (imports.iter())
            .map(|(module, targets): (&String, &BTreeMap<String, BTreeSet<String>>)| {
                (module.clone(), targets.keys().cloned().collect())
            })
            .collect();
        Self {
            imports,
            modules_imported,
            files,
        }
    }

    /// Every module's name.
    pub fn modules(&self) -> impl Iterator<Item = &str> {
        self.imports.keys().map(String::as_str)
    }

    /// The modules `module` imports; panics on a module the crate does not have,
    /// so that a test naming a module that was moved fails instead of passing.
    pub fn imports(&self, module: &str) -> &BTreeSet<String> {
        self.targets(module);
        &self.modules_imported[module]
    }

    /// The names `from` takes from `to` (empty when it takes none).
    pub fn names(&self, from: &str, to: &str) -> BTreeSet<String> {
        self.targets(from).get(to).cloned().unwrap_or_default()
    }

    fn targets(&self, module: &str) -> &BTreeMap<String, BTreeSet<String>> {
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

    /// Every circle of files, one line each, naming the files and the names
    /// that tie them: `a.rs → b.rs (X, Y); b.rs → a.rs (Z)`.
    pub fn circles(&self) -> Vec<String> {
        let mut lines = Vec::new();
        for component in self.cycles() {
            let members: BTreeSet<&String> = component.iter().collect();
            let mut ties = Vec::new();
            for from in &members {
                for (to, names) in self.targets(from) {
                    if members.contains(to) {
                        let names: Vec<&str> = names.iter().map(String::as_str).collect();
                        ties.push(format!(
                            "{} → {} ({})",
                            self.files[*from],
                            self.files[to],
                            names.join(", ")
                        ));
                    }
                }
            }
            lines.push(format!("a circle of {} files: {}", members.len(), ties.join("; ")));
        }
        lines
    }
}

/// Every `.rs` file under `src` (binaries included) over [`FILE_LINES_MAX`]
/// lines, as `path: N lines`.
pub fn long_files(src: &Path) -> Vec<String> {
    let mut files = Vec::new();
    rust_files(src, &mut files);
    files.sort();
    let mut long = Vec::new();
    for path in files {
        let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let lines = text.lines().count();
        if lines > FILE_LINES_MAX {
            let relative = path.strip_prefix(src).expect("under the root");
            long.push(format!("{}: {lines} lines", relative.display()));
        }
    }
    long
}

/// Fails, listing each, on a circle of files or a file over
/// [`FILE_LINES_MAX`] lines in the crate whose sources are under `src`.
pub fn assert_shape(src: &Path) {
    let circles = ModuleGraph::read(src).circles();
    let long = long_files(src);
    assert!(
        circles.is_empty() && long.is_empty(),
        "{} circles of files (put what both sides take where both can take it from below):\n{}\n\
         {} files over {FILE_LINES_MAX} lines (split them by noun):\n{}",
        circles.len(),
        circles.join("\n"),
        long.len(),
        long.join("\n"),
    );
}

fn rust_files(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
        let path = entry.expect("a directory entry").path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
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
        for target in self.graph.imports[module].keys() {
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

/// Follows a path to the module that defines what it names.
struct Resolver<'a> {
    modules: &'a BTreeSet<String>,
    bindings: &'a Bindings,
}

impl Resolver<'_> {
    /// The module `path` points to and the name it takes there (the module's
    /// own name when the path names the module itself); `None` outside the crate.
    fn resolve(&self, path: &[String], hops: usize) -> Option<(String, String)> {
        let (module, rest) = self.longest_module(path);
        let Some(name) = rest.first() else {
            return (!module.is_empty()).then(|| (module.clone(), path.last().cloned().unwrap_or_default()));
        };
        let bound = self.bindings.get(&module).and_then(|names| names.get(name));
        match bound {
            Some(target) if hops < REEXPORT_HOPS_MAX => {
                let mut followed = target.clone();
                followed.extend(rest[1..].iter().cloned());
                self.resolve(&followed, hops + 1)
            }
            _ => (!module.is_empty()).then(|| (module, name.clone())),
        }
    }

    /// The longest module `path` starts with (`""` for the root) and the rest.
    fn longest_module<'p>(&self, path: &'p [String]) -> (String, &'p [String]) {
        (1..=path.len())
            .rev()
            .map(|n| (path[..n].join("::"), n))
            .find(|(name, _)| self.modules.contains(name))
            .map_or((String::new(), path), |(name, n)| (name, &path[n..]))
    }
}

/// Reads every `.rs` file under `dir` into `files`, keyed by module name; the
/// crate root (`lib.rs`) is the module `""`, read for its re-exports only.
fn collect(root: &Path, dir: &Path, files: &mut BTreeMap<String, Source>) {
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
        if path.extension().is_none_or(|e| e != "rs") || relative == Path::new("main.rs") {
            continue;
        }
        let mut parts: Vec<String> = relative
            .with_extension("")
            .iter()
            .map(|p| p.to_string_lossy().into_owned())
            .collect();
        if relative == Path::new("lib.rs") || parts.last().is_some_and(|p| p == "mod") {
            parts.pop();
        }
        let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let file = relative.to_string_lossy().replace('\\', "/");
        files.insert(
            parts.join("::"),
            Source {
                file,
                code: strip_comments(&text),
            },
        );
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

/// Whether `module` is assembled by a folder's `mod.rs` or is the crate root:
/// its `pub use` lines re-export and are no import of its own.
fn assembles(source: &Source) -> bool {
    source.file == "lib.rs" || source.file.ends_with("mod.rs")
}

/// One `use` path of a module: the absolute path it imports, and what name it
/// binds to it (for re-export resolution), and whether it is `pub`.
struct Use {
    path: Vec<String>,
    public: bool,
    binding: Option<(String, Vec<String>)>,
}

/// Every module path `source` (the module `module`) imports, as segments
/// from the crate root.
fn imported_paths(source: &Source, module: &str, modules: &BTreeSet<String>) -> Vec<Vec<String>> {
    let assembling = assembles(source);
    let mut found: Vec<Vec<String>> = uses(&source.code, module, modules, assembling)
        .into_iter()
        .filter(|u| !(assembling && u.public))
        .map(|u| u.path)
        .collect();
    found.extend(code_paths(&source.code, module));
    found
}

/// The `use` statements of `code` whose paths stay in the crate. `folder`
/// says whether `module` is a folder (`mod.rs`, `lib.rs`), whose relative
/// paths may name its own files.
fn uses(code: &str, module: &str, modules: &BTreeSet<String>, folder: bool) -> Vec<Use> {
    let own: Vec<String> = module
        .split("::")
        .filter(|s| !s.is_empty())
        .map(str::to_owned)
        .collect();
    let parent: Vec<String> = own[..own.len().saturating_sub(1)].to_vec();
    let inline = inline_modules(code);
    let mut found = Vec::new();
    for (at, _) in code.match_indices("use ") {
        if code[..at].chars().next_back().is_some_and(is_ident) {
            continue;
        }
        let public = code[..at].trim_end().ends_with("pub") || code[..at].trim_end().ends_with(')');
        let statement = &code[at + "use ".len()..];
        let end = statement.find(';').unwrap_or(statement.len());
        let tree = statement[..end].split_whitespace().collect::<Vec<_>>().join(" ");
        // Inside an inline module (`mod tests`), `super` is this file's module.
        let inside = inline.iter().any(|range| range.contains(&at));
        // `super` of a file (or of a folder's `mod.rs`) is the folder above it.
        let up: &[String] = if inside { &own } else { &parent };
        let (prefix, rest): (&[String], &str) = if let Some(rest) = tree.strip_prefix("crate::") {
            (&[], rest)
        } else if let Some(rest) = tree.strip_prefix("super::") {
            (up, rest)
        } else if let Some(rest) = tree.strip_prefix("self::") {
            (&own, rest)
        } else if folder && names_child(&tree, &own, modules) {
            (&own, tree.as_str())
        } else {
            continue;
        };
        let mut paths = Vec::new();
        expand(prefix, rest, &mut paths);
        for (path, alias) in paths {
            let binding = alias.map(|name| (name, path.clone()));
            found.push(Use { path, public, binding });
        }
    }
    found
}

/// Whether the relative use tree `tree` starts with a file of the folder `own`.
fn names_child(tree: &str, own: &[String], modules: &BTreeSet<String>) -> bool {
    let first: String = tree.chars().take_while(|c| is_ident(*c)).collect();
    let mut child = own.to_vec();
    child.push(first);
    modules.contains(&child.join("::"))
}

/// The paths written in code (outside `use` lines) with `crate::` or
/// `super::`, as segments from the crate root.
fn code_paths(code: &str, module: &str) -> Vec<Vec<String>> {
    let own: Vec<String> = module
        .split("::")
        .filter(|s| !s.is_empty())
        .map(str::to_owned)
        .collect();
    let inline = inline_modules(code);
    let statements = use_statements(code);
    let mut found = Vec::new();
    for start in ["crate::", "super::"] {
        for (at, _) in code.match_indices(start) {
            let before = code[..at].chars().next_back();
            if before.is_some_and(|c| is_ident(c) || c == ':') || statements.iter().any(|r| r.contains(&at)) {
                continue; // `mycrate::`, `super::super::`'s second, or a `use` line's
            }
            let path = &code[at..];
            let end = path.find(|c: char| !(is_ident(c) || c == ':')).unwrap_or(path.len());
            let mut segments: Vec<&str> = path[..end].split("::").filter(|s| !s.is_empty()).collect();
            let mut base: Vec<String> = if segments[0] == "crate" {
                Vec::new()
            } else {
                // `super` of a file is its folder; inside its `mod tests`, the file.
                let inside = inline.iter().any(|range| range.contains(&at));
                let mut base = own.clone();
                if !inside {
                    base.pop();
                }
                base
            };
            segments.remove(0);
            while segments.first() == Some(&"super") {
                base.pop();
                segments.remove(0);
            }
            base.extend(segments.iter().map(|s| (*s).to_owned()));
            found.push(base);
        }
    }
    found
}

/// The byte ranges of the `use` statements of `code`, read by [`uses`].
fn use_statements(code: &str) -> Vec<std::ops::Range<usize>> {
    (code.match_indices("use "))
        .filter(|(at, _)| !code[..*at].chars().next_back().is_some_and(is_ident))
        .map(|(at, _)| at..code[at..].find(';').map_or(code.len(), |end| at + end))
        .collect()
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

/// The paths of a use tree (`a::{b, c::{d as e}}`) below `prefix`, each with
/// the name it binds (`None` for a glob or `self` of nothing).
fn expand(prefix: &[String], tree: &str, found: &mut Vec<(Vec<String>, Option<String>)>) {
    let Some(open) = tree.find('{') else {
        let (path, alias) = match tree.split_once(" as ") {
            Some((path, alias)) => (path, Some(alias.trim())),
            None => (tree, None),
        };
        let kept: Vec<String> = (path.split("::").map(str::trim))
            .filter(|s| !s.is_empty() && *s != "self" && *s != "*")
            .map(str::to_owned)
            .collect();
        let glob = path.trim_end().ends_with('*');
        let segments: Vec<String> = prefix.iter().cloned().chain(kept).collect();
        let name = match alias {
            Some("_") => None,
            Some(alias) => Some(alias.to_owned()),
            None if glob => None,
            None => segments.last().cloned(),
        };
        found.push((segments, name));
        return;
    };
    let mut base = prefix.to_vec();
    base.extend(
        (tree[..open].split("::").map(str::trim))
            .filter(|s| !s.is_empty())
            .map(str::to_owned),
    );
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

/// The graph's reading on a crate written for it: a circle through a folder's
/// re-export and a `super::` path in code, names that tie it, a `use` group of
/// a folder's files that is no import of the folder, a comment that is no
/// import, and a long file.
#[test]
fn module_graph_sees_circles_through_reexports_and_code_paths_and_long_files() {
    let src = std::env::temp_dir().join(format!("module_graph_{}", std::process::id()));
    let write = |file: &str, text: &str| {
        let path = src.join(file);
        std::fs::create_dir_all(path.parent().expect("a folder")).expect("a temporary folder");
        std::fs::write(path, text).expect("a temporary file");
    };
    write("lib.rs", "pub mod a;\npub mod b;\npub use a::X;\n");
    write("a/mod.rs", "mod x;\nmod y;\nmod z;\npub use y::Y;\npub use x::X;\n");
    write("a/x.rs", "use super::Y;\npub struct X(Y);\n");
    write("a/y.rs", "pub struct Y;\nfn f(_: super::x::X) {}\n");
    write(
        "a/z.rs",
        "use super::{x::X, y};\n// crate::b::B\nfn g(_: X, _: y::Y) {}\n",
    );
    write("b.rs", &"fn b() {}\n".repeat(FILE_LINES_MAX + 1));
    let graph = ModuleGraph::read(&src);
    let circles = graph.circles();
    assert_eq!(circles.len(), 1, "{circles:?}");
    assert!(circles[0].contains("a/x.rs → a/y.rs (Y)"), "{circles:?}");
    assert!(circles[0].contains("a/y.rs → a/x.rs (X)"), "{circles:?}");
    let z: Vec<&String> = graph.imports("a::z").iter().collect();
    assert_eq!(
        z,
        ["a::x", "a::y"],
        "a use group is no import of its folder; a comment none at all"
    );
    assert_eq!(long_files(&src), [format!("b.rs: {} lines", FILE_LINES_MAX + 1)]);
    std::fs::remove_dir_all(&src).expect("the temporary crate removed");
}
