//! `docs/settings.md` is generated from `Settings`: each field's doc comment and its default
//! value. This test regenerates the page and fails if the committed one differs, so the
//! reference cannot drift from the code. `CREST_BLESS=1 cargo test -p crest-core --test
//! settings_doc` rewrites it.

use crest_core::config::Settings;
use std::path::PathBuf;

const PREAMBLE: &str = "\
# Settings

<!-- Generated from crates/crest-core/src/config/mod.rs by crates/crest-core/tests/settings_doc.rs:
     edit the doc comments there, then run `CREST_BLESS=1 cargo test -p crest-core --test settings_doc`. -->

Every bound and timing of a node is a named setting. A topology file sets cluster-wide values in
`[settings]` and per-node overrides in a node's `settings = { ... }`; anything unset takes the
default below. Every node checks its settings when it starts and refuses values that break a
relation between them (e.g. a push batch larger than a frame), naming the setting.
`crest sim --set NAME=VALUE` overrides one on every simulated node.

| setting | default | meaning |
|---|---|---|
";

const FOOTER: &str = "
Per-topic overrides go in `[settings.topics.NAME]`: `lease_timeout_ms`, `max_attempts`,
`dedup_window_ms`, `message_ttl_ms`, `dead_letter_topic`, and aging: `aging = { 3 = \"30m\",
4 = \"1h\" }` (a message ready longer than its priority's threshold moves one priority up) with
`aging_floor` (the most urgent priority aging promotes to, default 0), and scheduling:
`scheduling = \"weighted\"` (default `\"strict\"`) with `weights = { 0 = 8, 1 = 4, 2 = 2, 3 = 1,
4 = 0.5 }` (the default; each named priority starts a tier, see
[concepts.md](concepts.md#scheduling-strict-or-weighted)); unset ones take the node's value.
`crest topic set` sets the same at run time (`--aging 3=30m --aging-floor 1 --scheduling
weighted --weight 0=8`).

Memory above the leaves is bounded by `children × topics_max × credits_per_topic` window
entries (about 40 bytes each; a weighted topic's tiers each hold a topic's) per node, and at the root also by `reserve_ahead_bytes_max` of
reserved-ahead payloads (at most `reserve_ahead_max` entries per topic).
";

/// One field of `Settings` as the source declares it.
struct Field {
    name: String,
    doc: String,
}

/// The fields of `pub struct Settings` in `config/mod.rs`, in declaration order, with their doc
/// comments joined into one line.
fn settings_fields(source: &str) -> Vec<Field> {
    let start = source
        .find("pub struct Settings {")
        .expect("config/mod.rs declares `pub struct Settings {`");
    let body = &source[start..];
    let end = body.find("\n}").expect("the struct ends with a `}` line");
    let mut fields = Vec::new();
    let mut doc: Vec<&str> = Vec::new();
    for line in body[..end].lines().skip(1) {
        let line = line.trim();
        if let Some(text) = line.strip_prefix("///") {
            doc.push(text.trim());
        } else if let Some(decl) = line.strip_prefix("pub ") {
            let name = decl.split(':').next().expect("a field has a name").trim();
            assert!(!doc.is_empty(), "setting `{name}` has no doc comment");
            fields.push(Field {
                name: name.to_string(),
                doc: doc.join(" "),
            });
            doc.clear();
        } else {
            doc.clear();
        }
    }
    fields
}

/// A default as a reader wants it: the exact value, and a human size or duration beside it.
fn render_default(name: &str, value: &toml::Value) -> String {
    let text = match value {
        toml::Value::String(s) => format!("`\"{s}\"`"),
        toml::Value::Table(t) if t.is_empty() => "none".to_string(),
        other => format!("`{other}`"),
    };
    let toml::Value::Integer(n) = value else {
        return text;
    };
    let n = *n;
    let human = if name.ends_with("_bytes") || name.contains("_bytes_") {
        human_bytes(n)
    } else if name.ends_with("_ms") {
        human_millis(n)
    } else if name.ends_with("_us") && n >= 1000 && n % 1000 == 0 {
        human_millis(n / 1000).or_else(|| Some(format!("{} ms", n / 1000)))
    } else {
        None
    };
    match human {
        Some(h) => format!("{text} ({h})"),
        None => text,
    }
}

fn human_bytes(n: i64) -> Option<String> {
    const UNITS: [(i64, &str); 3] = [(1 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB")];
    UNITS
        .iter()
        .find(|(size, _)| n >= *size && n % size == 0)
        .map(|(size, unit)| format!("{} {unit}", n / size))
}

fn human_millis(n: i64) -> Option<String> {
    const UNITS: [(i64, &str); 4] = [
        (86_400_000, "days"),
        (3_600_000, "h"),
        (60_000, "min"),
        (1000, "s"),
    ];
    UNITS
        .iter()
        .find(|(size, _)| n >= *size && n % size == 0)
        .map(|(size, unit)| format!("{} {unit}", n / size))
}

fn generate() -> String {
    let manifest = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let source =
        std::fs::read_to_string(manifest.join("src/config/mod.rs")).expect("read config/mod.rs");
    let defaults = toml::Value::try_from(Settings::default()).expect("settings serialize");
    let defaults = defaults.as_table().expect("settings are a table");
    let mut page = String::from(PREAMBLE);
    let fields = settings_fields(&source);
    assert_eq!(
        fields.len(),
        defaults.len(),
        "every serialized setting is a documented field"
    );
    for field in fields {
        let value = defaults
            .get(&field.name)
            .unwrap_or_else(|| panic!("setting `{}` has no serialized default", field.name));
        let doc = field.doc.replace('|', "\\|");
        page.push_str(&format!(
            "| `{}` | {} | {} |\n",
            field.name,
            render_default(&field.name, value),
            doc
        ));
    }
    page.push_str(FOOTER);
    page
}

#[test]
fn settings_reference_matches_the_code() {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../docs/settings.md");
    let page = generate();
    if std::env::var_os("CREST_BLESS").is_some() {
        std::fs::write(&path, &page).expect("write docs/settings.md");
        return;
    }
    let committed = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        committed == page,
        "docs/settings.md is out of date with crates/crest-core/src/config/mod.rs; regenerate it with \
         `CREST_BLESS=1 cargo test -p crest-core --test settings_doc`"
    );
}

#[test]
fn human_units_are_exact() {
    assert_eq!(human_bytes(262_144).as_deref(), Some("256 KiB"));
    assert_eq!(human_bytes(1000), None);
    assert_eq!(human_millis(2_592_000_000).as_deref(), Some("30 days"));
    assert_eq!(human_millis(300_000).as_deref(), Some("5 min"));
    assert_eq!(human_millis(50), None);
    assert_eq!(
        render_default("wal_ack_sync_linger_us", &toml::Value::Integer(2000)),
        "`2000` (2 ms)"
    );
}
