//! Anthropic's prompt cache as the simulator keeps it (docs/provider-sim.md,
//! "Images and the prompt cache"): the prompt up to the last block marked
//! `cache_control` is the cached prefix; a prefix seen within its lifetime is
//! read from the cache (`cache_read_input_tokens`), else written to it
//! (`cache_creation_input_tokens`); the rest is `input_tokens`.
//!
//! Sources (<https://docs.anthropic.com/en/docs/build-with-claude/prompt-caching>):
//! "The cache has a minimum 5-minute lifetime", refreshed "each time the cached
//! content is used"; the minimum cacheable prompt is 1,024 tokens for Sonnet and
//! Opus models and 2,048 for Haiku ("Shorter prompts cannot be cached, even if
//! marked with cache_control"); "total_input_tokens = cache_read_input_tokens +
//! cache_creation_input_tokens + input_tokens".

use std::collections::HashMap;
use std::sync::Mutex;

/// A cached prefix's lifetime, refreshed on every read.
pub const CACHE_TTL_MS: u64 = 5 * 60 * 1000;
/// The most prefixes kept: past it, expired ones are dropped, and a new one is
/// not cached until room frees.
pub const CACHE_ENTRIES_MAX: usize = 10_000;

/// The shortest cacheable prefix of `model`, in tokens.
pub fn minimum_tokens(model: &str) -> u64 {
    if model.contains("haiku") {
        2_048
    } else {
        1_024
    }
}

/// The split of a prompt's tokens.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CacheSplit {
    /// Not cached.
    pub input_tokens: u64,
    /// Written to the cache by this call.
    pub cache_creation_input_tokens: u64,
    /// Read from the cache.
    pub cache_read_input_tokens: u64,
}

/// The prefixes cached, by hash, with their expiry.
#[derive(Debug, Default)]
pub struct PromptCache {
    entries: Mutex<HashMap<u64, u64>>,
}

impl PromptCache {
    /// Splits a prompt of `total` tokens whose cached prefix (hash `prefix`,
    /// `prefix_tokens` long) is marked, at `now_ms`; `None` prefix: nothing
    /// marked. Nothing is written: an admitted call then [`PromptCache::remember`]s
    /// its prefix, a refused one leaves the cache as it was.
    pub fn split(&self, model: &str, total: u64, prefix: Option<(u64, u64)>, now_ms: u64) -> CacheSplit {
        let Some((hash, prefix_tokens)) = prefix.filter(|(_, tokens)| *tokens >= minimum_tokens(model)) else {
            return CacheSplit {
                input_tokens: total,
                ..CacheSplit::default()
            };
        };
        let rest = total.saturating_sub(prefix_tokens);
        let entries = self.entries.lock().expect("cache lock");
        if entries.get(&hash).is_some_and(|expiry| *expiry > now_ms) {
            CacheSplit {
                input_tokens: rest,
                cache_creation_input_tokens: 0,
                cache_read_input_tokens: prefix_tokens,
            }
        } else {
            CacheSplit {
                input_tokens: rest,
                cache_creation_input_tokens: prefix_tokens,
                cache_read_input_tokens: 0,
            }
        }
    }

    /// Writes (or refreshes) the prefix of an admitted call whose split cached it.
    pub fn remember(&self, split: CacheSplit, prefix: Option<(u64, u64)>, now_ms: u64) {
        let cached = split.cache_creation_input_tokens + split.cache_read_input_tokens > 0;
        let Some((hash, _)) = prefix.filter(|_| cached) else {
            return;
        };
        let mut entries = self.entries.lock().expect("cache lock");
        if entries.len() >= CACHE_ENTRIES_MAX && !entries.contains_key(&hash) {
            entries.retain(|_, expiry| *expiry > now_ms);
        }
        if entries.len() < CACHE_ENTRIES_MAX || entries.contains_key(&hash) {
            entries.insert(hash, now_ms + CACHE_TTL_MS);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_marked_prefix_is_written_then_read_until_it_expires() {
        let cache = PromptCache::default();
        let split = |cache: &PromptCache, model: &str, total: u64, prefix: Option<(u64, u64)>, now_ms: u64| {
            let split = cache.split(model, total, prefix, now_ms);
            cache.remember(split, prefix, now_ms);
            split
        };
        let refused = cache.split("claude-sonnet-4-5", 5_000, Some((7, 4_000)), 0);
        assert_eq!(
            refused.cache_creation_input_tokens, 4_000,
            "a refused call writes nothing"
        );
        let first = split(&cache, "claude-sonnet-4-5", 5_000, Some((7, 4_000)), 0);
        assert_eq!((first.input_tokens, first.cache_creation_input_tokens), (1_000, 4_000));
        let second = split(&cache, "claude-sonnet-4-5", 5_350, Some((7, 4_000)), 1_000);
        assert_eq!((second.input_tokens, second.cache_read_input_tokens), (1_350, 4_000));
        let later = split(
            &cache,
            "claude-sonnet-4-5",
            5_000,
            Some((7, 4_000)),
            1_000 + CACHE_TTL_MS + 1,
        );
        assert_eq!(later.cache_creation_input_tokens, 4_000, "expired: written again");
        let short = split(&cache, "claude-haiku-4-5", 3_000, Some((8, 1_500)), 0);
        assert_eq!(short.input_tokens, 3_000, "below Haiku's minimum: not cached");
        assert_eq!(
            split(&cache, "claude-haiku-4-5", 3_000, Some((8, 1_500)), 1).input_tokens,
            3_000
        );
        assert_eq!(split(&cache, "claude-sonnet-4-5", 10, None, 0).input_tokens, 10);
    }
}
