//! The gateway's layers (lib.rs, "Layout"): every module lives in the folder of
//! its stage of a call, and every `crate::` path in a folder's code (its `use`
//! lines and paths written in place) names its own folder or one below it. A
//! path pointing up, a module outside the folders, or a path through the
//! crate root's re-exports fails here, naming the file and the path.
//!
//! Within a folder, the files import one way too: no circle of files (the
//! names that tie one are followed through the folders' re-exports and the
//! `super::` paths written in code), and no file over
//! `module_graph::FILE_LINES_MAX` lines (`tests/module_graph.rs`).
//!
//! `GATEWAY_LAYERS_SRC` checks another tree (such as an older checkout's
//! `crates/gateway/src`) instead of this crate's.

#[path = "../../../tests/layer_folders.rs"]
mod layer_folders;
#[path = "../../../tests/module_graph.rs"]
mod module_graph;

use std::path::{Path, PathBuf};

/// The folders, lowest first: each may use only itself and those before it.
const LAYERS: [&str; 8] = [
    "config",
    "counting",
    "wire",
    "limits",
    "routing",
    "observe",
    "admission",
    "proxy",
];

/// The tree checked: `GATEWAY_LAYERS_SRC`, else this crate's sources.
fn src() -> PathBuf {
    std::env::var_os("GATEWAY_LAYERS_SRC")
        .map_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("src"), PathBuf::from)
}

/// The layer check of one file of this crate.
fn check(relative: &str, text: &str) -> Vec<layer_folders::Violation> {
    layer_folders::check_file(&LAYERS, relative, text)
}

#[test]
fn every_gateway_layer_uses_only_the_layers_below_it() {
    layer_folders::assert_layers(&LAYERS, &src());
}

#[test]
fn no_circle_of_files_and_no_file_too_long() {
    module_graph::assert_shape(&src());
}

#[test]
fn the_layer_check_sees_paths_up_groups_and_root_paths_and_skips_comments() {
    let up = check("routing/pool.rs", "use crate::admission::queue::ModelQueue;\n");
    assert_eq!(up.len(), 1, "{up:?}");
    assert_eq!(up[0].path, "crate::admission");
    let grouped = check(
        "limits/keys.rs",
        "use crate::{\n    config::ModelConfig,\n    observe::{metrics::X, status},\n};\n",
    );
    assert_eq!(grouped.len(), 1, "{grouped:?}");
    assert_eq!(grouped[0].path, "crate::observe");
    let in_code = check("config/mod.rs", "fn f() { crate::limits::definitions(x); }\n");
    assert_eq!(in_code.len(), 1, "a path in code counts: {in_code:?}");
    let root = check("wire/call.rs", "use crate::GatewayConfig;\n");
    assert_eq!(root.len(), 1, "{root:?}");
    assert!(check("proxy/service.rs", "use crate::config::X;\nuse crate::proxy::y;\n").is_empty());
    assert!(check("config/mod.rs", "/// See [`crate::proxy::Gateway`].\nstruct A;\n").is_empty());
    assert_eq!(check("pool.rs", "").len(), 1, "a module outside the folders");
    assert!(check("lib.rs", "pub use proxy::Gateway;\n").is_empty());
}
