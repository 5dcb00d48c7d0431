//! Single-binary mode (docs/client-library.md, "Single-binary mode"): a memory backend
//! configured from a limits file, with no server and no TigerBeetle.

use std::path::Path;
use std::sync::Arc;

use crate::base::clock::Clock;
use crate::limiting::limiter::Backend;
use crate::memory::{MemoryBackend, MemoryConfig};
use crate::model::error::LimiterError;
use crate::model::registry::{self, RegistryError};

/// Why a local limiter could not be built.
#[derive(Debug, thiserror::Error)]
pub enum LocalError {
    /// The limits file is missing pieces, unreadable or invalid; the message names
    /// the file and the entry.
    #[error(transparent)]
    Registry(#[from] RegistryError),
    /// A state could not be applied to the backend.
    #[error("limits file {path}: {source}")]
    Apply {
        /// The limits file.
        path: String,
        /// What the backend said.
        source: LimiterError,
    },
}

/// A memory backend holding every limit of the file at `path`: an array of limit
/// definitions, optionally with `status` and `pending_decrease_to` as the server's
/// registry writes them. A missing file is an error here: a limiter with no
/// limits would deny every call as unknown.
///
/// Decreasing states deny their key until [`Backend::apply_pending_decreases`]
/// is called and usage allows the decrease.
pub async fn memory_limiter_from_file(
    path: &Path,
    clock: Arc<dyn Clock>,
    config: MemoryConfig,
) -> Result<Arc<MemoryBackend>, LocalError> {
    if !path.exists() {
        return Err(LocalError::Registry(RegistryError::Format {
            path: path.to_owned(),
            message: "file does not exist".to_owned(),
        }));
    }
    let states = registry::load(path)?;
    let backend = Arc::new(MemoryBackend::new(clock, config));
    for state in &states {
        backend.apply_state(state).await.map_err(|source| LocalError::Apply {
            path: path.display().to_string(),
            source,
        })?;
    }
    Ok(backend)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::base::clock::FakeClock;
    use crate::base::id::LeaseId;
    use crate::limiting::limiter::Limiter;
    use crate::model::key::LimitKey;
    use crate::model::wire::{Requirement, ReserveOutcome, ReserveRequest};

    fn write_temp(name: &str, content: &str) -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!("ratelimiter-local-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("limits.json");
        std::fs::write(&path, content).unwrap();
        path
    }

    fn reserve_one(key: &str) -> ReserveRequest {
        let requirement = Requirement {
            key: LimitKey::new(key).unwrap(),
            amount: 1,
        };
        ReserveRequest::new(LeaseId::generate(), None, vec![requirement]).unwrap()
    }

    #[tokio::test]
    async fn a_definitions_file_limits_at_once() {
        let path = write_temp(
            "ok",
            r#"[{"key":"global:llm:openai:gpt-4o:rpm","kind":"rolling","capacity":1,"window_seconds":60,"unit":"requests","description":"rpm"}]"#,
        );
        let clock = Arc::new(FakeClock::new(1_000_000));
        let limiter = memory_limiter_from_file(&path, clock, MemoryConfig::default())
            .await
            .unwrap();
        let first = limiter
            .reserve(&reserve_one("global:llm:openai:gpt-4o:rpm"))
            .await
            .unwrap();
        assert!(first.is_allowed());
        let second = limiter
            .reserve(&reserve_one("global:llm:openai:gpt-4o:rpm"))
            .await
            .unwrap();
        assert!(matches!(second, ReserveOutcome::Denied(_)));
        let unknown = limiter.reserve(&reserve_one("other")).await;
        assert!(matches!(unknown, Err(LimiterError::UnknownKey(_))));
    }

    #[tokio::test]
    async fn missing_or_bad_files_are_errors_naming_the_file() {
        let clock: Arc<dyn Clock> = Arc::new(FakeClock::new(0));
        let missing = std::env::temp_dir().join("ratelimiter-local-missing/limits.json");
        let err = memory_limiter_from_file(&missing, clock.clone(), MemoryConfig::default())
            .await
            .unwrap_err();
        assert!(err.to_string().contains("limits.json"), "{err}");
        let bad = write_temp(
            "bad",
            r#"[{"key":"k","kind":"rolling","capacity":0,"window_seconds":60}]"#,
        );
        let err = memory_limiter_from_file(&bad, clock, MemoryConfig::default())
            .await
            .unwrap_err();
        assert!(err.to_string().contains("entry 0 (k)"), "{err}");
    }
}
