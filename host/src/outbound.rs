//! The one way the daemon makes outbound HTTP requests on anyone's behalf:
//! the grant broker (for a run's code) and the plugin `http` capability (for
//! an adapter). Both need the same guarantees, so both take this client.
//!
//! No redirects are followed: an allowed origin that answers 30x must not
//! carry a request (and the credential the host attached) somewhere the
//! operator never listed. No proxy is read from the environment: a proxy
//! would see every request and could send it anywhere. TLS is verified
//! against the system's roots. Connecting and whole calls are bounded.

use std::time::Duration;

/// Longest any one outbound call may take, whatever its caller allows.
pub const TIMEOUT: Duration = Duration::from_secs(60);
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

pub fn client() -> Result<reqwest::Client, reqwest::Error> {
    reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .no_proxy()
        .timeout(TIMEOUT)
        .connect_timeout(CONNECT_TIMEOUT)
        .build()
}
