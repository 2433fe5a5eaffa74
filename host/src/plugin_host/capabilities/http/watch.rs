//! A seam for watching what a plugin sends, for `plimsoll plugin check`:
//! each request that passed the policy, as it leaves, and the status it was
//! answered with. The daemon installs no watcher; nothing here can change a
//! request or its answer.

/// One request, as the watcher is shown it: the scheme, the method and
/// the names of the headers the *plugin* set (never a value, and never the
/// host's own key, which is added after the plugin's headers are checked).
pub struct Sent<'a> {
    pub https: bool,
    pub method: &'a str,
    pub header_names: Vec<&'a str>,
}

pub trait Watch: Send + Sync + 'static {
    /// A request passed every check and may now reach the service.
    fn sent(&self, request: Sent<'_>);
    /// The service answered a request with this status.
    fn answered(&self, status: u16);
    /// The policy refused a request (the rule, never the request).
    fn refused(&self, rule: &str);
}
