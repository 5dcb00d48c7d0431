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

#[path = "../../../tests/layer_folders.rs"]
mod layer_folders;
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

/// The tree the tests read: this crate's sources, or `RATELIMITER_LAYERS_SRC`.
fn source_tree() -> PathBuf {
    std::env::var_os("RATELIMITER_LAYERS_SRC")
        .map_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("src"), PathBuf::from)
}

/// The layer check of one file of this crate.
fn check(relative: &str, text: &str) -> Vec<layer_folders::Violation> {
    layer_folders::check_file(&LAYERS, relative, text)
}

#[test]
fn every_layer_uses_only_the_layers_below_it() {
    layer_folders::assert_layers(&LAYERS, &source_tree());
}

#[test]
fn the_layer_check_sees_paths_up_groups_and_root_paths_and_skips_comments() {
    let up = check("memory/state.rs", "use crate::tigerbeetle::ids::resource_account_id;\n");
    assert_eq!(up.len(), 1, "{up:?}");
    assert_eq!(up[0].path, "crate::tigerbeetle");
    let grouped = check(
        "model/wire.rs",
        "use crate::{\n    base::id::LeaseId,\n    limiting::{limiter::Limiter, admin},\n};\n",
    );
    assert_eq!(grouped.len(), 1, "{grouped:?}");
    assert_eq!(grouped[0].path, "crate::limiting");
    let in_code = check("base/clock.rs", "fn f() { crate::model::key::LimitKey::new(x); }\n");
    assert_eq!(in_code.len(), 1, "a path in code counts: {in_code:?}");
    let root = check("memory/state.rs", "use crate::LeaseId;\n");
    assert_eq!(root.len(), 1, "{root:?}");
    assert!(root[0].why.contains("crate root"), "{root:?}");
    assert!(check("testkit/fixture.rs", "use crate::memory::X;\nuse crate::testkit::y;\n").is_empty());
    assert!(check(
        "base/clock.rs",
        "/// See [`crate::memory::MemoryBackend`].\nstruct A;\n"
    )
    .is_empty());
    assert_eq!(check("clock.rs", "").len(), 1, "a module outside the folders");
    assert_eq!(check("extra/x.rs", "").len(), 1, "a folder that is no layer");
    assert!(check("lib.rs", "pub use base::clock;\n").is_empty());
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
