//! The SQS gateway's query protocol: any query string and form body become the JSON
//! protocol's input, or a typed error; no shape of parameters may panic or exhaust the
//! stack (batch entries nested 5,000 deep once did).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    // The first line is the query string, the rest the form body.
    let (query, form) = match data.iter().position(|b| *b == b'\n') {
        Some(at) => (&data[..at], &data[at + 1..]),
        None => (&[][..], data),
    };
    crest_gateway::fuzzing::query_request(&String::from_utf8_lossy(query), form);
});
