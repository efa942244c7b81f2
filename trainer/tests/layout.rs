//! The crate's layout rules, read from the map in `src/lib.rs` (the one place they are
//! written): every `crate::<module>` path in a top-level module names a module of the
//! same layer or a lower one, the top-level modules import each other without a cycle,
//! `model/` imports only `kernels/` and the shim, `cli/` is used by `main.rs` alone, and
//! the crate root holds no code of its own (which could call up into any layer).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

/// Layer of each top-level module, from the rows `//! | N | [`a`], [`b`] | … |` of
/// lib.rs's table.
fn layers(lib: &str) -> BTreeMap<String, u32> {
    let mut layers = BTreeMap::new();
    for line in lib.lines().filter_map(|l| l.strip_prefix("//! | ")) {
        let mut cells = line.split(" | ");
        let (Some(layer), Some(modules)) = (cells.next(), cells.next()) else { continue };
        let Ok(layer) = layer.trim().parse::<u32>() else { continue };
        for name in modules.split(", ") {
            let name = name.trim().trim_start_matches("[`").trim_end_matches("`]");
            layers.insert(name.to_string(), layer);
        }
    }
    layers
}

/// Every `.rs` file of top-level module `name`: `name.rs`, or the files under `name/`.
fn files_of(name: &str) -> Vec<PathBuf> {
    let file = src().join(format!("{name}.rs"));
    if file.is_file() {
        return vec![file];
    }
    let mut out = Vec::new();
    let mut dirs = vec![src().join(name)];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
            let path = entry.unwrap().path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                out.push(path);
            }
        }
    }
    out.sort();
    out
}

/// The top-level modules each file of `name` names as `crate::<module>`, with where.
fn imports(name: &str, modules: &BTreeMap<String, u32>) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for file in files_of(name) {
        let text = std::fs::read_to_string(&file).unwrap();
        for (n, line) in text.lines().enumerate() {
            let code = line.split("//").next().unwrap_or_default();
            for (at, _) in code.match_indices("crate::") {
                let rest = &code[at + "crate::".len()..];
                let ident: String = rest.chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_').collect();
                if modules.contains_key(&ident) && ident != name {
                    let rel = file.strip_prefix(src()).unwrap().display().to_string();
                    out.push((ident, format!("src/{rel}:{}", n + 1)));
                }
            }
        }
    }
    out
}

fn lib_rs() -> String {
    std::fs::read_to_string(src().join("lib.rs")).unwrap()
}

#[test]
fn the_map_lists_every_top_level_module() {
    let lib = lib_rs();
    let declared: BTreeSet<String> =
        lib.lines().filter_map(|l| l.strip_prefix("pub mod ")).map(|m| m.trim_end_matches(';').to_string()).collect();
    let mapped: BTreeSet<String> = layers(&lib).into_keys().collect();
    assert!(declared.len() > 10, "lib.rs declares its modules as `pub mod x;`: {declared:?}");
    assert_eq!(declared, mapped, "every `pub mod` of lib.rs has a layer in its map, and no other");
}

#[test]
fn the_crate_root_only_declares_and_reexports_modules() {
    let lib = lib_rs();
    let code: Vec<(usize, &str)> = lib
        .lines()
        .enumerate()
        .map(|(n, l)| (n + 1, l.trim()))
        .filter(|(_, l)| !l.is_empty() && !l.starts_with("//"))
        .collect();
    let allowed = |l: &str| {
        l.starts_with("#![")
            || ((l.starts_with("pub mod ") || l.starts_with("mod ")) && l.ends_with(';'))
            || ((l.starts_with("pub use ") || l.starts_with("pub(crate) use ")) && l.ends_with(';'))
    };
    let other: Vec<String> =
        code.iter().filter(|(_, l)| !allowed(l)).map(|(n, l)| format!("src/lib.rs:{n}: {l}")).collect();
    assert!(
        other.is_empty(),
        "lib.rs declares the modules and re-exports from the lowest layer; code goes in a module of its layer:\n{}",
        other.join("\n")
    );
    // What it re-exports comes from layer 1, which every module may use.
    let layers = layers(&lib);
    for (n, l) in code.iter().filter(|(_, l)| l.contains(" use ")) {
        let from = l.split(" use ").nth(1).unwrap().split("::").next().unwrap();
        assert_eq!(layers.get(from), Some(&1), "src/lib.rs:{n}: re-exports from {from}, not a layer-1 module");
    }
}

#[test]
fn lower_layers_never_import_higher_ones() {
    let layers = layers(&lib_rs());
    let mut wrong = Vec::new();
    for (module, layer) in &layers {
        for (target, at) in imports(module, &layers) {
            if layers[&target] > *layer {
                wrong.push(format!("{at}: {module} (layer {layer}) imports {target} (layer {})", layers[&target]));
            }
        }
    }
    assert!(wrong.is_empty(), "imports against the layer order:\n{}", wrong.join("\n"));
}

#[test]
fn top_level_modules_import_each_other_without_a_cycle() {
    let layers = layers(&lib_rs());
    let edges: BTreeMap<String, BTreeSet<String>> =
        layers.keys().map(|m| (m.clone(), imports(m, &layers).into_iter().map(|(t, _)| t).collect())).collect();
    // Depth-first search; a module met again while on the path closes a cycle.
    fn visit(
        m: &str,
        edges: &BTreeMap<String, BTreeSet<String>>,
        path: &mut Vec<String>,
        done: &mut BTreeSet<String>,
    ) -> Option<Vec<String>> {
        if let Some(i) = path.iter().position(|p| p == m) {
            let mut cycle = path[i..].to_vec();
            cycle.push(m.to_string());
            return Some(cycle);
        }
        if done.contains(m) {
            return None;
        }
        path.push(m.to_string());
        for next in &edges[m] {
            if let Some(cycle) = visit(next, edges, path, done) {
                return Some(cycle);
            }
        }
        path.pop();
        done.insert(m.to_string());
        None
    }
    let mut done = BTreeSet::new();
    for m in layers.keys() {
        if let Some(cycle) = visit(m, &edges, &mut Vec::new(), &mut done) {
            panic!("import cycle between top-level modules: {}", cycle.join(" → "));
        }
    }
}

#[test]
fn the_model_imports_only_the_kernels_and_the_shim() {
    let layers = layers(&lib_rs());
    let other: Vec<_> = imports("model", &layers).into_iter().filter(|(t, _)| t != "kernels" && t != "ffi").collect();
    assert!(other.is_empty(), "model/ imports beyond kernels/ and ffi: {other:?}");
}

#[test]
fn only_main_uses_the_cli() {
    let layers = layers(&lib_rs());
    let users: Vec<_> =
        layers.keys().filter(|m| *m != "cli").flat_map(|m| imports(m, &layers)).filter(|(t, _)| t == "cli").collect();
    assert!(users.is_empty(), "crate::cli used outside cli/: {users:?}");
}

/// The checks above read real imports from the source: the telemetry sinks' import of
/// `train::report` is found, and the table orders those layers.
#[test]
fn imports_are_read_from_the_source() {
    let layers = layers(&lib_rs());
    assert!(layers["ffi"] < layers["train"] && layers["train"] < layers["telemetry"], "{layers:?}");
    let found = imports("telemetry", &layers);
    assert!(found.iter().any(|(t, _)| t == "train"), "telemetry's sinks read train::report: {found:?}");
}
