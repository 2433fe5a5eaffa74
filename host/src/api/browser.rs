//! What a page in a web browser can make the daemon do: nothing.
//!
//! A page can send requests to any address its browser reaches, this
//! machine's loopback included. With DNS rebinding (the page's own name
//! re-pointed at 127.0.0.1 after it loaded) it can read the answers too,
//! because to the browser they come from the page's own site. Two things
//! give such a request away, and a page can forge neither:
//! - the browser sends `Origin` with every request a page makes other than
//!   a same-site GET or HEAD, and every procedure here is a POST;
//! - `Host` is the name in the URL the page used. For a rebound name that
//!   is the attacker's name, never `localhost` or a loopback address, which
//!   no outside party can point anywhere.
//!
//! Where the rules apply:
//! - **Without callers (open mode)** nothing else stands between a page and
//!   a run, so every request whose caller `api::authenticate` would vouch
//!   for (every procedure, and `/mcp`) must name this machine and carry no
//!   `Origin`: `from_this_machine`. A call another replica forwarded is
//!   vouched for by the replicas' signature instead, which no page can
//!   make, and is not held to a name: replicas reach each other by theirs.
//! - **With callers** a page has no token. A browser attaches a bearer
//!   token to nothing by itself, and a cross-origin request that carries
//!   one must first pass a CORS preflight this daemon never approves. The
//!   token is the defence, and the daemon's name is the operator's to
//!   choose (a balancer's, a service name). Only `/mcp` still refuses an
//!   `Origin` (`refuse_origin`), as MCP's transport rules ask of every
//!   server.
//! - `/healthz` and `/readyz` are left alone: they run nothing, answer a
//!   fixed word, and are probed by orchestrators under whatever name they
//!   use.
//!
//! Any port is accepted with a loopback name. The name is what a rebinding
//! page cannot fake, and a port check would refuse loopback proxies and
//! clients that leave out a default port.
//!
//! A refusal is 403 `permission_denied`, marked `permission` (it comes
//! before the body is read, so nothing ran), and repeats nothing that was
//! sent.

use std::net::{Ipv4Addr, Ipv6Addr};

use axum::http::{HeaderMap, StatusCode, Uri, header};
use axum::response::Response;

use super::connect::refusal_response;
use crate::refusal::Refusal;

/// The rule for a request no token vouches for: it names this machine,
/// and no web page sent it.
pub(super) fn from_this_machine(headers: &HeaderMap, uri: &Uri) -> Result<(), Box<Response>> {
    refuse_foreign_host(headers, uri)?;
    refuse_origin(headers)
}

/// Refuses a request a web page sent: any `Origin` at all, `null`
/// included. No client of this daemon is a page, and the other clients
/// (the published ones, curl, the MCP SDKs) send none.
pub(super) fn refuse_origin(headers: &HeaderMap) -> Result<(), Box<Response>> {
    if headers.contains_key(header::ORIGIN) {
        return Err(refused(
            "requests from web pages (with an Origin header) are refused",
        ));
    }
    Ok(())
}

/// Refuses a request that does not name this machine. Every name the
/// request states must be loopback: the `Host` header (exactly one), and
/// the target's authority, which HTTP/2 sends in place of `Host` and an
/// HTTP/1.1 absolute-form target carries too. A request that names
/// nothing is refused as well, since a browser always sends a name.
fn refuse_foreign_host(headers: &HeaderMap, uri: &Uri) -> Result<(), Box<Response>> {
    let mut hosts = headers.get_all(header::HOST).iter();
    let by_header = match (hosts.next(), hosts.next()) {
        (None, _) => None,
        (Some(v), None) => Some(v.to_str().is_ok_and(names_loopback)),
        // Two names: which one a proxy or the browser meant is anyone's guess.
        (Some(_), Some(_)) => Some(false),
    };
    let by_target = uri.authority().map(|a| names_loopback(a.as_str()));
    match (by_header, by_target) {
        (Some(true), None | Some(true)) | (None, Some(true)) => Ok(()),
        _ => Err(refused(
            "without caller tokens, this daemon takes requests only under a loopback name (localhost, 127.0.0.1, [::1])",
        )),
    }
}

/// Whether an authority (`host[:port]`) names this machine: `localhost`
/// (any case), an IPv4 loopback address or `[::1]`, then an optional port
/// of decimal digits. Anything else (user info, a trailing dot, a zone, an
/// empty port) is not a form a browser writes for these names, and is
/// refused rather than interpreted.
fn names_loopback(authority: &str) -> bool {
    let (loopback, after) = match authority.strip_prefix('[') {
        Some(bracketed) => match bracketed.split_once(']') {
            Some((v6, after)) => (
                v6.parse::<Ipv6Addr>().is_ok_and(|ip| ip.is_loopback()),
                after,
            ),
            None => return false,
        },
        None => {
            let (name, after) = authority.split_at(authority.find(':').unwrap_or(authority.len()));
            let loopback = name.eq_ignore_ascii_case("localhost")
                || name.parse::<Ipv4Addr>().is_ok_and(|ip| ip.is_loopback());
            (loopback, after)
        }
    };
    loopback
        && match after.strip_prefix(':') {
            None => after.is_empty(),
            Some(port) => {
                !port.is_empty()
                    && port.bytes().all(|b| b.is_ascii_digit())
                    && port.parse::<u16>().is_ok()
            }
        }
}

fn refused(why: &str) -> Box<Response> {
    Box::new(refusal_response(
        StatusCode::FORBIDDEN,
        &Refusal::permission(why),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    #[test]
    fn only_loopback_names_are_this_machine() {
        for ok in [
            "localhost",
            "LocalHost:8746",
            "127.0.0.1",
            "127.0.0.1:8746",
            "127.1.2.3:1",
            "[::1]",
            "[::1]:8746",
        ] {
            assert!(names_loopback(ok), "{ok}");
        }
        for no in [
            "",
            "evil.example",
            "evil.example:8746",
            "localhost.",
            "localhost.evil.example",
            "127.0.0.1.evil.example",
            "user@localhost",
            "localhost@evil.example",
            "localhost:",
            "localhost:+1",
            "localhost:65536",
            "localhost:80:80",
            "10.0.0.1:8746",
            "0.0.0.0:8746",
            "127.1",
            "::1",
            "[::1",
            "[::1]x",
            "[::ffff:127.0.0.1]",
            "[fe80::1%25lo]",
            "[2001:db8::1]:8746",
        ] {
            assert!(!names_loopback(no), "{no}");
        }
    }

    fn host(v: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(header::HOST, HeaderValue::from_str(v).expect("value"));
        h
    }

    #[test]
    fn every_stated_name_must_be_loopback_and_one_must_be_stated() {
        let origin_form: Uri = "/plimsoll.v1.SandboxService/Run".parse().expect("uri");
        let to_loopback: Uri = "http://127.0.0.1:8746/x".parse().expect("uri");
        let to_evil: Uri = "http://evil.example/x".parse().expect("uri");
        assert!(from_this_machine(&host("localhost:1"), &origin_form).is_ok());
        // HTTP/2: no Host header, the name is in the target.
        assert!(from_this_machine(&HeaderMap::new(), &to_loopback).is_ok());
        assert!(from_this_machine(&HeaderMap::new(), &origin_form).is_err());
        assert!(from_this_machine(&host("localhost"), &to_evil).is_err());
        assert!(from_this_machine(&host("evil.example"), &to_loopback).is_err());
        let mut two = host("localhost");
        two.append(header::HOST, HeaderValue::from_static("evil.example"));
        assert!(from_this_machine(&two, &origin_form).is_err());
        let mut paged = host("localhost");
        paged.insert(header::ORIGIN, HeaderValue::from_static("null"));
        let refused = from_this_machine(&paged, &origin_form).expect_err("a page");
        assert_eq!(refused.status(), StatusCode::FORBIDDEN);
        assert_eq!(
            refused
                .headers()
                .get(super::super::NOT_DISPATCHED_HEADER)
                .map(HeaderValue::as_bytes),
            Some(&b"permission"[..])
        );
    }
}
