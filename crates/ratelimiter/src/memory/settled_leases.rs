//! Leases that stopped being live (completed, or evicted from the lease table),
//! remembered so a retry of their reserve is answered idempotently (docs/lease-ids.md,
//! "Idempotency": allowed again at the original time, nothing reserved).

use std::hash::BuildHasher;
use std::sync::atomic::{AtomicU64, Ordering};

/// The next generation serial: unique in the process, so that a snapshot
/// reused across backends never mistakes one backend's generation for
/// another's (0 is never handed out: decoded snapshots carry it).
static GENERATION_SERIAL_NEXT: AtomicU64 = AtomicU64::new(1);

/// A serial no generation of this process had before.
fn generation_serial() -> u64 {
    GENERATION_SERIAL_NEXT.fetch_add(1, Ordering::Relaxed)
}

/// What a retry of a settled lease's reserve needs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SettledLease {
    /// When it was granted: answered again.
    pub reserved_at_unix_ms: u64,
    /// A keyed hash of its requirements, to tell a retry that asks for
    /// something else (see [`super::state`]).
    pub fingerprint: u64,
}

/// Bytes in a cache line: each bucket of the index is one.
const CACHE_LINE_BYTES: usize = 64;
/// A bucket as `u32` words: one half for each generation.
const BUCKET_WORDS: usize = CACHE_LINE_BYTES / 4;
/// A half as words: the epoch it was written in, how many slots it fills,
/// two words of 16-bit tags, then the slots' positions.
const HALF_WORDS: usize = BUCKET_WORDS / 2;
/// Leases one half of a bucket holds.
const HALF_SLOTS: usize = 4;
/// Where a half's positions start.
const HALF_POSITIONS: usize = HALF_WORDS - HALF_SLOTS;
const _: () = assert!(2 + HALF_SLOTS / 2 + HALF_SLOTS == HALF_WORDS, "a half fills its words");
/// Leases per halves once a generation is full: 3 per 2, so 1.5 of 4 slots a
/// half, and a lookup in a full generation goes on to the next bucket (an
/// adjacent line) about once in 13 (simulated). Linear probing clusters: at 2
/// of 3 slots a lookup read 2.1 buckets, and the pair took 45% longer.
const HALF_LEASES_FULL: (usize, usize) = (3, 2);

/// One of the two generations: 0 or 1, the half of every bucket it owns.
type Side = usize;

/// A hash index from lease id to position in its generation's entries, for
/// both generations at once: each bucket is one cache line, one half per
/// generation, with linear probing from bucket to bucket.
///
/// So a lookup in both generations reads one line (rarely the next as well),
/// and the insertion that follows a lookup writes that same, cached, line: a
/// reserve+complete pair touches one random line of it, as the old
/// direct-mapped cache did (a hash map per generation touched three: each
/// map's control bytes and the written entry, and doubled the pair's time).
/// Halves written in an older epoch of their generation count as empty, so
/// clearing a generation is one increment. The words are zeroed memory from
/// the allocator, resident only once written.
#[derive(Debug)]
struct Index {
    words: Box<[u32]>,
    /// Where the first bucket starts in `words`: a cache-line boundary.
    start: usize,
    buckets: usize,
    /// Each generation's epoch; never 0, the epoch of zeroed halves.
    epochs: [u32; 2],
}

impl Index {
    /// An index for up to `generation_leases_max` leases in each generation.
    fn new(generation_leases_max: usize) -> Self {
        let (leases, halves) = HALF_LEASES_FULL;
        let buckets = (generation_leases_max * halves).div_ceil(leases).max(1);
        assert!(u32::try_from(buckets).is_ok(), "bucket numbers are 32-bit");
        // One bucket more, to start on a cache line wherever the allocation starts.
        let words = vec![0u32; (buckets + 1) * BUCKET_WORDS].into_boxed_slice();
        let misaligned_bytes = words.as_ptr() as usize % CACHE_LINE_BYTES;
        let start = (CACHE_LINE_BYTES - misaligned_bytes) % CACHE_LINE_BYTES / 4;
        Self {
            words,
            start,
            buckets,
            epochs: [1, 1],
        }
    }

    /// The bucket where `hash` starts probing: the high half of the hash's low
    /// 32 bits times the bucket count (any count, not only powers of two).
    fn home(&self, hash: u64) -> usize {
        ((u64::from(hash as u32) * self.buckets as u64) >> 32) as usize
    }

    /// Where the half of `side` in bucket `b` starts in `words`.
    fn half_start(&self, b: usize, side: Side) -> usize {
        self.start + b * BUCKET_WORDS + side * HALF_WORDS
    }

    fn next(&self, b: usize) -> usize {
        if b + 1 == self.buckets {
            0
        } else {
            b + 1
        }
    }

    /// Starts loading the home bucket of `hash`, without waiting for it.
    fn prefetch(&self, hash: u64) {
        prefetch(&self.words[self.half_start(self.home(hash), 0)]);
    }

    /// The first position of `side` tagged with `hash`'s tag for which `is` holds.
    ///
    /// A half is scanned without branching on what it holds: the line is
    /// usually still on its way from memory, and a branch on its contents
    /// would be mispredicted about half the time, throwing away the work done
    /// meanwhile. The branches left are taken rarely (a tag matches, a half is
    /// full), so the usual answer, not here, is predicted.
    fn find(&self, side: Side, hash: u64, mut is: impl FnMut(u32) -> bool) -> Option<u32> {
        let tag = tag_of(hash);
        let mut b = self.home(hash);
        for _ in 0..self.buckets {
            let half = &self.words[self.half_start(b, side)..][..HALF_WORDS];
            let live = u32::from(half[0] == self.epochs[side]);
            let filled = (half[1] * live) as usize;
            let mut matches = 0u32;
            for k in 0..HALF_SLOTS {
                matches |= u32::from((k < filled) & (slot_tag(half, k) == tag)) << k;
            }
            while matches != 0 {
                let position = half[HALF_POSITIONS + matches.trailing_zeros() as usize];
                if is(position) {
                    return Some(position);
                }
                matches &= matches - 1;
            }
            if filled < HALF_SLOTS {
                return None;
            }
            b = self.next(b);
        }
        None
    }

    /// Adds `position` to `side` under `hash`. The caller keeps at most
    /// [`HALF_LEASES_FULL`] leases per half on average, fewer than the slots,
    /// so a half with room is always found.
    fn insert(&mut self, side: Side, hash: u64, position: u32) {
        let tag = u32::from(tag_of(hash));
        let mut b = self.home(hash);
        for _ in 0..self.buckets {
            let i = self.half_start(b, side);
            let half = &mut self.words[i..i + HALF_WORDS];
            // Without a branch on whether the half is live, as in `find`.
            let live = u32::from(half[0] == self.epochs[side]);
            let filled = (half[1] * live) as usize;
            if filled < HALF_SLOTS {
                let (word, shift) = (2 + filled / 2, 16 * (filled % 2));
                half[0] = self.epochs[side];
                half[1] = filled as u32 + 1;
                half[word] = (half[word] & !(0xffff << shift)) | (tag << shift);
                half[HALF_POSITIONS + filled] = position;
                return;
            }
            b = self.next(b);
        }
        unreachable!("an index holds fewer positions than slots");
    }

    /// Empties every half of `side`: a new epoch, or zeroes when the epochs run out.
    fn clear(&mut self, side: Side) {
        if let Some(epoch) = self.epochs[side].checked_add(1) {
            self.epochs[side] = epoch;
            return;
        }
        for b in 0..self.buckets {
            let i = self.half_start(b, side);
            self.words[i..i + HALF_WORDS].fill(0);
        }
        self.epochs[side] = 1;
    }
}

/// Asks the processor to start loading the cache line of `value`, without
/// waiting for it: unlike a load, a prefetch holds up no later instruction,
/// the release of the backend's lock included.
fn prefetch<V>(value: &V) {
    #[cfg(all(target_arch = "x86_64", not(miri)))]
    // SAFETY: a prefetch reads nothing the program sees and never faults; the
    // pointer comes from a reference anyway.
    unsafe {
        std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>((value as *const V).cast());
    }
    #[cfg(not(all(target_arch = "x86_64", not(miri))))]
    let _ = value;
}

/// The 16-bit tag of `hash` (its top bits; the home bucket comes from its low bits).
fn tag_of(hash: u64) -> u16 {
    (hash >> 48) as u16
}

/// The tag of slot `k` of `half`.
fn slot_tag(half: &[u32], k: usize) -> u16 {
    (half[2 + k / 2] >> (16 * (k % 2))) as u16
}

/// A settled lease as stored: its id (low, high), reserved at, fingerprint.
/// An array of integers, so a zeroed array of them comes from the allocator
/// already zeroed and becomes resident only once written.
type Entry = [u64; 4];

fn entry_id(entry: &Entry) -> u128 {
    u128::from(entry[0]) | (u128::from(entry[1]) << 64)
}

/// A generation as a snapshot copies it.
#[derive(Debug, Clone, Copy)]
pub struct SettledGeneration<'a> {
    /// Its leases (id low and high, reserved at, fingerprint), oldest first.
    pub entries: &'a [[u64; 4]],
    /// When its last lease settled: each is remembered from then on.
    pub newest_unix_ms: u64,
    /// Which filling of the generation this is: the same serial means the
    /// same leases in the same places, maybe with more appended.
    pub serial: u64,
}

/// One generation's leases, in the order they settled.
#[derive(Debug)]
struct Generation {
    /// Room for the generation's bound of leases; the first `len` are its
    /// leases, oldest first (plain data, so clearing only resets `len`).
    entries: Box<[Entry]>,
    len: usize,
    /// When its first lease settled; meaningless while empty.
    oldest_unix_ms: u64,
    /// When its last lease settled; meaningless while empty.
    newest_unix_ms: u64,
    /// Changes each time the generation is cleared, and only then: while it
    /// stays the same, the first `len` entries are the ones a copy saw, plus
    /// any appended since, so a periodic snapshot copies only the new ones.
    serial: u64,
}

impl Generation {
    fn new(leases_max: usize) -> Self {
        Self {
            entries: vec![[0; 4]; leases_max].into_boxed_slice(),
            len: 0,
            oldest_unix_ms: 0,
            newest_unix_ms: 0,
            serial: generation_serial(),
        }
    }

    /// Starts loading the line the next push writes, without waiting for it.
    fn prefetch_next(&self) {
        if let Some(entry) = self.entries.get(self.len) {
            prefetch(entry);
        }
    }

    /// Appends `id` and returns its position; the caller keeps the bound.
    fn push(&mut self, id: u128, lease: SettledLease) -> u32 {
        let i = u32::try_from(self.len).expect("a generation holds fewer than 2^32 leases");
        self.entries[self.len] = [
            id as u64,
            (id >> 64) as u64,
            lease.reserved_at_unix_ms,
            lease.fingerprint,
        ];
        self.len += 1;
        i
    }

    /// True when every lease in it settled `retention_ms` or longer before
    /// `now_unix_ms`, so forgetting it forgets nothing early.
    fn expired(&self, now_unix_ms: u64, retention_ms: u64) -> bool {
        self.len == 0 || self.newest_unix_ms.saturating_add(retention_ms) <= now_unix_ms
    }
}

/// Settled leases by id, exact (a lookup never confuses two ids) and bounded.
///
/// Two generations: leases settle into the current one, a lookup checks both.
/// The previous generation is cleared (keeping its allocation) and the two
/// swap when the current one's oldest lease settled `retention_ms` ago (time),
/// or when the current one holds half the bound (count). So a lease is
/// remembered at least one retention after it settled unless the bound rotates
/// first, and in any case until at least half the bound of later leases
/// settled; under steady settlements it is forgotten within two retentions.
/// Nothing is allocated after [`SettledLeases::new`] and nothing is removed one
/// by one, where an insertion-ordered map with oldest-first eviction cost 17% of
/// the hot path (BENCHMARKS.md).
#[derive(Debug)]
pub struct SettledLeases {
    /// Half the bound: the most leases one generation holds.
    generation_leases_max: usize,
    index: Index,
    generations: [Generation; 2],
    /// The side leases settle into.
    current: Side,
    /// One keyed hash of an id serves both generations. Keyed per process so
    /// callers cannot choose ids that collide; the quality variant because the
    /// bucket comes from the low bits, which the fast variant leaves uneven for
    /// ids that differ little (as the direct-mapped cache measured).
    hashes: foldhash::quality::RandomState,
    evicted_total: u64,
    /// The greatest id ever settled here, forgotten or not: an upper bound of
    /// the ids remembered (see [`Self::get`]).
    id_max: u128,
}

impl SettledLeases {
    /// An empty memory for at most `leases_max` leases (at least 2, so each
    /// generation holds one). Everything is allocated now, so nothing is ever
    /// copied or rehashed under the backend's mutex; the memory becomes
    /// resident as leases settle into it.
    pub fn new(leases_max: usize) -> Self {
        assert!(leases_max >= 2, "room for one lease per generation at least");
        let generation_leases_max = leases_max / 2;
        Self {
            generation_leases_max,
            index: Index::new(generation_leases_max),
            generations: [
                Generation::new(generation_leases_max),
                Generation::new(generation_leases_max),
            ],
            current: 0,
            hashes: foldhash::quality::RandomState::default(),
            evicted_total: 0,
            id_max: 0,
        }
    }

    /// The settled lease `id`, if remembered.
    ///
    /// It first prefetches the two lines a settlement of `id` will write (its
    /// index bucket and the next entry): a reserve of a new id is usually
    /// followed by its complete, which then finds both cached. A prefetch, unlike
    /// a load, holds up no later instruction, the release of the backend's lock
    /// included, so the misses overlap with the rest of the call.
    ///
    /// An id above every id ever settled here cannot be remembered: that is
    /// the usual reserve, since lease ids are ULIDs, ordered by creation time,
    /// and a lease settles after it was created (seconds after, for an LLM
    /// call). Then nothing is searched.
    pub fn get(&self, id: u128) -> Option<SettledLease> {
        let hash = self.hashes.hash_one(id);
        self.index.prefetch(hash);
        self.generations[self.current].prefetch_next();
        if id > self.id_max {
            return None;
        }
        [self.current, 1 - self.current]
            .into_iter()
            .find_map(|side| self.lookup(side, id, hash))
    }

    fn lookup(&self, side: Side, id: u128, hash: u64) -> Option<SettledLease> {
        let generation = &self.generations[side];
        let entries = &generation.entries[..generation.len];
        let i = self.index.find(side, hash, |i| entry_id(&entries[i as usize]) == id)?;
        let entry = &entries[i as usize];
        Some(SettledLease {
            reserved_at_unix_ms: entry[2],
            fingerprint: entry[3],
        })
    }

    /// Remembers `lease` as `id`, settled at `now_unix_ms`, rotating the
    /// generations first when due; leases still within `retention_ms` that a
    /// rotation forgets are counted as evicted.
    pub fn insert(&mut self, id: u128, lease: SettledLease, now_unix_ms: u64, retention_ms: u64) {
        // A lease is granted only when its id is not remembered here, and is
        // live once: so it settles only while forgotten.
        debug_assert!(self.get(id).is_none(), "lease {id} settled twice");
        if self.rotation_due(now_unix_ms, retention_ms) {
            self.rotate(now_unix_ms, retention_ms);
        }
        let current = &mut self.generations[self.current];
        if current.len == 0 {
            current.oldest_unix_ms = now_unix_ms;
        }
        current.newest_unix_ms = current.newest_unix_ms.max(now_unix_ms);
        self.id_max = self.id_max.max(id);
        let position = current.push(id, lease);
        self.index.insert(self.current, self.hashes.hash_one(id), position);
    }

    /// True when the current generation holds half the bound (count), or when
    /// its oldest lease has served `retention_ms` and every lease of the
    /// previous one has too (time: the second test only matters when instants
    /// arrive out of order, so a time rotation never forgets a lease early).
    fn rotation_due(&self, now_unix_ms: u64, retention_ms: u64) -> bool {
        let current = &self.generations[self.current];
        if current.len >= self.generation_leases_max {
            return true;
        }
        let aged = current.oldest_unix_ms.saturating_add(retention_ms) <= now_unix_ms;
        let previous = &self.generations[1 - self.current];
        current.len > 0 && aged && previous.expired(now_unix_ms, retention_ms)
    }

    /// Forgets the previous generation and makes it the current one.
    ///
    /// Its leases count as evicted when its newest was still within
    /// `retention_ms`: all of them, an upper bound that is exact unless its
    /// oldest had already served its retention (only when the bound starts to
    /// bite after a quieter period). So the count is zero exactly when no lease
    /// was forgotten early.
    fn rotate(&mut self, now_unix_ms: u64, retention_ms: u64) {
        let previous = 1 - self.current;
        let generation = &mut self.generations[previous];
        if !generation.expired(now_unix_ms, retention_ms) {
            self.evicted_total += generation.len as u64;
        }
        generation.len = 0;
        generation.serial = generation_serial();
        self.index.clear(previous);
        self.current = previous;
    }

    /// Both generations, the previous one first, each as its leases (id low
    /// and high, reserved at, fingerprint) and its newest settlement time: an
    /// upper bound of when each of them settled, so a restore remembers them
    /// at least as long as they would have been here. What a snapshot copies:
    /// plain arrays, copied as fast as memory moves. Each comes with its
    /// serial, which changes only when the generation is cleared: entries are
    /// only ever appended in between, so a copy made under the same serial is
    /// a prefix of them.
    pub fn generations_oldest_first(&self) -> [SettledGeneration<'_>; 2] {
        [1 - self.current, self.current].map(|side| {
            let generation = &self.generations[side];
            SettledGeneration {
                entries: &generation.entries[..generation.len],
                newest_unix_ms: generation.newest_unix_ms,
                serial: generation.serial,
            }
        })
    }

    /// Leases remembered now.
    pub fn len(&self) -> usize {
        self.generations[0].len + self.generations[1].len
    }

    /// Leases forgotten before their retention ended because of the bound.
    pub fn evicted_total(&self) -> u64 {
        self.evicted_total
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lease(at: u64) -> SettledLease {
        SettledLease {
            reserved_at_unix_ms: at,
            fingerprint: at.wrapping_mul(7),
        }
    }

    #[test]
    fn leases_are_remembered_for_the_retention_then_forgotten() {
        let mut settled = SettledLeases::new(1_000);
        settled.insert(42, lease(5), 100, 50);
        settled.insert(43, lease(6), 149, 50);
        assert_eq!((settled.get(42), settled.get(44)), (Some(lease(5)), None));
        // 42 is older than the retention at 150: current rotates to previous.
        settled.insert(44, lease(7), 150, 50);
        assert_eq!(settled.get(42), Some(lease(5)), "previous is still answered");
        // At 199 the previous generation (newest 149) is expired, but the
        // current one (oldest 150) is not: no rotation yet.
        settled.insert(45, lease(8), 199, 50);
        assert_eq!(settled.len(), 4);
        settled.insert(46, lease(9), 250, 50);
        assert_eq!(
            (settled.get(42), settled.get(43)),
            (None, None),
            "forgotten past the retention"
        );
        assert_eq!((settled.get(44), settled.get(46)), (Some(lease(7)), Some(lease(9))));
        assert_eq!(settled.evicted_total(), 0, "nothing was forgotten early");
    }

    #[test]
    fn every_lease_of_a_large_run_within_the_retention_is_remembered_exactly() {
        // Far more leases than the old direct-mapped cache had slots (131,072
        // at the default), all within one retention.
        let leases = 300_000u128;
        let mut settled = SettledLeases::new(2 * leases as usize);
        for id in 1..=leases {
            settled.insert(id, lease(id as u64), id as u64 / 100, 60_000);
        }
        assert!((1..=leases).all(|id| settled.get(id) == Some(lease(id as u64))));
        assert_eq!(settled.get(leases + 1), None);
        assert_eq!(settled.evicted_total(), 0);
    }

    #[test]
    fn the_bound_rotates_early_and_counts_what_it_forgets() {
        let mut settled = SettledLeases::new(4);
        for id in 1..=4 {
            settled.insert(id, lease(id as u64), 0, 1_000);
        }
        assert!((1..=4).all(|id| settled.get(id).is_some()), "two generations of two");
        assert_eq!(settled.evicted_total(), 0);
        settled.insert(5, lease(5), 10, 1_000);
        assert_eq!(
            (settled.get(1), settled.get(2), settled.get(5)),
            (None, None, Some(lease(5)))
        );
        assert_eq!(settled.evicted_total(), 2);
        assert_eq!(settled.len(), 3);
        // The bound rotates again, this time past the retention: not counted.
        settled.insert(6, lease(6), 1_000, 1_000);
        settled.insert(7, lease(7), 1_000, 1_000);
        assert_eq!(
            (settled.get(3), settled.get(5), settled.get(7)),
            (None, Some(lease(5)), Some(lease(7)))
        );
        assert_eq!(settled.evicted_total(), 2);
    }

    #[test]
    fn index_probes_past_full_buckets_and_wraps_around() {
        let mut index = Index::new(6);
        assert_eq!((index.words.as_ptr() as usize + index.start * 4) % CACHE_LINE_BYTES, 0);
        // Low bits all ones: every hash starts at the last bucket; the tags differ.
        let hash = |n: u64| (n << 48) | u64::from(u32::MAX);
        assert_eq!(index.home(hash(0)), index.buckets - 1);
        let positions = 2 * HALF_SLOTS as u32 + 1;
        for n in 0..positions {
            index.insert(1, hash(u64::from(n)), n);
        }
        for n in 0..positions {
            assert_eq!(index.find(1, hash(u64::from(n)), |p| p == n), Some(n), "{n}");
            assert_eq!(index.find(0, hash(u64::from(n)), |_| true), None, "the other side");
        }
        assert_eq!(index.find(1, hash(u64::from(positions)), |_| true), None);
        assert_eq!(index.find(1, hash(0), |_| false), None, "a tag match is checked");
    }

    #[test]
    fn clearing_a_side_forgets_its_positions_only_even_when_epochs_run_out() {
        let mut index = Index::new(1);
        index.insert(0, 7, 1);
        index.insert(1, 7, 2);
        index.clear(0);
        assert_eq!(
            (index.find(0, 7, |_| true), index.find(1, 7, |_| true)),
            (None, Some(2))
        );
        index.epochs[0] = u32::MAX;
        index.insert(0, 7, 3);
        assert_eq!(index.find(0, 7, |_| true), Some(3));
        index.clear(0);
        assert_eq!((index.epochs[0], index.find(0, 7, |_| true)), (1, None));
        assert_eq!(index.find(1, 7, |_| true), Some(2), "the other side is kept");
    }

    /// Multiplying by an odd number permutes the u128s.
    const ODD: u128 = 0x9e37_79b9_7f4a_7c15_f39c_c060_5ced_c835;

    #[test]
    fn an_id_above_every_settled_one_is_not_remembered_and_one_below_is_searched() {
        let mut settled = SettledLeases::new(100);
        settled.insert(20, lease(1), 0, 1_000);
        assert_eq!((settled.get(21), settled.get(u128::MAX)), (None, None));
        settled.insert(10, lease(2), 0, 1_000);
        assert_eq!(settled.get(15), None);
        assert_eq!((settled.get(10), settled.get(20)), (Some(lease(2)), Some(lease(1))));
    }

    proptest::proptest! {
        /// Against a model: an answer is always the lease settled under that id;
        /// a lease is forgotten only after its retention or after half the
        /// bound of later leases; the eviction count is zero exactly when no
        /// lease was forgotten early.
        #[test]
        fn answers_are_exact_and_forgetting_keeps_its_bounds(
            leases_max in 2usize..40,
            retention_ms in 1u64..100,
            steps_ms in proptest::collection::vec(0u64..40, 1..300),
            ids_in_creation_order: bool,
        ) {
            // Ids that grow, as ULIDs created in turn do, or in no order
            // (an odd multiplier permutes them), which a fleet's clocks give.
            let id_of = |n: usize| if ids_in_creation_order { n as u128 } else { (n as u128).wrapping_mul(ODD) };
            let mut settled = SettledLeases::new(leases_max);
            let mut settled_at = Vec::new();
            let mut forgotten_early = false;
            let mut now = 0;
            for (n, step_ms) in steps_ms.into_iter().enumerate() {
                now += step_ms;
                proptest::prop_assert_eq!(settled.get(id_of(n)), None, "not settled yet");
                settled.insert(id_of(n), lease(n as u64), now, retention_ms);
                settled_at.push(now);
                proptest::prop_assert!(settled.len() <= leases_max);
                for (id, &at) in settled_at.iter().enumerate() {
                    let later = settled_at.len() - 1 - id;
                    match settled.get(id_of(id)) {
                        Some(found) => proptest::prop_assert_eq!(found, lease(id as u64)),
                        None => {
                            let served = now - at >= retention_ms;
                            proptest::prop_assert!(served || later >= leases_max / 2, "{id} forgotten");
                            forgotten_early |= !served;
                        }
                    }
                }
                proptest::prop_assert_eq!(settled.evicted_total() > 0, forgotten_early);
            }
        }
    }

    #[test]
    #[cfg(debug_assertions)]
    #[should_panic(expected = "settled twice")]
    fn settling_a_remembered_id_again_is_a_bug() {
        let mut settled = SettledLeases::new(2);
        settled.insert(1, lease(1), 0, 100);
        settled.insert(1, lease(2), 5, 100);
    }
}
