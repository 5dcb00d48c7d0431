//! The bodies of the tenant and key endpoints: a JSON object of at most
//! [`DIRECTORY_BODY_BYTES_MAX`] bytes, sent as `application/json` (415
//! otherwise), read field by field so that every error names its field and a
//! field the endpoint does not know is refused.

use axum::extract::{FromRequest, Request};
use axum::http::header;
use serde::de::DeserializeOwned;
use serde_json::{Map, Value};

use crate::error::ApiError;

/// The largest tenant or key body: the largest valid one (a scope of 64
/// model names of 128 bytes, every field set) is under 10 KiB; anything
/// larger is a mistake or an abuse, answered 413 before it is read whole.
pub const DIRECTORY_BODY_BYTES_MAX: usize = 16 * 1024;

/// The fields of a body, taken one by one.
#[derive(Debug, Default)]
pub struct Fields(Map<String, Value>);

impl<S: Send + Sync> FromRequest<S> for Fields {
    type Rejection = ApiError;

    async fn from_request(request: Request, _state: &S) -> Result<Self, Self::Rejection> {
        let too_large = ApiError::PayloadTooLarge {
            limit_bytes: DIRECTORY_BODY_BYTES_MAX,
        };
        let declared = (request.headers().get(header::CONTENT_LENGTH))
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<u64>().ok());
        if declared.is_some_and(|length| length > DIRECTORY_BODY_BYTES_MAX as u64) {
            return Err(too_large);
        }
        let json = (request.headers().get(header::CONTENT_TYPE))
            .and_then(|v| v.to_str().ok())
            .is_some_and(ratelimiter::origin::is_json_content_type);
        let bytes = axum::body::to_bytes(request.into_body(), DIRECTORY_BODY_BYTES_MAX)
            .await
            .map_err(|_| too_large)?;
        // A web page can send a form or `text/plain` body anywhere without
        // asking, never a JSON one (`ratelimiter::origin`): no key is minted
        // from a body of another type. An empty body (a rotation's) needs none.
        if !json && !bytes.iter().all(u8::is_ascii_whitespace) {
            return Err(ApiError::UnsupportedMediaType);
        }
        Self::parse(&bytes)
    }
}

impl Fields {
    /// The object in `bytes` (an empty body is an empty object: `rotate` needs no field).
    pub fn parse(bytes: &[u8]) -> Result<Self, ApiError> {
        if bytes.iter().all(u8::is_ascii_whitespace) {
            return Ok(Self::default());
        }
        match serde_json::from_slice::<Value>(bytes) {
            Ok(Value::Object(map)) => Ok(Self(map)),
            Ok(_) => Err(ApiError::InvalidRequest("the body must be a JSON object".to_owned())),
            Err(e) => Err(ApiError::InvalidJson(e.to_string())),
        }
    }

    /// The field `name` as a `T`; absent or `null`: `None`.
    pub fn take<T: DeserializeOwned>(&mut self, name: &str) -> Result<Option<T>, ApiError> {
        Ok(self.take_patch(name)?.flatten())
    }

    /// The field `name` as a `T`; absent: `None`; `null`: `Some(None)` (a PATCH clears it).
    pub fn take_patch<T: DeserializeOwned>(&mut self, name: &str) -> Result<Option<Option<T>>, ApiError> {
        match self.0.remove(name) {
            None => Ok(None),
            Some(Value::Null) => Ok(Some(None)),
            Some(value) => serde_json::from_value(value)
                .map(|v| Some(Some(v)))
                .map_err(|e| ApiError::InvalidRequest(format!("{name}: {e}"))),
        }
    }

    /// The field `name`, which must be given.
    pub fn require<T: DeserializeOwned>(&mut self, name: &str) -> Result<T, ApiError> {
        self.take(name)?
            .ok_or_else(|| ApiError::InvalidRequest(format!("{name}: is required")))
    }

    /// Refuses the first field no `take` consumed.
    pub fn finish(self) -> Result<(), ApiError> {
        match self.0.keys().next() {
            Some(name) => Err(ApiError::InvalidRequest(format!("{name}: unknown field"))),
            None => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_name_their_errors_and_unknown_fields_are_refused() {
        let mut fields = Fields::parse(br#"{"rpm": "ten", "models": null, "zzz": 1}"#).unwrap();
        let error = fields.take::<u64>("rpm").unwrap_err().to_string();
        assert!(error.starts_with("invalid_request: rpm: "), "{error}");
        assert_eq!(fields.take_patch::<Vec<String>>("models").unwrap(), Some(None));
        assert_eq!(fields.take::<u64>("absent").unwrap(), None);
        assert_eq!(
            fields.finish().unwrap_err().to_string(),
            "invalid_request: zzz: unknown field"
        );
        assert!(Fields::parse(b"[1]")
            .unwrap_err()
            .to_string()
            .starts_with("invalid_request"));
        assert!(Fields::parse(b"{").unwrap_err().to_string().starts_with("invalid_json"));
        assert!(Fields::parse(b"").unwrap().finish().is_ok());
    }
}
