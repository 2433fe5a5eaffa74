//! The order routes are listed in, in the allow list, the catalog and the
//! SDK: the broker takes the first allow entry that matches, so a fixed
//! route must come before the wildcard that would also match it.

use std::cmp::Ordering;

use crate::grants::route::METHODS;

/// Routes segment by segment (a literal before `*`, literals by their
/// bytes, a shorter path first), then by method in `METHODS` order. So the
/// allow list tries `GET /user/login` before `GET /user/*`.
pub(super) fn route_order(a: &str, b: &str) -> Ordering {
    let split = |t: &str| -> (usize, String) {
        let (method, path) = t.split_once(' ').unwrap_or(("", t));
        let rank = METHODS
            .iter()
            .position(|m| *m == method)
            .unwrap_or(METHODS.len());
        (rank, path.to_string())
    };
    let (ma, pa) = split(a);
    let (mb, pb) = split(b);
    let segments = |p: &str| -> Vec<(bool, String)> {
        p.split('/')
            .skip(1)
            .map(|s| (s == "*", s.to_string()))
            .collect()
    };
    segments(&pa).cmp(&segments(&pb)).then(ma.cmp(&mb))
}
