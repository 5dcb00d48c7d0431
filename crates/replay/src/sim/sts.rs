//! AWS STS's `AssumeRoleWithWebIdentity` in the simulator
//! (<https://docs.aws.amazon.com/STS/latest/APIReference/API_AssumeRoleWithWebIdentity.html>):
//! a web identity's token exchanged for temporary credentials of a configured
//! lifetime, which Bedrock's routes then accept until they expire (the
//! gateway's renewal is tested against it: `AWS_ENDPOINT_URL_STS` pointed here).
//! Its route is in [`crate::sim::sts_routes`].

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, SystemTime};

use crate::sim::sigv4::AwsKeys;

/// The most credentials kept at once: expired ones are dropped first.
pub const ISSUED_MAX: usize = 4_096;

/// The temporary credentials issued, with when each expires.
#[derive(Debug)]
pub struct Sts {
    lifetime: Duration,
    issued: Mutex<Vec<(AwsKeys, SystemTime)>>,
    count: AtomicU64,
}

/// What a presented access key id is to the STS.
#[derive(Debug, PartialEq, Eq)]
pub enum Issued {
    /// Issued and valid: the keys to check the signature with.
    Valid(AwsKeys),
    /// Issued, and expired.
    Expired,
    /// Not issued here.
    Unknown,
}

impl Sts {
    /// Issues credentials lasting `lifetime`.
    pub fn new(lifetime: Duration) -> Self {
        Self {
            lifetime,
            issued: Mutex::new(Vec::new()),
            count: AtomicU64::new(0),
        }
    }

    /// How many credentials were issued so far.
    pub fn issued_count(&self) -> u64 {
        self.count.load(Ordering::SeqCst)
    }

    /// The keys of `access_key_id` at `now`.
    pub fn lookup(&self, access_key_id: &str, now: SystemTime) -> Issued {
        let issued = self.issued.lock().expect("sts lock");
        match issued.iter().find(|(keys, _)| keys.access_key_id == access_key_id) {
            Some((keys, expires)) if *expires > now => Issued::Valid(keys.clone()),
            Some(_) => Issued::Expired,
            None => Issued::Unknown,
        }
    }

    /// New credentials at `now`, with when they expire.
    pub fn issue(&self, now: SystemTime) -> (AwsKeys, SystemTime) {
        let n = self.count.fetch_add(1, Ordering::SeqCst) + 1;
        let keys = AwsKeys {
            access_key_id: format!("ASIASTS{n:013}"),
            secret_access_key: format!(
                "sts-secret-{n}-{}",
                now.duration_since(SystemTime::UNIX_EPOCH).map_or(0, |d| d.as_nanos())
            ),
            session_token: Some(format!("sts-session-token-{n}")),
        };
        let expires = now + self.lifetime;
        let mut issued = self.issued.lock().expect("sts lock");
        issued.retain(|(_, e)| *e > now);
        if issued.len() >= ISSUED_MAX {
            issued.remove(0);
        }
        issued.push((keys.clone(), expires));
        (keys, expires)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn issued_keys_are_valid_until_they_expire() {
        let sts = Sts::new(Duration::from_secs(2));
        let now = SystemTime::now();
        let (keys, expires) = sts.issue(now);
        assert_eq!(expires, now + Duration::from_secs(2));
        assert_eq!(sts.lookup(&keys.access_key_id, now), Issued::Valid(keys.clone()));
        assert_eq!(sts.lookup(&keys.access_key_id, expires), Issued::Expired);
        assert_eq!(sts.lookup("AKIDOTHER", now), Issued::Unknown);
        let (second, _) = sts.issue(now);
        assert_ne!(second.access_key_id, keys.access_key_id);
        assert_eq!(sts.issued_count(), 2);
    }
}
