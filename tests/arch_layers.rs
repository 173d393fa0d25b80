//! The crate's layering, checked on its source: each layer imports only from the layers below
//! it, only `store/` touches RocksDB, the handles reach the engine through `engine::boundary`
//! alone, and no two files import each other, directly or around a circle — anywhere in the
//! tree, inside `engine/` included (`arch/imports.rs` builds the file-level graph). See
//! `docs/ARCHITECTURE.md`, whose claims these are.
//!
//! Layers, top down:
//! 1. handles: `broker/`, `queue/`, `ordered/`, `work/`, `pool/`, `dead_letter/`, `flow/`, `kv/`,
//!    `txn/`, `inspector.rs` (and `lib.rs`), and `web/`, the console, which stays on the public
//!    API: not even `engine::boundary`;
//! 2. the engine: `engine/`;
//! 3. the store: `store/`;
//! 4. plain value types: every other module.
//!
//! It reads code lines only (comments and doc links are skipped) and follows `crate::` paths,
//! which is how every cross-module import in the crate is written (`super::` stays inside a
//! folder; `super::super` is refused below).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

#[path = "arch/imports.rs"]
mod imports;

const HANDLES: &[&str] = &[
    "broker",
    "queue",
    "ordered",
    "work",
    "pool",
    "dead_letter",
    "flow",
    "group_admin",
    "kv",
    "txn",
    "inspector",
    "web",
];
const VALUES: &[&str] = &[
    "backup",
    "flow_state",
    "clock",
    "codec",
    "entry",
    "error",
    "events",
    "export",
    "faults",
    "json",
    "message",
    "model",
    "name",
    "options",
    "otel",
    "rate_limit",
    "retention",
    "retry",
    "schedule",
    "sent",
    "stats",
    "telemetry",
];

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Layer {
    Values,
    Store,
    Engine,
    Handles,
}

fn layer_of(top: &str) -> Option<Layer> {
    match top {
        "engine" => Some(Layer::Engine),
        "store" => Some(Layer::Store),
        t if HANDLES.contains(&t) => Some(Layer::Handles),
        t if VALUES.contains(&t) => Some(Layer::Values),
        _ => None,
    }
}

/// Every `.rs` file under `dir`, recursively.
fn sources(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).expect("read src") {
        let path = entry.expect("dir entry").path();
        if path.is_dir() {
            out.extend(sources(&path));
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
    out
}

/// The top-level module a file belongs to (`src/engine/writer/mod.rs` → `engine`).
fn top_module(src: &Path, file: &Path) -> String {
    let rel = file.strip_prefix(src).expect("under src");
    let first = rel.components().next().expect("a component").as_os_str().to_string_lossy().to_string();
    first.trim_end_matches(".rs").to_owned()
}

/// The file's code, without comments (line comments, doc comments) and string contents
/// (good enough for this crate: no `//` inside a string we care about).
fn code_lines(text: &str) -> Vec<(usize, String)> {
    text.lines()
        .enumerate()
        .filter_map(|(i, l)| {
            let t = l.trim_start();
            if t.starts_with("//") {
                return None;
            }
            let code = match t.find("//") {
                Some(c) => &t[..c],
                None => t,
            };
            Some((i + 1, code.to_owned()))
        })
        .collect()
}

/// `crate::a::b…` paths on a line, as their first two segments.
fn crate_paths(line: &str) -> Vec<(String, Option<String>)> {
    let mut out = Vec::new();
    let mut rest = line;
    while let Some(i) = rest.find("crate::") {
        let after = &rest[i + "crate::".len()..];
        let seg = |s: &str| s.chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect::<String>();
        let first = seg(after);
        let second = after.strip_prefix(&first).and_then(|r| r.strip_prefix("::")).map(seg);
        out.push((first, second.filter(|s| !s.is_empty())));
        rest = after;
    }
    out
}

struct Violation(String);

fn check() -> (Vec<Violation>, BTreeMap<String, BTreeSet<String>>) {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut bad = Vec::new();
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for file in sources(&src) {
        let rel = file.strip_prefix(&src).expect("under src").display().to_string();
        if rel.starts_with("bin/") {
            continue; // the CLI is a separate crate target over the public API
        }
        let top = top_module(&src, &file);
        let text = std::fs::read_to_string(&file).expect("read file");
        let here = layer_of(&top);
        for (n, line) in code_lines(&text) {
            let at = format!("src/{rel}:{n}");
            if line.contains("rocksdb") && top != "store" && rel != "lib.rs" {
                bad.push(Violation(format!("{at}: RocksDB outside store/: {line}")));
            }
            if line.contains("super::super") {
                bad.push(Violation(format!("{at}: super::super hides a cross-module import: {line}")));
            }
            for (first, second) in crate_paths(&line) {
                if first.chars().next().is_some_and(char::is_uppercase) && rel != "lib.rs" {
                    bad.push(Violation(format!(
                        "{at}: import through the crate root (crate::{first}): {line}"
                    )));
                    continue;
                }
                let Some(there) = layer_of(&first) else { continue };
                if first != top {
                    graph.entry(top.clone()).or_default().insert(first.clone());
                }
                let Some(here) = here else { continue };
                if there > here {
                    bad.push(Violation(format!(
                        "{at}: {top} ({here:?}) imports {first} ({there:?}): {line}"
                    )));
                }
                if here == Layer::Handles && first == "store" {
                    bad.push(Violation(format!("{at}: a handle reaches the store directly: {line}")));
                }
                if top == "web" && (first == "engine" || first == "store") {
                    bad.push(Violation(format!("{at}: the console reaches past the public API: {line}")));
                }
                if here == Layer::Handles && first == "engine" && second.as_deref() != Some("boundary") {
                    bad.push(Violation(format!(
                        "{at}: a handle reaches into the engine past engine::boundary: {line}"
                    )));
                }
            }
        }
    }
    (bad, graph)
}

/// A cycle in `graph`, if any (as the modules along it).
fn cycle(graph: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    fn visit(
        n: &str,
        graph: &BTreeMap<String, BTreeSet<String>>,
        state: &mut BTreeMap<String, u8>,
        path: &mut Vec<String>,
    ) -> Option<Vec<String>> {
        match state.get(n) {
            Some(1) => {
                let start = path.iter().position(|p| p == n).unwrap_or(0);
                return Some(path[start..].to_vec());
            }
            Some(2) => return None,
            _ => {}
        }
        state.insert(n.to_owned(), 1);
        path.push(n.to_owned());
        for m in graph.get(n).into_iter().flatten() {
            if let Some(c) = visit(m, graph, state, path) {
                return Some(c);
            }
        }
        path.pop();
        state.insert(n.to_owned(), 2);
        None
    }
    let mut state = BTreeMap::new();
    for n in graph.keys() {
        if let Some(c) = visit(n, graph, &mut state, &mut Vec::new()) {
            return Some(c);
        }
    }
    None
}

#[test]
fn layers_point_down_and_the_engine_is_reached_through_its_boundary() {
    let (bad, _) = check();
    let report: Vec<String> = bad.into_iter().map(|Violation(v)| v).collect();
    assert!(report.is_empty(), "layering violations:\n{}", report.join("\n"));
}

#[test]
fn no_cycle_between_top_level_modules() {
    let (_, graph) = check();
    assert!(
        graph.contains_key("engine") && graph.contains_key("broker"),
        "the scan found the modules: {graph:?}"
    );
    assert_eq!(cycle(&graph), None, "import graph: {graph:?}");
}

/// The files of the library (or of the CLI) that import each other around a circle.
fn file_circles(root: &str, skip: Option<&str>) -> Vec<Vec<PathBuf>> {
    let base = Path::new(env!("CARGO_MANIFEST_DIR"));
    let skip = skip.map(|s| base.join(s));
    let krate = imports::Crate::read(&base.join(root), skip.as_deref());
    let graph = krate.graph();
    assert!(
        graph.values().map(BTreeSet::len).sum::<usize>() > if skip.is_some() { 300 } else { 5 },
        "the scan found the imports: {graph:?}"
    );
    imports::circles(&graph)
}

#[test]
fn no_import_circle_between_files_anywhere_in_the_library() {
    let circles = file_circles("src/lib.rs", Some("src/bin"));
    assert!(circles.is_empty(), "import circles between files:\n{circles:#?}");
}

#[test]
fn no_import_circle_between_files_of_the_cli() {
    let circles = file_circles("src/bin/rockq/main.rs", None);
    assert!(circles.is_empty(), "import circles between files:\n{circles:#?}");
}

#[test]
fn the_file_graph_reader_sees_what_it_is_for() {
    // Use trees with braces, `self`, aliases and re-exports.
    let uses = imports::parse_uses("use super::{a, b::{self, C as D}};\npub(crate) use crate::x::Y;\n");
    assert_eq!(uses.len(), 2);
    assert!(!uses[0].0 && uses[1].0, "the second is a re-export: {uses:?}");
    let leaves: Vec<(Vec<String>, String)> = uses[0].1.clone();
    let s = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    assert_eq!(
        leaves,
        vec![
            (s(&["super", "a"]), "a".to_owned()),
            (s(&["super", "b"]), "b".to_owned()),
            (s(&["super", "b", "C"]), "D".to_owned()),
        ]
    );
    // Comments, strings and test modules are not code.
    let code = imports::code_only("let a = \"use crate::x;\"; // use crate::y;\nlet c = '{';");
    assert!(!code.contains("crate::") && !code.contains('{'), "{code}");
    let code = imports::without_test_modules(
        "fn a() {}\n#[cfg(test)]\nmod tests {\n    use super::*;\n}\nfn b() {}\n",
    );
    assert!(!code.contains("super") && code.contains("fn b"), "{code}");
    // A circle of three files is found; a chain is not.
    let p = |n: &str| PathBuf::from(n);
    let mut g = BTreeMap::new();
    g.insert(p("a"), BTreeSet::from([p("b")]));
    g.insert(p("b"), BTreeSet::from([p("c")]));
    g.insert(p("c"), BTreeSet::from([p("a")]));
    assert_eq!(imports::circles(&g), vec![vec![p("a"), p("b"), p("c")]]);
    g.insert(p("c"), BTreeSet::new());
    assert!(imports::circles(&g).is_empty());
}

/// The layer diagram of `docs/ARCHITECTURE.md`: each layer's lines, by layer.
fn documented_layers() -> BTreeMap<Layer, String> {
    let doc = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/ARCHITECTURE.md"))
        .expect("read ARCHITECTURE.md");
    let section = doc.split("## Layers and where they live").nth(1).expect("the layers section");
    let diagram = section.split("```").nth(1).expect("the layer diagram");
    let mut out: BTreeMap<Layer, String> = BTreeMap::new();
    let mut current = None;
    for line in diagram.lines() {
        let word = line.split_whitespace().next().unwrap_or("");
        current = match word {
            "handles" => Some(Layer::Handles),
            "engine" => Some(Layer::Engine),
            "store" => Some(Layer::Store),
            "values" => Some(Layer::Values),
            _ => current,
        };
        if let Some(l) = current {
            out.entry(l).or_default().push_str(&format!(" {line} "));
        }
    }
    out
}

/// Whether `text` names module `m` (as `m/`, `m.rs`, `{m,`, ` m `…).
fn names(text: &str, m: &str) -> bool {
    text.split(|c: char| !(c.is_alphanumeric() || c == '_')).any(|w| w == m)
}

#[test]
fn the_architecture_document_places_every_module_in_its_layer() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let layers = documented_layers();
    assert_eq!(layers.len(), 4, "the diagram has four layers: {layers:?}");
    let mut missing = Vec::new();
    for entry in std::fs::read_dir(&src).expect("read src") {
        let name = entry.expect("entry").file_name().to_string_lossy().trim_end_matches(".rs").to_owned();
        if matches!(name.as_str(), "lib" | "bin") {
            continue;
        }
        let Some(layer) = layer_of(&name) else {
            missing.push(format!("{name}: in no layer of tests/arch_layers.rs"));
            continue;
        };
        if !names(&layers[&layer], &name) {
            missing.push(format!("{name}: not in the {layer:?} layer of ARCHITECTURE.md's diagram"));
        }
    }
    // Every file of the engine is named in the engine's line.
    for file in sources(&src.join("engine")) {
        let rel = file.strip_prefix(src.join("engine")).expect("under engine");
        let first = rel.components().next().expect("a component").as_os_str().to_string_lossy().to_string();
        let name = first.trim_end_matches(".rs");
        if name != "mod" && !names(&layers[&Layer::Engine], name) {
            missing.push(format!("engine/{name}: not in ARCHITECTURE.md's diagram"));
        }
    }
    missing.sort();
    missing.dedup();
    assert!(missing.is_empty(), "ARCHITECTURE.md is out of date:\n{}", missing.join("\n"));
}

#[test]
fn the_checks_catch_what_they_are_for() {
    // The scanner itself: a handle importing the store, and a cycle, are both seen.
    assert_eq!(crate_paths("use crate::store::keys;"), [("store".to_owned(), Some("keys".to_owned()))]);
    assert_eq!(
        crate_paths("x(crate::engine::boundary::read_range)"),
        [("engine".to_owned(), Some("boundary".to_owned()))]
    );
    assert!(
        code_lines("/// use crate::store::keys;\n// rocksdb\nlet a = 1; // rocksdb")
            .iter()
            .all(|(_, l)| !l.contains("rocksdb") && !l.contains("crate::"))
    );
    let mut g = BTreeMap::new();
    g.insert("a".to_owned(), BTreeSet::from(["b".to_owned()]));
    g.insert("b".to_owned(), BTreeSet::from(["a".to_owned()]));
    assert_eq!(cycle(&g), Some(vec!["a".to_owned(), "b".to_owned()]));
    g.insert("b".to_owned(), BTreeSet::new());
    assert_eq!(cycle(&g), None);
}
