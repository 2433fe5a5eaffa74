//! The credential a grant attaches to upstream calls, minted once per run.
//!
//! It lives only in host memory: in the broker session of the run it was
//! minted for, as a header value marked sensitive (so no debug print of a
//! header map shows it). It never enters a guest, a log line, a trace or a
//! metric.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::http::HeaderValue;
use base64::Engine as _;
use hmac::{Hmac, Mac};
use sha2::Sha256;

/// A profile's credential recipe.
pub enum Token {
    /// No Authorization header.
    None,
    /// A fixed bearer token from the environment.
    Static(HeaderValue),
    /// An HS256 JWT minted per run.
    Jwt(JwtSettings),
}

impl std::fmt::Debug for Token {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the value or the secret.
        f.write_str(match self {
            Token::None => "Token::None",
            Token::Static(_) => "Token::Static(..)",
            Token::Jwt(_) => "Token::Jwt(..)",
        })
    }
}

pub struct JwtSettings {
    pub secret: Vec<u8>,
    pub ttl_sec: u32,
    pub issuer: Option<String>,
    pub audience: String,
    pub key_id: Option<String>,
}

/// What a minted credential is for.
pub struct Scope<'a> {
    /// The caller the run is for.
    pub subject: &'a str,
    pub scopes: &'a [String],
    /// The run's wall budget: the credential outlives it by 5 s at most.
    pub run_budget: Duration,
}

/// Why a run's credential could not be minted: always the host's fault,
/// never the caller's. The run is refused (nothing ran) and this is logged.
#[derive(Debug, thiserror::Error)]
pub enum MintError {
    #[error("the clock is before 1970")]
    Clock,
    #[error("no randomness for the token's ID: {0}")]
    Randomness(getrandom::Error),
    #[error("the JWT secret is unusable")]
    Key,
    #[error("the minted token is not a valid header value")]
    Header,
}

impl Token {
    pub fn static_bearer(value: &str) -> Result<Token, String> {
        if value.is_empty() || !value.bytes().all(|b| b.is_ascii_graphic()) {
            return Err("the static token must be visible ASCII".into());
        }
        let mut v = HeaderValue::from_str(&format!("Bearer {value}"))
            .map_err(|_| "the static token is not a valid header value".to_string())?;
        v.set_sensitive(true);
        Ok(Token::Static(v))
    }

    pub fn jwt(s: JwtSettings) -> Result<Token, String> {
        if s.secret.len() < 32 {
            return Err("the JWT secret must be at least 32 bytes".into());
        }
        if s.audience.is_empty() {
            return Err("a JWT needs an audience".into());
        }
        if s.ttl_sec == 0 || s.ttl_sec > 3600 {
            return Err("ttl_sec must be 1 to 3600".into());
        }
        Ok(Token::Jwt(s))
    }

    /// The Authorization header value for one run, or None for a profile
    /// without a token.
    pub fn mint(&self, scope: &Scope<'_>) -> Result<Option<HeaderValue>, MintError> {
        match self {
            Token::None => Ok(None),
            Token::Static(v) => Ok(Some(v.clone())),
            Token::Jwt(s) => {
                let now = SystemTime::now()
                    .duration_since(UNIX_EPOCH)
                    .map_err(|_| MintError::Clock)?
                    .as_secs();
                let life = u64::from(s.ttl_sec).min(scope.run_budget.as_secs() + 5);
                let mut jti = [0u8; 16];
                getrandom::fill(&mut jti).map_err(MintError::Randomness)?;
                let mut header = serde_json::json!({"alg": "HS256", "typ": "JWT"});
                if let Some(kid) = &s.key_id {
                    header["kid"] = kid.clone().into();
                }
                let mut claims = serde_json::json!({
                    "sub": scope.subject,
                    "aud": s.audience,
                    "iat": now,
                    "nbf": now,
                    "exp": now + life.max(1),
                    "jti": hex::encode(jti),
                });
                if !scope.scopes.is_empty() {
                    claims["scope"] = scope.scopes.join(" ").into();
                }
                if let Some(iss) = &s.issuer {
                    claims["iss"] = iss.clone().into();
                }
                let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD;
                let signing_input = format!(
                    "{}.{}",
                    b64.encode(header.to_string()),
                    b64.encode(claims.to_string())
                );
                let mut mac =
                    Hmac::<Sha256>::new_from_slice(&s.secret).map_err(|_| MintError::Key)?;
                mac.update(signing_input.as_bytes());
                let sig = b64.encode(mac.finalize().into_bytes());
                let mut v = HeaderValue::from_str(&format!("Bearer {signing_input}.{sig}"))
                    .map_err(|_| MintError::Header)?;
                v.set_sensitive(true);
                Ok(Some(v))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jwts_are_signed_scoped_and_short_lived() {
        let t = Token::jwt(JwtSettings {
            secret: b"0123456789abcdef0123456789abcdef".to_vec(),
            ttl_sec: 60,
            issuer: Some("plimsoll".into()),
            audience: "api".into(),
            key_id: Some("k1".into()),
        })
        .expect("jwt");
        let scopes = vec!["items:read".to_string()];
        let mint = || {
            t.mint(&Scope {
                subject: "anonymous",
                scopes: &scopes,
                run_budget: Duration::from_secs(5),
            })
            .expect("mint")
            .expect("a value")
        };
        let v = mint();
        assert!(v.is_sensitive());
        let text = v.to_str().expect("ascii");
        let jwt = text.strip_prefix("Bearer ").expect("bearer");
        let parts: Vec<&str> = jwt.split('.').collect();
        assert_eq!(parts.len(), 3);
        let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD;
        let claims: serde_json::Value =
            serde_json::from_slice(&b64.decode(parts[1]).expect("b64")).expect("json");
        assert_eq!(claims["sub"], "anonymous");
        assert_eq!(claims["aud"], "api");
        assert_eq!(claims["scope"], "items:read");
        let life = claims["exp"].as_u64().unwrap_or(0) - claims["iat"].as_u64().unwrap_or(0);
        assert_eq!(life, 10, "run budget + 5 s, below the ttl");
        // The signature verifies with the secret.
        let mut mac =
            Hmac::<Sha256>::new_from_slice(b"0123456789abcdef0123456789abcdef").expect("mac");
        mac.update(format!("{}.{}", parts[0], parts[1]).as_bytes());
        assert_eq!(b64.encode(mac.finalize().into_bytes()), parts[2]);
        // A fresh jti every run.
        assert_ne!(mint(), v);
        assert!(!format!("{t:?}").contains("0123"));
    }
}
