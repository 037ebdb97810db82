//! Lists and maps decoded within a bound, refused before anything is allocated past it.
//!
//! A child's [`Report`](crate::metrics::Report) is decoded by rmp-serde, which takes a list's
//! length from the frame and would build every entry it finds there. Its fields name these
//! functions (`#[serde(deserialize_with = ...)]`): a list longer than its bound is refused as
//! soon as its length is read, so what a report can make its parent hold is fixed by the
//! bounds, not by the frame's size.

use serde::de::{Deserialize, Deserializer, Error, MapAccess, SeqAccess, Visitor};
use std::collections::BTreeMap;
use std::fmt;
use std::marker::PhantomData;

/// Entries reserved ahead of those read: a declared length is not trusted to allocate.
const RESERVE_AHEAD: usize = 256;

/// A list of at most `MAX` entries.
pub(crate) fn vec<'de, D, T, const MAX: usize>(deserializer: D) -> Result<Vec<T>, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de>,
{
    struct List<T, const MAX: usize>(PhantomData<T>);

    impl<'de, T: Deserialize<'de>, const MAX: usize> Visitor<'de> for List<T, MAX> {
        type Value = Vec<T>;

        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            write!(f, "a list of at most {MAX} entries")
        }

        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Vec<T>, A::Error> {
            let declared = seq.size_hint().unwrap_or(0);
            if declared > MAX {
                return Err(A::Error::invalid_length(declared, &self));
            }
            let mut out = Vec::with_capacity(declared.min(RESERVE_AHEAD));
            while let Some(entry) = seq.next_element()? {
                if out.len() == MAX {
                    return Err(A::Error::invalid_length(MAX + 1, &self));
                }
                out.push(entry);
            }
            Ok(out)
        }
    }

    deserializer.deserialize_seq(List::<T, MAX>(PhantomData))
}

/// A map of at most `MAX` entries (counted as they come, so repeated keys count too).
pub(crate) fn map<'de, D, K, V, const MAX: usize>(
    deserializer: D,
) -> Result<BTreeMap<K, V>, D::Error>
where
    D: Deserializer<'de>,
    K: Deserialize<'de> + Ord,
    V: Deserialize<'de>,
{
    struct Map<K, V, const MAX: usize>(PhantomData<(K, V)>);

    impl<'de, K, V, const MAX: usize> Visitor<'de> for Map<K, V, MAX>
    where
        K: Deserialize<'de> + Ord,
        V: Deserialize<'de>,
    {
        type Value = BTreeMap<K, V>;

        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            write!(f, "a map of at most {MAX} entries")
        }

        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<BTreeMap<K, V>, A::Error> {
            let declared = map.size_hint().unwrap_or(0);
            if declared > MAX {
                return Err(A::Error::invalid_length(declared, &self));
            }
            let mut out = BTreeMap::new();
            let mut read = 0;
            while let Some((key, value)) = map.next_entry()? {
                read += 1;
                if read > MAX {
                    return Err(A::Error::invalid_length(read, &self));
                }
                out.insert(key, value);
            }
            Ok(out)
        }
    }

    deserializer.deserialize_map(Map::<K, V, MAX>(PhantomData))
}
