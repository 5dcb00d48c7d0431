//! The server's modules import one way only: no two modules reach each other
//! through imports, and the console sits above the server's state, which holds
//! only the console's leaves (its access rule and its history); no source file
//! is over `module_graph::FILE_LINES_MAX` lines. Read from the sources with
//! `tests/module_graph.rs`.

#[path = "../../../tests/module_graph.rs"]
mod module_graph;

use module_graph::ModuleGraph;

fn graph() -> ModuleGraph {
    ModuleGraph::read(&std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src"))
}

#[test]
fn layers_no_import_circle_between_modules() {
    let cycles = graph().cycles();
    assert!(cycles.is_empty(), "modules that import each other: {cycles:?}");
}

#[test]
fn layers_no_circle_of_files_and_no_file_too_long() {
    module_graph::assert_shape(&std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src"));
}

#[test]
fn layers_the_consoles_access_rule_and_history_are_leaves() {
    let graph = graph();
    for leaf in ["console::access", "console::history"] {
        let above: Vec<&String> = (graph.imports(leaf).iter())
            .filter(|m| *m == "state" || *m == "console" || m.starts_with("console::"))
            .collect();
        assert!(above.is_empty(), "{leaf} imports {above:?}");
    }
}

#[test]
fn layers_the_state_holds_only_the_consoles_leaves() {
    let graph = graph();
    let leaves = ["console::access", "console::history"];
    let pages: Vec<&str> = (graph.modules())
        .filter(|m| m.starts_with("console::") && !leaves.contains(m))
        .collect();
    assert!(pages.len() >= 3, "the console's routes, view and sampler: {pages:?}");
    for module in ["state", "console"] {
        let imported: Vec<&&str> = pages
            .iter()
            .filter(|page| graph.imports(module).contains(**page))
            .collect();
        assert!(imported.is_empty(), "{module} imports {imported:?}");
    }
}
