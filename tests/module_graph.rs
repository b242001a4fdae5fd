//! The modules of `src/` import one another one way, as the data flows (accept -> sniff ->
//! select -> dial/quarantine -> relay -> account), and every one of them is on the module map.
//!
//! - At every level of the tree, the sibling modules' `crate::`, `super::` and `self::` paths
//!   form no cycle. A parent and its own children may name each other (a module declares its
//!   children and they use its items); two siblings may not, in a circle of any length.
//! - The top-level modules stand in layers ([`LAYERS`]): each imports only modules of lower
//!   layers, so nothing calls upward, and a module the table does not place fails.
//!   docs/architecture.md tables the same layers, with the reasons: the two must agree.
//! - The map is the `//!` docs of `src/lib.rs` (a line for each top-level module) and of each
//!   folder's `mod.rs` (a line for each of its files): a module missing from its map fails, and
//!   so does a line for a module that is gone.
//! - The binary's own modules (those `src/main.rs` declares: `cli`) stand above every layer:
//!   they reach the library as `appbroker::`, and the library cannot name them (the compiler
//!   holds that). `src/main.rs`'s docs map them; their folders' `mod.rs` as in the library.
//! - No two types of `src/` share a name (a name found by search means one thing), but a
//!   platform's stand-in for another's ([`STAND_INS`]).
//!
//! Inline unit tests (`#[cfg(test)] mod tests`) and `tests.rs` files are left out: a test may
//! reach anywhere.
//!
//! The side-by-side benchmark's runner (`benches/proxies/`) is held to the first rule too: its
//! modules form no cycle.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Each top-level module of `src/` and its layer, from the top down: a module may import only
/// modules of a lower layer (a higher number here is a lower layer). Two modules of one layer
/// do not import each other. docs/architecture.md ("Layout") gives the reasons, in a table this
/// file holds to it.
const LAYERS: &[(&str, u32)] = &[
    // The binary's commands that are not the broker itself.
    ("admin", 0),
    ("demo", 0),
    // The parent that holds the listeners and runs the broker as its child.
    ("supervisor", 1),
    // The broker as a library: it starts everything below.
    ("broker", 2),
    // The two connection paths, side by side (neither knows the other: the TLS step of both
    // is the listener layer's), and the query interface both hand queries to.
    ("tcp", 3),
    ("http_balancer", 3),
    // Alerts and restarts: they read the balancers' alerts and state, and run commands and
    // HTTP requests of their own; the broker and the supervisor start them.
    ("alerts", 3),
    ("query", 4),
    // The balancer's live state, and the HTTP engine, which knows nothing of balancers.
    ("balancer", 5),
    ("http", 5),
    // Sockets, and an accepted connection's TLS step.
    ("net", 6),
    // What the whole process shares.
    ("support", 7),
    ("config", 8),
    ("tls", 9),
];

/// A module's path from the crate root: `["config", "validate", "balancer"]`.
type Module = Vec<String>;

/// The binary's top-level modules: the `mod NAME;` lines of `src/main.rs`.
fn binary_tops(src: &Path) -> BTreeSet<String> {
    let main = std::fs::read_to_string(src.join("main.rs")).expect("src/main.rs");
    main.lines()
        .filter_map(|line| line.trim().strip_prefix("mod ")?.strip_suffix(';'))
        .map(str::to_string)
        .collect()
}

/// The modules of one crate of `src/`: the binary's (`binary`), or the library's.
fn of_crate(
    modules: &BTreeMap<Module, String>,
    tops: &BTreeSet<String>,
    binary: bool,
) -> BTreeMap<Module, String> {
    modules
        .iter()
        .filter(|(module, _)| tops.contains(&module[0]) == binary)
        .map(|(module, text)| (module.clone(), text.clone()))
        .collect()
}

/// Every module file of `src/` (but the crate roots and test modules) and its source.
fn modules(src: &Path) -> BTreeMap<Module, String> {
    let mut found = BTreeMap::new();
    let mut dirs = vec![src.to_path_buf()];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).expect("read src/") {
            let path = entry.expect("a directory entry").path();
            if path.is_dir() {
                dirs.push(path);
                continue;
            }
            if path.extension().is_none_or(|e| e != "rs") {
                continue;
            }
            let relative: PathBuf = path.strip_prefix(src).unwrap().with_extension("");
            let mut module: Module = relative
                .components()
                .map(|c| c.as_os_str().to_string_lossy().into_owned())
                .collect();
            if module.last().is_some_and(|m| m == "mod") {
                module.pop();
            }
            if module == ["lib"] || module == ["main"] || module.iter().any(|m| m == "tests") {
                continue;
            }
            let text = std::fs::read_to_string(&path).expect("read a module");
            found.insert(module, text);
        }
    }
    found
}

/// The code of a module file: comments, string contents and inline unit tests left out.
fn code_of(text: &str) -> String {
    let text = match text.find("#[cfg(test)]\nmod tests") {
        Some(at) => &text[..at],
        None => text,
    };
    let mut code = String::with_capacity(text.len());
    for line in text.lines() {
        let line = line.split("//").next().unwrap_or_default();
        // A path inside a string is no import (log lines name modules in words).
        let mut in_string = false;
        for c in line.chars() {
            if c == '"' {
                in_string = !in_string;
            } else if !in_string {
                code.push(c);
            }
        }
        code.push('\n');
    }
    code
}

/// The paths `code` names after `crate::`, `super::` (any number) and `self::`, each as
/// (how many levels up from the module: `None` for the crate root, segments).
fn paths(code: &str) -> Vec<(Option<usize>, Vec<String>)> {
    let mut found = Vec::new();
    let bytes = code.as_bytes();
    let mut at = 0;
    while at < code.len() {
        let rest = &code[at..];
        let starts_word =
            at == 0 || !(bytes[at - 1].is_ascii_alphanumeric() || bytes[at - 1] == b'_');
        let root = if !starts_word {
            None
        } else if rest.starts_with("crate::") {
            Some((None, "crate::".len()))
        } else if rest.starts_with("self::") {
            Some((Some(0), "self::".len()))
        } else if rest.starts_with("super::") {
            let mut ups = 0;
            let mut len = 0;
            while code[at + len..].starts_with("super::") {
                ups += 1;
                len += "super::".len();
            }
            Some((Some(ups), len))
        } else {
            None
        };
        match root {
            Some((up, len)) => {
                let (tails, used) = tree(&code[at + len..]);
                for tail in tails {
                    found.push((up, tail));
                }
                at += len + used.max(1);
            }
            None => at += rest.chars().next().map_or(1, char::len_utf8),
        }
    }
    found
}

/// The paths of a `use` tree at the start of `text` (`a::b`, `a::{b, c::d}`, `{a, b}`), and
/// how many bytes it took.
fn tree(text: &str) -> (Vec<Vec<String>>, usize) {
    let mut segments = Vec::new();
    let mut at = 0;
    loop {
        let rest = &text[at..];
        if let Some(inner) = rest.strip_prefix('{') {
            let mut paths = Vec::new();
            let mut used = 1;
            let mut inner_at = 0;
            loop {
                let trimmed = inner[inner_at..].trim_start_matches([' ', '\n', '\t', ',']);
                inner_at = inner.len() - trimmed.len();
                if trimmed.starts_with('}') || trimmed.is_empty() {
                    used += inner_at + 1;
                    break;
                }
                let (sub, took) = tree(trimmed);
                for path in sub {
                    let mut full = segments.clone();
                    full.extend(path);
                    paths.push(full);
                }
                inner_at += took.max(1);
            }
            return (paths, at + used);
        }
        let word: String = rest
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect();
        if word.is_empty() {
            return (vec![segments], at);
        }
        at += word.len();
        segments.push(word);
        if text[at..].starts_with("::") {
            at += 2;
        } else {
            return (vec![segments], at);
        }
    }
}

/// The module a path from `from` names: the longest of its prefixes that is a module.
fn resolve(
    from: &Module,
    up: Option<usize>,
    tail: &[String],
    known: &BTreeSet<Module>,
) -> Option<Module> {
    let mut base: Module = match up {
        None => Vec::new(),
        Some(ups) => from[..from.len().checked_sub(ups)?].to_vec(),
    };
    let mut best = None;
    for segment in tail {
        base.push(segment.clone());
        if known.contains(&base) {
            best = Some(base.clone());
        }
    }
    best
}

/// The import edges between siblings: for each path from one module to another that is
/// neither its ancestor nor its descendant, the edge between the two children of their
/// closest common ancestor that contain them.
fn sibling_edges(modules: &BTreeMap<Module, String>) -> BTreeSet<(Module, Module)> {
    let known: BTreeSet<Module> = modules.keys().cloned().collect();
    let mut edges = BTreeSet::new();
    for (from, source) in modules {
        for (up, tail) in paths(&code_of(source)) {
            let Some(to) = resolve(from, up, &tail, &known) else {
                continue;
            };
            let common = from.iter().zip(&to).take_while(|(a, b)| a == b).count();
            if common == from.len() || common == to.len() {
                continue; // itself, an ancestor or a descendant
            }
            edges.insert((from[..=common].to_vec(), to[..=common].to_vec()));
        }
    }
    edges
}

/// A cycle of `edges`, as the modules in it, when there is one.
fn cycle(edges: &BTreeSet<(Module, Module)>) -> Option<Vec<Module>> {
    let mut next: BTreeMap<&Module, Vec<&Module>> = BTreeMap::new();
    for (from, to) in edges {
        next.entry(from).or_default().push(to);
    }
    // Depth first, with the path walked so far: an edge back into the path closes a cycle.
    fn visit<'a>(
        node: &'a Module,
        next: &BTreeMap<&'a Module, Vec<&'a Module>>,
        path: &mut Vec<&'a Module>,
        done: &mut BTreeSet<&'a Module>,
    ) -> Option<Vec<Module>> {
        if let Some(at) = path.iter().position(|m| *m == node) {
            return Some(path[at..].iter().map(|m| (*m).clone()).collect());
        }
        if !done.insert(node) {
            return None;
        }
        path.push(node);
        for to in next.get(node).into_iter().flatten() {
            if let Some(found) = visit(to, next, path, done) {
                return Some(found);
            }
        }
        path.pop();
        None
    }
    let mut done = BTreeSet::new();
    for start in next.keys() {
        let mut path = Vec::new();
        done.clear();
        if let Some(found) = visit(start, &next, &mut path, &mut done) {
            return Some(found);
        }
    }
    None
}

fn named(module: &Module) -> String {
    module.join("::")
}

/// The layer of a top-level module, from [`LAYERS`].
fn layer_of(module: &str, layers: &[(&str, u32)]) -> Option<u32> {
    layers.iter().find(|(m, _)| *m == module).map(|(_, l)| *l)
}

/// The imports between top-level modules that do not go to a lower layer (upward, or
/// sideways within one layer), and the top-level modules the table does not place.
fn layer_violations(
    edges: &BTreeSet<(Module, Module)>,
    modules: &BTreeMap<Module, String>,
    layers: &[(&str, u32)],
) -> Vec<String> {
    let mut found = Vec::new();
    let tops: BTreeSet<&String> = modules.keys().map(|m| &m[0]).collect();
    for top in &tops {
        if layer_of(top, layers).is_none() {
            found.push(format!("{top} is in no layer of LAYERS"));
        }
    }
    for (name, _) in layers {
        if !tops.iter().any(|t| t == name) {
            found.push(format!("LAYERS places {name}, which is no module of src/"));
        }
    }
    for (from, to) in edges.iter().filter(|(from, _)| from.len() == 1) {
        let (Some(a), Some(b)) = (layer_of(&from[0], layers), layer_of(&to[0], layers)) else {
            continue;
        };
        if a >= b {
            found.push(format!(
                "{} (layer {a}) imports {} (layer {b}), which is not below it",
                from[0], to[0]
            ));
        }
    }
    found
}

/// The modules a map lists: the first name of each `//! - ` item of the file's `//!` docs,
/// written `` [`name`] `` or `` `name` ``.
fn listed(text: &str) -> BTreeSet<String> {
    text.lines()
        .filter_map(|line| line.strip_prefix("//! - "))
        .filter_map(|item| {
            let item = item.strip_prefix('[').unwrap_or(item).strip_prefix('`')?;
            let name = &item[..item.find('`')?];
            let is_name = name
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
            (is_name && !name.is_empty()).then(|| name.to_string())
        })
        .collect()
}

/// What the maps get wrong: each module missing from its parent's map (the crate root's for a
/// top-level module, the folder's `mod.rs` for the others), and each map line for a module
/// that is not there. `maps` holds each parent's map text by the parent's path (`[]` for the
/// crate root, whose file is `root`).
fn map_errors(
    modules: &BTreeMap<Module, String>,
    maps: &BTreeMap<Module, String>,
    root: &str,
) -> Vec<String> {
    let mut children: BTreeMap<Module, BTreeSet<String>> = BTreeMap::new();
    for module in modules.keys() {
        let (name, parent) = module.split_last().unwrap();
        children
            .entry(parent.to_vec())
            .or_default()
            .insert(name.clone());
    }
    let mut found = Vec::new();
    for (parent, names) in &children {
        let file = if parent.is_empty() {
            root.to_string()
        } else {
            format!("src/{}/mod.rs", parent.join("/"))
        };
        let Some(map) = maps.get(parent) else {
            found.push(format!("{file}: no map of {names:?}"));
            continue;
        };
        let on_map = listed(map);
        for missing in names.difference(&on_map) {
            found.push(format!("{file}: no `//! - [`{missing}`]: ...` line"));
        }
        for gone in on_map.difference(names) {
            found.push(format!(
                "{file}: a line for `{gone}`, which is no module there"
            ));
        }
    }
    found
}

/// The map of each folder that holds modules, by the folder's module path: the crate root's
/// docs (`root`: `lib.rs` or `main.rs`) for the crate root, each folder's `mod.rs` for the
/// rest.
fn maps(src: &Path, root: &str, modules: &BTreeMap<Module, String>) -> BTreeMap<Module, String> {
    let mut maps = BTreeMap::new();
    maps.insert(
        Vec::new(),
        std::fs::read_to_string(src.join(root)).expect("the crate root"),
    );
    for (module, text) in modules {
        let folder = module
            .iter()
            .fold(src.to_path_buf(), |path, m| path.join(m));
        if folder.join("mod.rs").is_file() {
            maps.insert(module.clone(), text.clone());
        }
    }
    maps
}

#[test]
fn the_modules_of_src_import_one_another_one_way() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    assert_no_cycle(&src, 20, 40);
}

#[test]
fn the_modules_of_the_proxies_benchmark_import_one_another_one_way() {
    let runner = Path::new(env!("CARGO_MANIFEST_DIR")).join("benches/proxies");
    assert_no_cycle(&runner, 5, 5);
}

/// Fails when the modules under `root` (a crate's source folder, its root file left out)
/// import one another in a circle, naming the circle and every edge between its modules; and
/// when fewer than `modules` modules or `edges` edges were found, since a check that found
/// nothing would check nothing.
fn assert_no_cycle(root: &Path, modules: usize, edges: usize) {
    let found = self::modules(root);
    let between = sibling_edges(&found);
    assert!(found.len() >= modules, "only {} modules found", found.len());
    assert!(
        between.len() >= edges,
        "only {} import edges found",
        between.len()
    );
    let Some(cycle) = cycle(&between) else {
        return;
    };
    let mut circle: Vec<String> = cycle.iter().map(named).collect();
    circle.push(named(&cycle[0]));
    panic!(
        "{}: these modules import one another in a circle: {}\nevery edge between them:\n{}",
        root.display(),
        circle.join(" -> "),
        between
            .iter()
            .filter(|(a, b)| cycle.contains(a) && cycle.contains(b))
            .map(|(a, b)| format!("  {} -> {}", named(a), named(b)))
            .collect::<Vec<_>>()
            .join("\n")
    );
}

/// A module path of a made-up tree: `"a::b"`.
fn module(text: &str) -> Module {
    text.split("::").map(str::to_string).collect()
}

/// A made-up tree: each module's path and its code.
fn set(pairs: &[(&str, &str)]) -> BTreeMap<Module, String> {
    pairs
        .iter()
        .map(|(name, code)| (module(name), code.to_string()))
        .collect()
}

#[test]
fn the_check_finds_a_cycle_through_any_kind_of_path() {
    // crate:: paths, a `use` group, a nested group, super:: and self:: at depth.
    let circle = set(&[
        ("a", "use crate::{b, c::d};"),
        ("b", "fn f() { crate::c::d::g() }"),
        ("c", "mod d;"),
        ("c::d", "use super::super::a::X;"),
        ("e", "mod f; mod g;"),
        ("e::f", "use super::g::Y;"),
        ("e::g", "use crate::e::{self, f::Z};"),
    ]);
    let edges = sibling_edges(&circle);
    assert!(edges.contains(&(module("a"), module("b"))));
    assert!(edges.contains(&(module("c"), module("a"))));
    assert!(edges.contains(&(module("e::f"), module("e::g"))));
    assert!(edges.contains(&(module("e::g"), module("e::f"))));
    assert!(cycle(&edges).is_some());
    // One way only, and a child naming its parent: no cycle. Strings and comments name
    // nothing.
    let one_way = set(&[
        (
            "a",
            "use crate::b; // crate::c\nfn f() { log(\"crate::c\") }",
        ),
        ("b", "use super::c;"),
        ("c", "mod d;"),
        ("c::d", "use super::X; use crate::c::Y;"),
    ]);
    let edges = sibling_edges(&one_way);
    assert_eq!(edges.len(), 2, "{edges:?}");
    assert!(cycle(&edges).is_none());
}

#[test]
fn each_module_imports_only_modules_of_lower_layers() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let modules = modules(&src);
    let edges = sibling_edges(&modules);
    let top_edges = edges.iter().filter(|(from, _)| from.len() == 1).count();
    assert!(
        top_edges > 30,
        "only {top_edges} imports between top-level modules found"
    );
    // The binary's modules are in no layer: above them all.
    let library = of_crate(&modules, &binary_tops(&src), false);
    let violations = layer_violations(&edges, &library, LAYERS);
    assert!(
        violations.is_empty(),
        "the layers do not hold (tests/module_graph.rs, LAYERS):\n  {}",
        violations.join("\n  ")
    );
}

#[test]
fn every_module_is_on_the_map_and_the_map_names_only_modules() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let modules = modules(&src);
    let binary = binary_tops(&src);
    let library = of_crate(&modules, &binary, false);
    let maps_of_library = maps(&src, "lib.rs", &library);
    // A check that found no folder would check nothing.
    assert!(
        maps_of_library.len() > 10,
        "only {} maps found",
        maps_of_library.len()
    );
    let mut errors = map_errors(&library, &maps_of_library, "src/lib.rs");
    let binary = of_crate(&modules, &binary, true);
    errors.extend(map_errors(
        &binary,
        &maps(&src, "main.rs", &binary),
        "src/main.rs",
    ));
    assert!(
        errors.is_empty(),
        "the module map (src/lib.rs, src/main.rs and each folder's mod.rs) is not the tree:\n  {}",
        errors.join("\n  ")
    );
}

/// The table of layers in docs/architecture.md ("Layout"): each row's layer and the modules
/// it names in backquotes.
fn documented_layers(text: &str) -> BTreeMap<String, u32> {
    let layout = &text[text.find("## Layout").expect("a Layout section")..];
    let layout = &layout[..layout[3..].find("\n## ").map_or(layout.len(), |at| at + 3)];
    let mut layers = BTreeMap::new();
    for row in layout.lines().filter(|l| l.starts_with('|')) {
        let cells: Vec<&str> = row.split('|').map(str::trim).collect();
        let Some(Ok(layer)) = cells.get(1).map(|c| c.parse::<u32>()) else {
            continue; // the head and its rule
        };
        for name in cells[2].split('`').skip(1).step_by(2) {
            layers.insert(name.to_string(), layer);
        }
    }
    layers
}

#[test]
fn docs_architecture_tables_the_layers_as_layers_has_them() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(root.join("docs/architecture.md")).expect("the doc");
    let documented = documented_layers(&text);
    let held: BTreeMap<String, u32> = LAYERS.iter().map(|&(m, l)| (m.to_string(), l)).collect();
    assert_eq!(
        documented, held,
        "docs/architecture.md's table of layers (left) and LAYERS (right) differ"
    );
    // LAYERS itself places every module of the library (each_module_imports_only_...).
    let src = root.join("src");
    let all = modules(&src);
    let library = of_crate(&all, &binary_tops(&src), false);
    let tops: BTreeSet<&String> = library.keys().map(|m| &m[0]).collect();
    assert!(tops.iter().all(|m| held.contains_key(*m)), "{tops:?}");
}

#[test]
fn the_checks_find_an_upward_import_and_a_module_off_the_map() {
    let layers: &[(&str, u32)] = &[("top", 0), ("low", 1), ("peer", 1)];
    // Downward only: nothing to say.
    let fine = set(&[("top", "use crate::low::X;"), ("low", ""), ("peer", "")]);
    assert!(layer_violations(&sibling_edges(&fine), &fine, layers).is_empty());
    // Upward, sideways, and a module the table does not place.
    let wrong = set(&[
        ("top", ""),
        ("low", "fn f() { crate::top::g() }"),
        ("peer", "use crate::low::{X, Y};"),
        ("new", ""),
    ]);
    let violations = layer_violations(&sibling_edges(&wrong), &wrong, layers);
    assert_eq!(violations.len(), 3, "{violations:?}");
    assert!(
        violations
            .iter()
            .any(|v| v.starts_with("low (layer 1) imports top"))
    );
    assert!(
        violations
            .iter()
            .any(|v| v.starts_with("peer (layer 1) imports low"))
    );
    assert!(
        violations
            .iter()
            .any(|v| v.starts_with("new is in no layer"))
    );
    // A map with a line each (linked or not), then one with a module missing and one gone.
    let tree = set(&[("a", ""), ("a::b", ""), ("a::c", ""), ("d", "")]);
    let crate_root = Module::new;
    let mut maps = BTreeMap::new();
    maps.insert(
        crate_root(),
        "//! - [`a`]: one.\n//! - `d` (Unix): two.\n".to_string(),
    );
    let folder = "//! Text.\n//!\n//! - `b`: x.\n//! - [`c`](mod@c): y.\n\nmod b;\n";
    maps.insert(module("a"), folder.to_string());
    assert_eq!(map_errors(&tree, &maps, "src/lib.rs"), Vec::<String>::new());
    let mut stale = maps.clone();
    stale.insert(
        crate_root(),
        "//! - [`a`]: one.\n//! - [`e`]: gone.\n".to_string(),
    );
    let errors = map_errors(&tree, &stale, "src/lib.rs");
    assert_eq!(errors.len(), 2, "{errors:?}");
    assert!(errors.iter().any(|e| e.contains("no `//! - [`d`]")));
    assert!(errors.iter().any(|e| e.contains("`e`, which is no module")));
}

/// The modules that define types under another module's names on purpose, and why: each is
/// the stand-in compiled where the other is not (`#[cfg]`), so only one is ever built.
const STAND_INS: &[(&str, &str)] = &[(
    "cli::elsewhere",
    "off Unix, the one stand-in for each item of cli::unix, under the same names",
)];

/// The `struct`, `enum`, `union`, `type` and `trait` names `code` declares at its top level
/// (an `impl`'s or a trait's associated types are indented, and are not declarations of a
/// type of the crate).
fn type_names(code: &str) -> Vec<String> {
    let mut names = Vec::new();
    for line in code.lines() {
        let mut rest = line;
        if let Some(after) = rest.strip_prefix("pub") {
            rest = match after.strip_prefix('(') {
                Some(scoped) => scoped.split_once(')').map_or("", |(_, r)| r),
                None => after,
            };
            rest = rest.trim_start();
        }
        for kind in ["struct ", "enum ", "union ", "type ", "trait "] {
            if let Some(after) = rest.strip_prefix(kind) {
                let name: String = after
                    .chars()
                    .take_while(|c| c.is_alphanumeric() || *c == '_')
                    .collect();
                names.push(name);
            }
        }
    }
    names
}

/// Each type name declared twice or more in `modules`, with the modules declaring it.
fn shared_type_names(modules: &BTreeMap<Module, String>) -> BTreeMap<String, Vec<String>> {
    let mut declared: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for (module, text) in modules {
        let path = module.join("::");
        if STAND_INS.iter().any(|&(m, _)| m == path) {
            continue;
        }
        for name in type_names(&code_of(text)) {
            declared.entry(name).or_default().push(path.clone());
        }
    }
    declared.retain(|_, modules| modules.len() > 1);
    declared
}

/// A name found by search means one thing: no two types of `src/` (test modules aside) share
/// a name, so `Failure` or `Client` never leaves a reader to ask which.
#[test]
fn no_two_types_share_a_name() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let shared = shared_type_names(&modules(&src));
    assert!(
        shared.is_empty(),
        "types of src/ that share a name (give each a name saying what it is): {shared:?}"
    );
}

#[test]
fn the_check_finds_two_types_of_one_name() {
    let tree = set(&[
        (
            "a",
            "pub struct Failure {\n}\nimpl X for Y {\n    type Failure = u8;\n}\n",
        ),
        ("b", "pub(crate) enum Failure {}\ntype Outcome = u8;\n"),
        ("c", "trait Outcome {}\nstruct Other;\n"),
        ("cli::elsewhere", "pub struct Other;\n"),
    ]);
    let shared = shared_type_names(&tree);
    assert_eq!(shared.len(), 2, "{shared:?}");
    assert_eq!(shared["Failure"], ["a", "b"]);
    assert_eq!(shared["Outcome"], ["b", "c"]);
}
