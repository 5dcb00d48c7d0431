//! A vector of at most `N` small copyable items that lives on the stack, so the
//! hot path does not allocate for a request's requirements.

/// Up to `N` items, in insertion order.
#[derive(Debug, Clone, Copy)]
pub struct StackVec<T: Copy + Default, const N: usize> {
    len: usize,
    items: [T; N],
}

impl<T: Copy + Default, const N: usize> StackVec<T, N> {
    /// An empty vector.
    pub fn new() -> Self {
        Self {
            len: 0,
            items: [T::default(); N],
        }
    }

    /// Appends `item`; the caller's input is bounded by `N` (a programming error otherwise).
    pub fn push(&mut self, item: T) {
        assert!(self.len < N, "more than {N} items");
        self.items[self.len] = item;
        self.len += 1;
    }

    /// The items.
    pub fn as_slice(&self) -> &[T] {
        &self.items[..self.len]
    }

    /// The items, mutable.
    pub fn as_mut_slice(&mut self) -> &mut [T] {
        &mut self.items[..self.len]
    }
}

impl<T: Copy + Default, const N: usize> Default for StackVec<T, N> {
    fn default() -> Self {
        Self::new()
    }
}
