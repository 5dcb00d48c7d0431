//! The replay's modules import one way only: no two modules reach each other
//! through imports; the provider simulator (`sim/`) imports nothing of the
//! replay that drives it; the strategies take options of their own, not the
//! command line's types; no source file is over `module_graph::FILE_LINES_MAX`
//! lines. Read from the sources with `tests/module_graph.rs`.

#[path = "../../../tests/module_graph.rs"]
mod module_graph;

use module_graph::ModuleGraph;

fn graph() -> ModuleGraph {
    ModuleGraph::read(&std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src"))
}

fn is_sim(module: &str) -> bool {
    module == "sim" || module.starts_with("sim::")
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
fn layers_the_simulator_imports_nothing_of_the_replay() {
    let graph = graph();
    let simulator: Vec<&str> = graph.modules().filter(|m| is_sim(m)).collect();
    assert!(simulator.len() > 1, "the simulator is in sim/: {simulator:?}");
    for module in simulator {
        let outside: Vec<&String> = graph.imports(module).iter().filter(|m| !is_sim(m)).collect();
        assert!(outside.is_empty(), "{module} imports {outside:?}");
    }
}

#[test]
fn layers_the_strategies_take_no_command_line_type() {
    let graph = graph();
    let strategies: Vec<&str> = graph.modules().filter(|m| m.starts_with("strategy")).collect();
    assert!(strategies.len() > 1, "the strategies: {strategies:?}");
    for module in strategies {
        let above: Vec<&String> = (graph.imports(module).iter())
            .filter(|m| ["cli", "run", "replayer"].contains(&m.as_str()))
            .collect();
        assert!(above.is_empty(), "{module} imports {above:?}");
    }
}
