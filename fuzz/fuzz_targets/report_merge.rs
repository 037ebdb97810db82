//! `Report` merge: any two reports a child could send merge without a panic or an overflow,
//! into stats whose topics are sorted and unique.
#![no_main]

use crest_core::metrics::Report;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&split, rest)) = data.split_first() else {
        return;
    };
    let (a, b) = rest.split_at((split as usize).min(rest.len()));
    let (Ok(mut ours), Ok(theirs)) = (
        rmp_serde::from_slice::<Report>(a),
        rmp_serde::from_slice::<Report>(b),
    ) else {
        return;
    };
    ours.stats.merge(&Default::default());
    ours.merge(&theirs);
    ours.merge(&theirs);
    let topics: Vec<&str> = ours.stats.topics.iter().map(|t| t.topic.as_str()).collect();
    assert!(topics.windows(2).all(|w| w[0] < w[1]), "{topics:?}");
    ours.cap_topics(4);
    assert!(ours.stats.topics.len() <= 4);
});
