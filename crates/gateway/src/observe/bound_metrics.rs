//! Instruments bound to the attribute sets a gateway's calls repeat
//! ([`super::genai_metrics`]): a server's calls carry a few sets (an operation,
//! a provider, a model, at most a bounded tenant), and an instrument bound to
//! its set records without the SDK's per-record lookup, which sorts and
//! SipHashes the set's keys and values once per instrument and record (about
//! 1,600 instructions each, five records a call).
//!
//! A set is looked up once per phase of the call by a fast hash of its bytes,
//! and bound on first use. Sets naming an `error.type` are never bound: the provider names
//! its error types, so they are unbounded, and failures are rare; they, and every
//! set past [`BOUND_SETS_MAX`], are recorded as unbound records are, with the
//! same result in the exported metrics.

use std::collections::HashMap;
use std::hash::{BuildHasher, Hasher};
use std::sync::RwLock;

use opentelemetry::{KeyValue, Value};

use super::semconv::ERROR_TYPE;

/// The most attribute sets bound per kind of record: far above a
/// configuration's models times operations times the tenants given series, and
/// a bound on memory whatever the calls carry (an SDK entry bound stays until
/// the server stops).
pub const BOUND_SETS_MAX: usize = 1_024;

/// The instruments of kind `V` bound per attribute set.
pub struct BoundSets<V> {
    /// The sets by a hash of their keys' and values' bytes, each hash's sets
    /// in a short list: a `KeyValue`'s own `Hash` feeds the hasher field by
    /// field and costs several times as much, on every record.
    sets: RwLock<Sets<V>>,
    /// The hash's keys, fixed for the map's life, random per map.
    state: foldhash::fast::RandomState,
}

/// A set and its bound instruments.
type Bound<V> = (Box<[KeyValue]>, V);

/// The bound sets and how many there are.
struct Sets<V> {
    by_hash: HashMap<u64, Vec<Bound<V>>, foldhash::fast::RandomState>,
    len: usize,
}

impl<V> Default for BoundSets<V> {
    fn default() -> Self {
        Self {
            sets: RwLock::new(Sets {
                by_hash: HashMap::default(),
                len: 0,
            }),
            state: foldhash::fast::RandomState::default(),
        }
    }
}

impl<V> Sets<V> {
    fn get(&self, hash: u64, attributes: &[KeyValue]) -> Option<&V> {
        let same = self.by_hash.get(&hash)?.iter().find(|(set, _)| **set == *attributes);
        same.map(|(_, bound)| bound)
    }
}

impl<V> BoundSets<V> {
    /// Runs `record` on the instruments bound to `attributes`, binding them
    /// with `bind` on the set's first use; `None`, recording nothing, when
    /// the set is not bound (an `error.type`, or [`BOUND_SETS_MAX`] reached).
    pub fn record<R>(
        &self,
        attributes: &[KeyValue],
        bind: impl FnOnce(&[KeyValue]) -> V,
        record: impl FnOnce(&V) -> R,
    ) -> Option<R> {
        let hash = self.hash(attributes);
        {
            let sets = self.sets.read().unwrap_or_else(|p| p.into_inner());
            if let Some(bound) = sets.get(hash, attributes) {
                return Some(record(bound));
            }
            if sets.len >= BOUND_SETS_MAX || attributes.iter().any(|kv| kv.key.as_str() == ERROR_TYPE) {
                return None;
            }
        }
        let mut sets = self.sets.write().unwrap_or_else(|p| p.into_inner());
        if sets.get(hash, attributes).is_none() {
            if sets.len >= BOUND_SETS_MAX {
                return None;
            }
            sets.len += 1;
            let bound = bind(attributes);
            let same_hash = sets.by_hash.entry(hash).or_default();
            same_hash.push((attributes.to_vec().into_boxed_slice(), bound));
        }
        sets.get(hash, attributes).map(record)
    }

    /// A hash of the set's keys and values, each written as its bytes; sets
    /// that differ may share one (they are told apart by equality).
    fn hash(&self, attributes: &[KeyValue]) -> u64 {
        let mut hasher = self.state.build_hasher();
        for kv in attributes {
            hasher.write(kv.key.as_str().as_bytes());
            match &kv.value {
                Value::String(s) => hasher.write(s.as_str().as_bytes()),
                Value::I64(i) => hasher.write_i64(*i),
                Value::F64(f) => hasher.write_u64(f.to_bits()),
                Value::Bool(b) => hasher.write_u8(u8::from(*b)),
                // Arrays (and kinds to come) are left to equality.
                _ => hasher.write_u8(0xff),
            }
        }
        hasher.finish()
    }

    /// How many sets are bound.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.sets.read().unwrap_or_else(|p| p.into_inner()).len
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_set_is_bound_once_and_reused() {
        let sets = BoundSets::<usize>::default();
        let mut binds = 0;
        let attributes = [KeyValue::new("gen_ai.request.model", "m")];
        for _ in 0..3 {
            let got = sets.record(
                &attributes,
                |_| {
                    binds += 1;
                    7
                },
                |v| *v,
            );
            assert_eq!(got, Some(7));
        }
        assert_eq!((binds, sets.len()), (1, 1));
    }

    #[test]
    fn sets_sharing_a_hash_are_bound_apart() {
        let sets = BoundSets::<i64>::default();
        // Arrays are left to equality: these two sets share their hash.
        let set = |n: i64| [KeyValue::new("a", Value::Array(vec![n].into()))];
        assert_eq!(sets.hash(&set(1)), sets.hash(&set(2)));
        assert_eq!(sets.record(&set(1), |_| 1, |v| *v), Some(1));
        assert_eq!(sets.record(&set(2), |_| 2, |v| *v), Some(2));
        assert_eq!(sets.record(&set(1), |_| 3, |v| *v), Some(1));
        assert_eq!(sets.len(), 2);
    }

    #[test]
    fn an_error_type_is_never_bound() {
        let sets = BoundSets::<usize>::default();
        let attributes = [KeyValue::new(ERROR_TYPE, "rate_limit_error")];
        assert_eq!(sets.record(&attributes, |_| 1, |v| *v), None);
        assert_eq!(sets.len(), 0);
    }

    #[test]
    fn past_the_bound_a_new_set_is_not_bound_and_a_known_one_still_is() {
        let sets = BoundSets::<usize>::default();
        for n in 0..BOUND_SETS_MAX {
            let attributes = [KeyValue::new("m", n as i64)];
            assert_eq!(sets.record(&attributes, |_| n, |v| *v), Some(n));
        }
        assert_eq!(sets.record(&[KeyValue::new("m", -1)], |_| 0, |v| *v), None);
        assert_eq!(sets.record(&[KeyValue::new("m", 3)], |_| 0, |v| *v), Some(3));
        assert_eq!(sets.len(), BOUND_SETS_MAX);
    }
}
