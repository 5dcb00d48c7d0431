//! Priority classes: interactive work never waits behind a batch flood, and batch
//! still gets its share of what frees up (docs/client-library.md, "Classes").
//!
//! Each class has a `share`. When jobs of several classes wait in one queue, the
//! next job to try is taken from the class whose *pass* is lowest; taking a job
//! advances its class's pass by `STRIDE_UNIT / share` (stride scheduling), so over
//! any run of takes each waiting class gets turns in proportion to its share, and a
//! class with a share never starves. A class that was idle rejoins at the pass of the
//! classes already waiting: it cannot bank turns while it had nothing to run. A take
//! that the limiter denied gives its turn back, so turns count grants, not attempts.

use super::config_error::ConfigError;

/// The most classes one scheduler (or gateway) may declare: classes are tiers of
/// importance, and every waiting class is scanned at each take.
pub const CLASSES_MAX: usize = 16;
/// The largest share: a ratio of 1,000 to 1 between two classes is already "one
/// waits for the other"; larger values only risk overflow in the pass arithmetic.
pub const CLASS_SHARE_MAX: u32 = 1_000;
/// The longest class name, in bytes; class names appear in metrics labels.
pub const CLASS_NAME_BYTES_MAX: usize = 64;

/// The pass a take of a class with share 1 advances. A multiple of every share up
/// to [`CLASS_SHARE_MAX`] would make strides exact; this one is large enough that the
/// rounding of `STRIDE_UNIT / share` is below one part in a million of a turn.
const STRIDE_UNIT: u64 = 1 << 40;

/// The name of the one class a scheduler without declared classes has.
pub const DEFAULT_CLASS: &str = "default";

/// One class: a name jobs refer to and its share of freed capacity.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkClass {
    name: String,
    share: u32,
}

impl WorkClass {
    /// A class named `name` with weight `share` when classes compete.
    ///
    /// The name is 1..=[`CLASS_NAME_BYTES_MAX`] bytes of `[A-Za-z0-9_.-]`; the share is
    /// 1..=[`CLASS_SHARE_MAX`].
    pub fn new(name: impl Into<String>, share: u32) -> Result<Self, ConfigError> {
        let name = name.into();
        let valid_name = !name.is_empty()
            && name.len() <= CLASS_NAME_BYTES_MAX
            && name.bytes().all(|b| b.is_ascii_alphanumeric() || b"_.-".contains(&b));
        if !valid_name {
            return Err(ConfigError(format!(
                "class name {name:?} must be 1..={CLASS_NAME_BYTES_MAX} bytes of [A-Za-z0-9_.-]"
            )));
        }
        if !(1..=CLASS_SHARE_MAX).contains(&share) {
            return Err(ConfigError(format!(
                "class {name:?}: share must be in 1..={CLASS_SHARE_MAX}, got {share}"
            )));
        }
        Ok(Self { name, share })
    }

    /// The class's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The class's weight when classes compete for freed capacity.
    pub fn share(&self) -> u32 {
        self.share
    }
}

/// Checks a list of classes, highest first: 1..=[`CLASSES_MAX`] entries, names unique.
pub(super) fn check_classes(classes: &[WorkClass]) -> Result<(), ConfigError> {
    if classes.is_empty() || classes.len() > CLASSES_MAX {
        return Err(ConfigError(format!(
            "classes must list 1..={CLASSES_MAX} classes, got {}",
            classes.len()
        )));
    }
    for (index, class) in classes.iter().enumerate() {
        if classes[..index].iter().any(|c| c.name == class.name) {
            return Err(ConfigError(format!("class {:?} is declared twice", class.name)));
        }
    }
    Ok(())
}

/// Whose turn it is among the classes of one queue: the rule every queue of the
/// project follows (the scheduler's, the gateway's), kept in one place.
#[derive(Debug, Clone)]
pub struct ClassTurns {
    /// `STRIDE_UNIT / share` per class.
    strides: Vec<u64>,
    /// Each class's pass: the lowest waiting one goes next.
    passes: Vec<u64>,
}

impl ClassTurns {
    /// Turns among `classes`, every pass at 0.
    pub fn new(classes: &[WorkClass]) -> Self {
        Self {
            strides: classes.iter().map(|c| STRIDE_UNIT / u64::from(c.share)).collect(),
            passes: vec![0; classes.len()],
        }
    }

    /// The class to take from next among those `waiting`: the lowest pass, the
    /// higher class (lower index) on a tie.
    pub fn next(&self, waiting: impl Iterator<Item = usize>) -> Option<usize> {
        waiting.min_by_key(|&class| (self.passes[class], class))
    }

    /// Class `class` has work again after having none among `waiting` (the
    /// others with work): it starts at their lowest pass, not below.
    pub fn rejoin(&mut self, class: usize, waiting: impl Iterator<Item = usize>) {
        if let Some(floor) = waiting.filter(|&c| c != class).map(|c| self.passes[c]).min() {
            self.passes[class] = self.passes[class].max(floor);
        }
    }

    /// A job of `class` was taken.
    pub fn took(&mut self, class: usize) {
        self.passes[class] = self.passes[class].saturating_add(self.strides[class]);
    }

    /// A job of `class` taken earlier was denied: its turn is given back.
    pub fn gave_back(&mut self, class: usize) {
        self.passes[class] = self.passes[class].saturating_sub(self.strides[class]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn classes(shares: &[u32]) -> Vec<WorkClass> {
        shares
            .iter()
            .enumerate()
            .map(|(i, s)| WorkClass::new(format!("c{i}"), *s).unwrap())
            .collect()
    }

    #[test]
    fn turns_follow_the_shares_when_every_class_waits() {
        let mut turns = ClassTurns::new(&classes(&[4, 1]));
        let mut counts = [0; 2];
        for _ in 0..1_000 {
            let class = turns.next(0..2).unwrap();
            turns.took(class);
            counts[class] += 1;
        }
        assert_eq!(counts, [800, 200]);
    }

    #[test]
    fn a_lower_class_waits_at_most_its_share_behind_a_higher_one() {
        // 1 000 to 1: the lower class gets one take in every 1 001.
        let mut turns = ClassTurns::new(&classes(&[1_000, 1]));
        let order: Vec<usize> = (0..2_002)
            .map(|_| {
                let class = turns.next(0..2).unwrap();
                turns.took(class);
                class
            })
            .collect();
        assert_eq!(order.iter().filter(|c| **c == 1).count(), 2);
        assert_eq!(order[0], 0, "the higher class goes first on a tie");
    }

    #[test]
    fn an_idle_class_does_not_bank_turns() {
        let mut turns = ClassTurns::new(&classes(&[1, 1]));
        for _ in 0..100 {
            turns.took(0);
        }
        turns.rejoin(1, [0].into_iter());
        let order: Vec<usize> = (0..4)
            .map(|_| {
                let class = turns.next(0..2).unwrap();
                turns.took(class);
                class
            })
            .collect();
        assert_eq!(order, vec![0, 1, 0, 1], "class 1 does not run 100 times in a row");
    }

    #[test]
    fn a_denied_take_gives_its_turn_back() {
        let mut turns = ClassTurns::new(&classes(&[1, 1]));
        turns.took(0);
        turns.gave_back(0);
        assert_eq!(turns.next(0..2), Some(0));
    }

    #[test]
    fn bad_classes_are_refused_by_name() {
        assert!(WorkClass::new("batch", 0).unwrap_err().0.contains("share"));
        assert!(WorkClass::new("batch", CLASS_SHARE_MAX + 1)
            .unwrap_err()
            .0
            .contains("share"));
        assert!(WorkClass::new("", 1).unwrap_err().0.contains("class name"));
        assert!(WorkClass::new("a b", 1).unwrap_err().0.contains("class name"));
        let twice = vec![WorkClass::new("a", 1).unwrap(), WorkClass::new("a", 2).unwrap()];
        assert!(check_classes(&twice).unwrap_err().0.contains("twice"));
        assert!(check_classes(&[]).is_err());
        let many = classes(&[1; CLASSES_MAX + 1]);
        assert!(check_classes(&many).is_err());
    }
}
