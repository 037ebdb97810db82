//! The SQS gateway's JSON protocol: any body, decoded as the gateway decodes one, then every
//! operation's input decoders that need no tree; each answers a typed error or a value.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|body: &[u8]| {
    crest_gateway::fuzzing::json_body(body);
});
