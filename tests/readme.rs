//! README.md held to the code, as tests/config.rs holds docs/configuration.md to the table of
//! keys: the queries it says each port answers are the commands of `src/query/commands.rs`,
//! and its table of what `cargo test` leaves out names every test file with an
//! `#[ignore = ...]` test, and no other. Each ignore says what the test needs, not what to
//! type to get it (README's table and `.ci/run` say that).
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test that cannot go on should panic

use std::collections::BTreeSet;
use std::path::Path;

const REPOSITORY: &str = env!("CARGO_MANIFEST_DIR");

fn read(path: &str) -> String {
    std::fs::read_to_string(Path::new(REPOSITORY).join(path))
        .unwrap_or_else(|e| panic!("read {path}: {e}"))
}

/// The backquoted words of `text`.
fn backquoted(text: &str) -> Vec<&str> {
    text.split('`').skip(1).step_by(2).collect()
}

/// The commands of the table in src/query/commands.rs: the `name: "..."` of each entry of
/// `COMMANDS`, upper case, the bare path's `""` left out.
fn query_routes() -> BTreeSet<String> {
    let source = read("src/query/commands.rs");
    let start = source
        .find("const COMMANDS: &[QueryCommand] = &[")
        .expect("the table COMMANDS in src/query/commands.rs");
    let table = &source[start..];
    let table = &table[..table.find("\n];\n").expect("the end of the table")];
    let mut routes = BTreeSet::new();
    for line in table.lines().map(str::trim_start) {
        let Some(name) = line.strip_prefix("name: \"") else {
            continue;
        };
        let name = name.split('"').next().unwrap();
        routes.insert(name.to_ascii_uppercase());
    }
    routes.remove("");
    assert!(
        routes.len() >= 6,
        "the commands were not found in the table: {routes:?}"
    );
    routes
}

#[test]
fn the_readme_names_every_query_a_port_answers() {
    let readme = read("README.md");
    let start = readme
        .find("Each port also answers")
        .expect("README's sentence on the queries");
    let sentence = &readme[start..];
    let sentence = &sentence[..sentence.find(". ").expect("the end of the sentence")];
    let named: BTreeSet<String> = backquoted(sentence)
        .into_iter()
        .map(|word| {
            let word = word
                .rsplit_once("/TOTVS_BROKER_QUERY/")
                .map_or(word, |(_, command)| command);
            word.split('/').next().unwrap().to_ascii_uppercase()
        })
        .collect();
    assert_eq!(
        named,
        query_routes(),
        "README's list of queries ({sentence:?}) and the commands of src/query/commands.rs"
    );
}

/// The test files (`lifecycle` for tests/lifecycle.rs) with an `#[ignore = ...]` test, and
/// every ignore's reason.
fn ignored_tests() -> (BTreeSet<String>, Vec<(String, String)>) {
    let mut files = BTreeSet::new();
    let mut reasons = Vec::new();
    for entry in std::fs::read_dir(Path::new(REPOSITORY).join("tests")).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_none_or(|e| e != "rs") {
            continue;
        }
        let name = path.file_stem().unwrap().to_string_lossy().into_owned();
        let text = std::fs::read_to_string(&path).unwrap();
        // An attribute at the start of a line: not this file's own words about it.
        for at in text.match_indices("\n#[ignore").map(|(at, _)| at) {
            files.insert(name.clone());
            let rest = &text[at..];
            let reason = rest
                .split_once('"')
                .and_then(|(_, r)| r.split_once("\"]"))
                .map_or("", |(reason, _)| reason);
            reasons.push((name.clone(), reason.to_string()));
        }
    }
    (files, reasons)
}

#[test]
fn the_readme_table_of_what_cargo_test_leaves_out_names_every_ignored_test_file() {
    let readme = read("README.md");
    let start = readme
        .find("### What `cargo test` leaves out")
        .expect("README's section on ignored tests");
    let section = &readme[start..];
    let section = &section[..section[4..]
        .find("\n#")
        .map_or(section.len(), |end| end + 4)];
    let rows: Vec<&str> = section.lines().filter(|l| l.starts_with("| `")).collect();
    let in_table: BTreeSet<String> = rows
        .iter()
        .map(|row| backquoted(row)[0].to_string())
        .collect();
    let (ignored, reasons) = ignored_tests();
    assert!(!ignored.is_empty(), "no #[ignore] found in tests/");
    assert_eq!(
        in_table, ignored,
        "README's table (first column) and the test files with #[ignore = ...] tests"
    );
    for (file, reason) in &reasons {
        assert!(
            !reason.is_empty(),
            "tests/{file}.rs: an #[ignore] without its reason"
        );
        assert!(
            !reason.contains("apt-get") && !reason.contains("Debian:"),
            "tests/{file}.rs: `{reason}`: say what the test needs, not what to type"
        );
    }
    // The tests README's command skips by name exist.
    let command = section
        .lines()
        .find(|l| l.starts_with("cargo test -- --include-ignored"))
        .expect("README's command for the ignored tests");
    let sources: String = std::fs::read_dir(Path::new(REPOSITORY).join("tests"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "rs"))
        .map(|p| std::fs::read_to_string(p).unwrap())
        .collect();
    let words: Vec<&str> = command.split_whitespace().collect();
    for pair in words.windows(2).filter(|w| w[0] == "--skip") {
        assert!(
            sources.contains(&format!("fn {}", pair[1])),
            "README skips `{}`, which names no test",
            pair[1]
        );
    }
}
