//! Who a lease belongs to (docs/memory-backend.md, "Shares of the lease table"): a
//! client token of the server, a tenant of the gateway. The memory backend bounds
//! each owner's share of its live leases, so one client cannot crowd out the
//! others' leases; an owner may also keep its lease ids in a namespace of its own,
//! so that another client that learns one of its ids can neither complete that
//! lease nor tell whether it is live.

use std::fmt;
use std::sync::Arc;

use sha2::{Digest, Sha256};

use crate::base::id::LeaseId;

/// The bits of a lease id a namespace changes: the 80 random bits of the ULID.
/// The 48 bits of its time stay, so ids keep their order in time (TigerBeetle
/// stores ids that grow with time more cheaply).
const NAMESPACE_BITS_MASK: u128 = (1 << 80) - 1;

/// The owner of the leases a request reserves. Cheap to clone.
#[derive(Clone, PartialEq, Eq)]
pub struct LeaseOwner {
    name: Arc<str>,
    /// A stable hash of the name: what the lease table keeps per lease.
    tag: u64,
    /// XORed into the random bits of the owner's lease ids; 0 without a namespace.
    namespace: u128,
}

impl LeaseOwner {
    /// The owner called `name` (for logs and errors; the name is never a secret),
    /// whose lease ids are shared with every other client.
    pub fn new(name: impl Into<Arc<str>>) -> Self {
        let name: Arc<str> = name.into();
        let digest = Sha256::digest(name.as_bytes());
        let tag = u64::from_le_bytes(digest[..8].try_into().expect("a SHA-256 digest has 8 bytes"));
        Self {
            name,
            tag,
            namespace: 0,
        }
    }

    /// The owner with lease ids of its own, derived from `secret` (a token's
    /// digest: only that token's holder can compute the namespace, so no other
    /// client can aim at an id inside it). Every server given the same secret
    /// derives the same namespace, so a lease reserved on one server of a fleet
    /// completes on another.
    pub fn with_lease_namespace(mut self, secret: &[u8]) -> Self {
        let mut hasher = Sha256::new();
        hasher.update(b"ratelimiter lease namespace\0");
        hasher.update(secret);
        let digest = hasher.finalize();
        let bits = u128::from_le_bytes(digest[..16].try_into().expect("a SHA-256 digest has 16 bytes"));
        // Never 0, so a namespace always moves every id.
        self.namespace = (bits & NAMESPACE_BITS_MASK).max(1);
        self
    }

    /// The owner's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The stable 64-bit tag of the name.
    pub fn tag(&self) -> u64 {
        self.tag
    }

    /// `id` as the backend stores it for this owner: moved into the owner's
    /// namespace, or unchanged without one. Applied twice, it gives `id` back.
    pub fn lease_id(&self, id: LeaseId) -> LeaseId {
        LeaseId::from_u128(id.to_u128() ^ self.namespace)
    }
}

impl fmt::Debug for LeaseOwner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The namespace is derived from a secret: it stays out of logs.
        f.debug_struct("LeaseOwner")
            .field("name", &self.name)
            .field("namespaced", &(self.namespace != 0))
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_namespace_moves_the_random_bits_only_and_is_its_own_inverse() {
        let id = LeaseId::generate();
        let shared = LeaseOwner::new("client_tokens[0]");
        assert_eq!(shared.lease_id(id), id);
        let a = LeaseOwner::new("client_tokens[1]").with_lease_namespace(b"token a");
        let b = LeaseOwner::new("client_tokens[2]").with_lease_namespace(b"token b");
        let in_a = a.lease_id(id);
        assert_ne!(in_a, id);
        assert_ne!(in_a, b.lease_id(id));
        assert_eq!(in_a.to_u128() >> 80, id.to_u128() >> 80, "the time bits stay");
        assert_eq!(a.lease_id(in_a), id);
        let again = LeaseOwner::new("elsewhere").with_lease_namespace(b"token a");
        assert_eq!(again.lease_id(id), in_a, "the same secret, the same namespace");
        assert!(!format!("{a:?}").contains(&format!("{}", a.namespace)));
    }
}
