//! The topology and access-file parsers: any text parses to a checked file or a typed error,
//! never a panic; an access file accepted is written and read back the same.
#![no_main]

use crest_core::topology::Topology;
use crest_node::access::AccessFile;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let _ = Topology::parse(text);
    if let Ok(file) = AccessFile::parse(text) {
        let written = toml_of(&file);
        assert_eq!(AccessFile::parse(&written).as_ref(), Ok(&file));
    }
});

fn toml_of(file: &AccessFile) -> String {
    let dir = std::env::temp_dir().join(format!("crest-fuzz-{}", std::process::id()));
    let _ = std::fs::create_dir_all(&dir);
    let path = dir.join("access.toml");
    file.save(&path).expect("save");
    std::fs::read_to_string(&path).expect("read back")
}
