//! SigV4 canonicalisation: verifying any request never panics, and a request signed over
//! any method, path, headers and body verifies with its secret.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    // Lines: method, path, query, then `name: value` headers up to an empty line, then the
    // body.
    let text = String::from_utf8_lossy(data);
    let (head, body) = text.split_once("\n\n").unwrap_or((&text, ""));
    let mut lines = head.split('\n');
    let method = lines.next().unwrap_or_default();
    let path = lines.next().unwrap_or_default();
    let query = lines.next().unwrap_or_default();
    let headers: Vec<(String, String)> = lines
        .filter_map(|line| line.split_once(':'))
        .map(|(n, v)| (n.trim().to_ascii_lowercase(), v.to_string()))
        .collect();
    crest_gateway::fuzzing::sigv4_request(method, path, query, &headers, body.as_bytes());
});
