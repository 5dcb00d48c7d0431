//! The hash map of the memory backend's hot path, below the lease table and the
//! state that both index with it.

/// The hash maps of the hot path: foldhash is several times faster than SipHash
/// on lease ids and keys, and its per-process random seed keeps chosen lease ids
/// from forcing collisions cheaply.
pub(super) type FastMap<K, V> = std::collections::HashMap<K, V, foldhash::fast::RandomState>;
