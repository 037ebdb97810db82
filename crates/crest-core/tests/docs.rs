//! The README and `docs/` kept as users need them:
//! - the README stays short (at most `README_LINES_MAX` lines) and names the two commands;
//! - every relative link of the README, `ARCHITECTURE.md` and `docs/*.md` reaches a file of the
//!   repository (and a heading, when it names one);
//! - no page but the history, and no code comment, dates itself with a time of day or speaks of
//!   the round, session or virtual machine it was written in: reference pages say what holds,
//!   not when it was measured.

use std::path::{Path, PathBuf};

const README_LINES_MAX: usize = 250;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The reference pages: README, ARCHITECTURE and every page of `docs/`.
fn pages() -> Vec<PathBuf> {
    let mut pages = vec![root().join("README.md"), root().join("ARCHITECTURE.md")];
    for entry in std::fs::read_dir(root().join("docs")).expect("docs/") {
        let path = entry.expect("entry").path();
        if path.extension().is_some_and(|e| e == "md") {
            pages.push(path);
        }
    }
    pages
}

/// GitHub's anchor of a heading: lower case, spaces to dashes, punctuation dropped.
fn anchor(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
            _ => None,
        })
        .collect()
}

/// The targets of the markdown links `[text](target)` in `text`.
fn links(text: &str) -> Vec<String> {
    let mut found = Vec::new();
    let mut rest = text;
    while let Some(at) = rest.find("](") {
        rest = &rest[at + 2..];
        if let Some(end) = rest.find(')') {
            found.push(rest[..end].to_string());
        }
    }
    found
}

#[test]
fn the_readme_is_short_and_gives_the_two_commands() {
    let readme = read(&root().join("README.md"));
    let lines = readme.lines().count();
    assert!(
        lines <= README_LINES_MAX,
        "README.md has {lines} lines; reference belongs in docs/"
    );
    assert!(readme.contains("cargo run --release -- local"));
    assert!(readme.contains("scripts/test"));
    let ci = read(&root().join(".ci/run"));
    assert!(
        ci.lines().any(|line| line.trim() == "scripts/test"),
        ".ci/run runs exactly the README's test command"
    );
}

#[test]
fn every_relative_link_reaches_a_file_and_heading_of_the_repository() {
    let mut broken = Vec::new();
    for page in pages() {
        let text = read(&page);
        let dir = page.parent().expect("a page is in a folder");
        for target in links(&text) {
            if target.contains("://") || target.starts_with("mailto:") {
                continue;
            }
            let (file, heading) = match target.split_once('#') {
                Some((file, heading)) => (file, Some(heading)),
                None => (target.as_str(), None),
            };
            let path = if file.is_empty() {
                page.clone()
            } else {
                dir.join(file)
            };
            if !path.exists() {
                broken.push(format!("{}: {target} (no such file)", page.display()));
                continue;
            }
            if let Some(heading) = heading
                && path.extension().is_some_and(|e| e == "md")
            {
                let found = read(&path)
                    .lines()
                    .filter_map(|line| line.strip_prefix('#'))
                    .map(|line| anchor(line.trim_start_matches('#')))
                    .any(|a| a == heading);
                if !found {
                    broken.push(format!("{}: {target} (no such heading)", page.display()));
                }
            }
        }
    }
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
}

/// Words that date a text to when it was written: "this" followed by one of them.
const DATED: [&str; 3] = ["round", "session", "vm"];

/// Whether `line` gives a time of day (hours and minutes) or speaks of the round, session or
/// virtual machine it was written in.
fn diary(line: &str) -> bool {
    let lower = line.to_lowercase();
    if DATED.iter().any(|w| lower.contains(&format!("this {w}"))) {
        return true;
    }
    let bytes = line.as_bytes();
    (0..bytes.len().saturating_sub(4)).any(|i| {
        let before_ok = i == 0 || !bytes[i - 1].is_ascii_digit() && bytes[i - 1] != b':';
        let after_ok = bytes
            .get(i + 5)
            .is_none_or(|b| !b.is_ascii_digit() && *b != b':');
        before_ok
            && after_ok
            && bytes[i].is_ascii_digit()
            && bytes[i + 1].is_ascii_digit()
            && bytes[i + 2] == b':'
            && bytes[i + 3].is_ascii_digit()
            && bytes[i + 4].is_ascii_digit()
            && bytes[i] <= b'2'
            && bytes[i + 3] <= b'5'
    })
}

#[test]
fn no_page_or_comment_keeps_a_diary() {
    let mut found = Vec::new();
    let mut files: Vec<PathBuf> = pages()
        .into_iter()
        .filter(|p| !p.ends_with("performance-history.md"))
        .collect();
    fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
        for entry in std::fs::read_dir(dir).expect("source directory") {
            let path = entry.expect("entry").path();
            if path.is_dir() {
                sources(&path, out);
            } else if path.extension().is_some_and(|e| e == "rs") {
                out.push(path);
            }
        }
    }
    for dir in ["crates", "examples", "tests", "benches"] {
        sources(&root().join(dir), &mut files);
    }
    for file in files {
        let is_rust = file.extension().is_some_and(|e| e == "rs");
        for (n, line) in read(&file).lines().enumerate() {
            // In code, only comments are prose.
            let prose = if is_rust {
                match line.find("//") {
                    Some(at) => &line[at..],
                    None => continue,
                }
            } else {
                line
            };
            if diary(prose) {
                found.push(format!("{}:{}: {}", file.display(), n + 1, line.trim()));
            }
        }
    }
    assert!(found.is_empty(), "diary words:\n{}", found.join("\n"));
}

#[test]
fn the_checks_find_what_they_look_for() {
    assert!(diary("measured 04:08 on the machine"));
    assert!(diary("(10 runs, 05:31–05:36)"));
    assert!(diary(&format!("as in this {}", DATED[0])));
    assert!(!diary("a 16:9 screen"), "ratios are not times");
    assert!(!diary("listen = \"127.0.0.1:7400\""));
    assert!(!diary("p99 1.07 ms, 2026-11-24"));
    assert_eq!(anchor("Measuring ordering"), "measuring-ordering");
    assert_eq!(
        anchor("`crest bench`: the real tree"),
        "crest-bench-the-real-tree"
    );
    assert_eq!(
        links("see [a](docs/a.md#x) and [b](https://example.org)"),
        vec!["docs/a.md#x".to_string(), "https://example.org".to_string()]
    );
}
