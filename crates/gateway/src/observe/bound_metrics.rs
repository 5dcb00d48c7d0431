//! Instruments bound to the attribute sets a gateway's calls repeat
//! ([`super::genai_metrics`]): a server's calls carry a few sets (an operation,
//! a provider, a model, at most a bounded tenant), and an instrument bound to
//! its set records without the SDK's per-record lookup, which sorts and
//! SipHashes the set's keys and values once per instrument and record (about
//! 1,600 instructions each, five records a call).
//!
//! A set is looked up once per phase of the call with a fast hash, and bound on
//! first use. Sets naming an `error.type` are never bound: the provider names
//! its error types, so they are unbounded, and failures are rare; they, and every
//! set past [`BOUND_SETS_MAX`], are recorded as unbound records are, with the
//! same result in the exported metrics.

use std::collections::HashMap;
use std::sync::RwLock;

use opentelemetry::KeyValue;

use super::semconv::ERROR_TYPE;

/// The most attribute sets bound per kind of record: far above a
/// configuration's models times operations times the tenants given series, and
/// a bound on memory whatever the calls carry (an SDK entry bound stays until
/// the server stops).
pub const BOUND_SETS_MAX: usize = 1_024;

/// The instruments of kind `V` bound per attribute set.
pub struct BoundSets<V> {
    sets: RwLock<HashMap<Box<[KeyValue]>, V, foldhash::fast::RandomState>>,
}

impl<V> Default for BoundSets<V> {
    fn default() -> Self {
        Self {
            sets: RwLock::new(HashMap::default()),
        }
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
        {
            let sets = self.sets.read().unwrap_or_else(|p| p.into_inner());
            if let Some(bound) = sets.get(attributes) {
                return Some(record(bound));
            }
            if sets.len() >= BOUND_SETS_MAX || attributes.iter().any(|kv| kv.key.as_str() == ERROR_TYPE) {
                return None;
            }
        }
        let mut sets = self.sets.write().unwrap_or_else(|p| p.into_inner());
        if sets.len() >= BOUND_SETS_MAX && !sets.contains_key(attributes) {
            return None;
        }
        let bound = sets
            .entry(attributes.to_vec().into_boxed_slice())
            .or_insert_with(|| bind(attributes));
        Some(record(bound))
    }

    /// How many sets are bound.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.sets.read().unwrap_or_else(|p| p.into_inner()).len()
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
