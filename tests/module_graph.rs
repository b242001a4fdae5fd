//! The modules of `src/` import one another one way, as the data flows (accept -> sniff ->
//! select -> dial/quarantine -> relay -> account): at every level of the tree, the sibling
//! modules' `crate::`, `super::` and `self::` paths form no cycle. A parent and its own
//! children may name each other (a module declares its children and they use its items); two
//! siblings may not, in a circle of any length. Inline unit tests (`#[cfg(test)] mod tests`)
//! and `tests.rs` files are left out: a test may reach anywhere.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// A module's path from the crate root: `["config", "validate", "balancer"]`.
type Module = Vec<String>;

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

#[test]
fn the_modules_of_src_import_one_another_one_way() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let modules = modules(&src);
    let edges = sibling_edges(&modules);
    // A check that found nothing would check nothing.
    assert!(modules.len() > 20, "only {} modules found", modules.len());
    assert!(edges.len() > 40, "only {} import edges found", edges.len());
    if let Some(cycle) = cycle(&edges) {
        let mut circle: Vec<String> = cycle.iter().map(named).collect();
        circle.push(named(&cycle[0]));
        panic!(
            "these modules import one another in a circle: {}\nevery edge between them:\n{}",
            circle.join(" -> "),
            edges
                .iter()
                .filter(|(a, b)| cycle.contains(a) && cycle.contains(b))
                .map(|(a, b)| format!("  {} -> {}", named(a), named(b)))
                .collect::<Vec<_>>()
                .join("\n")
        );
    }
}

#[test]
fn the_check_finds_a_cycle_through_any_kind_of_path() {
    let module = |text: &str| text.split("::").map(str::to_string).collect::<Module>();
    let set = |pairs: &[(&str, &str)]| -> BTreeMap<Module, String> {
        pairs
            .iter()
            .map(|(name, code)| (module(name), code.to_string()))
            .collect()
    };
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
