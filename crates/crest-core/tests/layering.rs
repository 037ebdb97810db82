//! The shape of the workspace's source, checked so it stays readable:
//! - in every crate, the modules depend on each other without a circle (a reader can learn
//!   them bottom up, and a change low down cannot be caught in a loop of files that all need
//!   each other);
//! - no source file of the workspace grows past `FILE_LINES_MAX` lines.
//!
//! A module is a file or folder directly under a crate's `src/`; it depends on another when its
//! code (not its comments) names `crate::other` (or `crate::{other, ...}`).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("read source directory") {
        let path = entry.expect("directory entry").path();
        if path.is_dir() {
            if path.file_name().is_some_and(|n| n == "target") {
                continue;
            }
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The code of a file without its comments (line comments and doc comments).
fn code_of(source: &str) -> String {
    source
        .lines()
        .map(|line| match line.find("//") {
            Some(at) => &line[..at],
            None => line,
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// `crate::name` references in `code`.
fn crate_references(code: &str) -> BTreeSet<String> {
    let mut found = BTreeSet::new();
    let mut rest = code;
    while let Some(at) = rest.find("crate::") {
        let preceded_by_ident = rest[..at]
            .chars()
            .next_back()
            .is_some_and(|c| c.is_alphanumeric() || c == '_');
        rest = &rest[at + "crate::".len()..];
        if preceded_by_ident {
            continue;
        }
        // `crate::{a, b::c}`: the first name of each path in the group.
        let group = rest
            .strip_prefix('{')
            .and_then(|inner| inner.find('}').map(|end| &inner[..end]));
        let heads: Vec<&str> = match group {
            Some(inner) => inner.split(',').collect(),
            None => vec![rest],
        };
        for head in heads {
            let name: String = head
                .trim_start()
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_')
                .collect();
            if !name.is_empty() && name != "self" {
                found.insert(name);
            }
        }
    }
    found
}

/// The workspace's root directory.
fn workspace() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Every crate's `src/` directory: the workspace's and each of `crates/`.
fn crate_sources() -> Vec<PathBuf> {
    let root = workspace();
    let mut sources = vec![root.join("src")];
    for entry in std::fs::read_dir(root.join("crates")).expect("read crates/") {
        sources.push(entry.expect("directory entry").path().join("src"));
    }
    sources.retain(|src| src.is_dir());
    sources.sort();
    sources
}

/// The module graph of the crate whose source is `src`: module → the modules it names.
fn module_graph(src: &Path) -> BTreeMap<String, BTreeSet<String>> {
    let mut files = Vec::new();
    rust_files(src, &mut files);
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for file in files {
        let relative = file.strip_prefix(src).expect("under src");
        let module = relative
            .components()
            .next()
            .expect("a first component")
            .as_os_str()
            .to_string_lossy()
            .trim_end_matches(".rs")
            .to_string();
        // The crate root (a library's or a binary's) is not a module of its own.
        if module == "lib" || module == "main" {
            continue;
        }
        let source = std::fs::read_to_string(&file).expect("read source file");
        let references = crate_references(&code_of(&source));
        let entry = graph.entry(module.clone()).or_default();
        entry.extend(references.into_iter().filter(|r| *r != module));
    }
    // Names that are not modules (re-exports at the crate root) are not edges.
    let modules: BTreeSet<String> = graph.keys().cloned().collect();
    for deps in graph.values_mut() {
        deps.retain(|d| modules.contains(d));
    }
    graph
}

/// A circle in `graph`, if there is one, as the modules along it.
fn find_cycle(graph: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    #[derive(Clone, Copy, PartialEq)]
    enum Mark {
        Open,
        Done,
    }
    fn visit(
        node: &str,
        graph: &BTreeMap<String, BTreeSet<String>>,
        marks: &mut BTreeMap<String, Mark>,
        path: &mut Vec<String>,
    ) -> Option<Vec<String>> {
        match marks.get(node) {
            Some(Mark::Done) => return None,
            Some(Mark::Open) => {
                let start = path
                    .iter()
                    .position(|n| n == node)
                    .expect("open is on the path");
                let mut cycle = path[start..].to_vec();
                cycle.push(node.to_string());
                return Some(cycle);
            }
            None => {}
        }
        marks.insert(node.to_string(), Mark::Open);
        path.push(node.to_string());
        for next in graph.get(node).into_iter().flatten() {
            if let Some(cycle) = visit(next, graph, marks, path) {
                return Some(cycle);
            }
        }
        path.pop();
        marks.insert(node.to_string(), Mark::Done);
        None
    }
    let mut marks = BTreeMap::new();
    for node in graph.keys() {
        if let Some(cycle) = visit(node, graph, &mut marks, &mut Vec::new()) {
            return Some(cycle);
        }
    }
    None
}

#[test]
fn no_crate_has_an_import_circle() {
    let sources = crate_sources();
    assert!(sources.len() >= 10, "every crate found: {sources:?}");
    let core = module_graph(&workspace().join("crates/crest-core/src"));
    assert!(core.contains_key("leaf") && core.contains_key("wire"));
    let circles: Vec<String> = sources
        .iter()
        .filter_map(|src| {
            let cycle = find_cycle(&module_graph(src))?;
            Some(format!("{}: {}", src.display(), cycle.join(" -> ")))
        })
        .collect();
    assert!(
        circles.is_empty(),
        "import circles (move what both sides need down into a module both can use):\n{}",
        circles.join("\n")
    );
}

#[test]
fn the_checker_finds_a_circle_and_ignores_comments() {
    let refs = crate_references(&code_of(
        "use crate::wire::Wire; // crate::leaf\n/// [`crate::root::Root`]\nlet x = crate::key::Key;",
    ));
    assert_eq!(
        refs,
        BTreeSet::from(["key".to_string(), "wire".to_string()])
    );
    let grouped = crate_references("use crate::{api, params::text, self};\nuse crate::{Caller};");
    assert_eq!(
        grouped,
        BTreeSet::from(["api".into(), "params".into(), "Caller".into()])
    );
    let graph = BTreeMap::from([
        ("a".to_string(), BTreeSet::from(["b".to_string()])),
        ("b".to_string(), BTreeSet::from(["c".to_string()])),
        ("c".to_string(), BTreeSet::from(["a".to_string()])),
    ]);
    assert_eq!(
        find_cycle(&graph),
        Some(vec!["a".into(), "b".into(), "c".into(), "a".into()])
    );
    let acyclic = BTreeMap::from([
        ("a".to_string(), BTreeSet::from(["b".to_string()])),
        ("b".to_string(), BTreeSet::new()),
    ]);
    assert_eq!(find_cycle(&acyclic), None);
}

/// Longest a source file may grow, in lines: past it, a file has several subjects and a reader
/// finds none of them by its name.
const FILE_LINES_MAX: usize = 1000;

/// Files still over [`FILE_LINES_MAX`], each with the most lines it may have until it is split.
/// The list only shrinks: a file split below the limit must leave it.
const OVER_LIMIT: &[(&str, usize)] = &[];

#[test]
fn no_source_file_grows_past_the_line_limit() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    let mut files = Vec::new();
    for dir in ["crates", "examples", "tests", "benches"] {
        rust_files(&root.join(dir), &mut files);
    }
    assert!(files.len() > 50, "the walk found the workspace's sources");
    let mut problems = Vec::new();
    for file in files {
        let name = file
            .strip_prefix(&root)
            .expect("under the workspace")
            .to_string_lossy()
            .to_string();
        let lines = std::fs::read_to_string(&file)
            .expect("read source file")
            .lines()
            .count();
        let allowed = OVER_LIMIT
            .iter()
            .find(|(listed, _)| *listed == name)
            .map(|(_, max)| *max);
        match allowed {
            Some(max) if lines > max => {
                problems.push(format!("{name}: {lines} lines, grown past its {max}"));
            }
            Some(_) if lines <= FILE_LINES_MAX => problems.push(format!(
                "{name}: {lines} lines, now within {FILE_LINES_MAX}: remove it from OVER_LIMIT"
            )),
            None if lines > FILE_LINES_MAX => problems.push(format!(
                "{name}: {lines} lines, over {FILE_LINES_MAX}: split it by subject"
            )),
            _ => {}
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}
