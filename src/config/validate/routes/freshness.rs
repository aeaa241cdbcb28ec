//! A route's freshness: `ttl` (fixed, or from the origin within `max_ttl`
//! with `default_ttl`), and the windows after it (`grace`, `max_grace`,
//! `stale_if_error`, `keep`), bounded so that no entry stays in the store
//! for months.

use crate::config::file::{FileRoute, FileTtl};
use crate::config::route::{OriginCacheControl, Ttl};
use crate::config::units::HumanDuration;
use crate::config::validate::{err, Result};
use std::time::Duration;

/// `max_grace` of a `ttl: origin` route that sets none: the origin's
/// `stale-while-revalidate` is honoured by default, within a minute.
const DEFAULT_MAX_GRACE: Duration = Duration::from_secs(60);

/// The `ttl` and `max_grace` of route `at`, once its stale windows are
/// known to stay bounded.
pub(super) fn freshness(
    at: &str,
    r: &FileRoute,
    origin_cache_control: OriginCacheControl,
) -> Result<(Ttl, Duration)> {
    let ttl = ttl(at, r.ttl, r.max_ttl, r.default_ttl, origin_cache_control)?;
    let fresh = match ttl {
        Ttl::Fixed(t) => t + r.jitter.0,
        Ttl::Origin { max, .. } => max,
    }
    .max(r.negative_ttl.0);
    let max_grace = match (r.max_grace, ttl) {
        (None, Ttl::Origin { .. }) => DEFAULT_MAX_GRACE,
        (None, Ttl::Fixed(_)) => Duration::ZERO,
        (Some(m), Ttl::Origin { .. }) => m.0,
        (Some(_), Ttl::Fixed(_)) => {
            return err(
                format!("{at}.max_grace"),
                "only with ttl: origin (the origin's stale-while-revalidate is read there)",
            )
        }
    };
    // The wider of the two names the field an error points at.
    let grace = if max_grace > r.grace.0 {
        ("max_grace", max_grace)
    } else {
        ("grace", r.grace.0)
    };
    stale_windows(at, fresh, grace, r.stale_if_error.0, r.keep.0)?;
    Ok((ttl, max_grace))
}

/// `ttl`, and `max_ttl` / `default_ttl`, which belong to `ttl: origin`.
fn ttl(
    at: &str,
    ttl: FileTtl,
    max_ttl: Option<HumanDuration>,
    default_ttl: Option<HumanDuration>,
    occ: OriginCacheControl,
) -> Result<Ttl> {
    match ttl {
        FileTtl::Fixed(t) => {
            if t.0.is_zero() {
                return err(format!("{at}.ttl"), "must be greater than zero");
            }
            for (field, given) in [("max_ttl", max_ttl), ("default_ttl", default_ttl)] {
                if given.is_some() {
                    return err(
                        format!("{at}.{field}"),
                        "only applies with `ttl: origin` (this route's ttl is fixed)",
                    );
                }
            }
            Ok(Ttl::Fixed(t.0))
        }
        FileTtl::Origin => {
            let Some(max) = max_ttl else {
                return err(
                    format!("{at}.max_ttl"),
                    "is required with `ttl: origin` (the longest the origin may make an entry fresh)",
                );
            };
            if max.0.is_zero() {
                return err(format!("{at}.max_ttl"), "must be greater than zero");
            }
            let default = default_ttl.map_or(Duration::ZERO, |d| d.0);
            if default > max.0 {
                return err(
                    format!("{at}.default_ttl"),
                    format!("{default:?} exceeds max_ttl ({:?})", max.0),
                );
            }
            if occ == OriginCacheControl::Ignore {
                return err(
                    format!("{at}.origin_cache_control"),
                    "`ignore` contradicts `ttl: origin`, which takes the lifetime from the \
                     origin's Cache-Control; use `honor`",
                );
            }
            Ok(Ttl::Origin {
                max: max.0,
                default,
            })
        }
    }
}

/// The longest an entry may stay in the store (fresh life plus its stale
/// window). Entries carry their stale windows as u32 milliseconds, and a
/// keep window of months would pin dead objects in memory for no reader.
const MAX_ENTRY_LIFE: Duration = Duration::from_secs(30 * 24 * 3600);

/// `grace`, `stale_if_error` and `keep`: the store keeps an entry for
/// `ttl + jitter + max(grace, stale_if_error, keep)`, which must stay bounded.
fn stale_windows(
    at: &str,
    fresh: Duration,
    grace: (&str, Duration),
    stale_if_error: Duration,
    keep: Duration,
) -> Result<()> {
    // The widest names the field (the first listed on a tie).
    let (field, widest) = [grace, ("stale_if_error", stale_if_error), ("keep", keep)]
        .into_iter()
        .rev()
        .max_by_key(|&(_, window)| window)
        .unwrap_or(grace);
    let life = fresh + widest;
    if life > MAX_ENTRY_LIFE {
        return err(
            format!("{at}.{field}"),
            format!(
                "keeps entries for {}s (ttl + jitter + max(grace, stale_if_error, keep)); at most {}s",
                life.as_secs(),
                MAX_ENTRY_LIFE.as_secs()
            ),
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::testing::{err, parse, APP};

    #[test]
    fn stale_windows_validated_and_kept_in_gen_ttl() {
        let cfg = parse(&APP.replace(
            "ttl: 60s",
            "ttl: 60s\n    grace: 30s\n    stale_if_error: 10m",
        ))
        .expect("valid");
        let r = &cfg.routes.routes[0];
        assert_eq!(r.grace, Duration::from_secs(30));
        assert_eq!(r.stale_if_error, Duration::from_secs(600));
        assert_eq!(r.stale_keep(), Duration::from_secs(600));
        // The generation must outlive the kept entry, or a stale answer could
        // never be proven current: 60 s + 600 s + 3 s + 10 s + 60 s.
        assert_eq!(cfg.gen_ttl, Duration::from_secs(733));
        let defaults = parse(APP).expect("valid");
        assert_eq!(
            defaults.routes.routes[0].stale_keep(),
            Duration::from_secs(60),
            "keep"
        );
        let no_keep = parse(&APP.replace("ttl: 60s", "ttl: 60s\n    keep: 0s")).expect("valid");
        assert_eq!(no_keep.routes.routes[0].stale_keep(), Duration::ZERO);
        for (extra, path) in [
            ("ttl: 60s\n    grace: -5s", "routes[0].grace"),
            (
                "ttl: 60s\n    stale_if_error: -1s",
                "routes[0].stale_if_error",
            ),
            // grace without a TTL: ttl is required and must not be zero.
            ("ttl: 0s\n    grace: 1h", "routes[0].ttl"),
            ("grace: 1h", "routes[0]"),
            ("ttl: 60s\n    grace: 800h", "routes[0].grace"),
            (
                "ttl: 60s\n    stale_if_error: 720h",
                "routes[0].stale_if_error",
            ),
            ("ttl: 60s\n    keep: 720h", "routes[0].keep"),
            ("ttl: 60s\n    keep: -1s", "routes[0].keep"),
        ] {
            let e = err(&APP.replace("ttl: 60s", extra));
            assert!(e.contains(path), "{extra}: expected {path} in: {e}");
        }
    }

    #[test]
    fn ttl_origin_needs_a_cap_and_a_consistent_route() {
        let cfg = parse(&APP.replace(
            "ttl: 60s",
            "ttl: origin\n    max_ttl: 1h\n    default_ttl: 30s\n    grace: 10s",
        ))
        .expect("valid");
        let r = &cfg.routes.routes[0];
        assert_eq!(
            r.ttl,
            Ttl::Origin {
                max: Duration::from_secs(3600),
                default: Duration::from_secs(30)
            }
        );
        // The generation outlives the longest entry: 3600 + 60 (keep) + 3 + 10 + 60.
        assert_eq!(cfg.gen_ttl, Duration::from_secs(3733));
        let no_default =
            parse(&APP.replace("ttl: 60s", "ttl: origin\n    max_ttl: 5s")).expect("valid");
        assert_eq!(
            no_default.routes.routes[0].ttl.origin_caps(),
            Some((Duration::from_secs(5), Duration::ZERO))
        );
        for (keys, path, words) in [
            ("ttl: origin", "routes[0].max_ttl", "required"),
            (
                "ttl: origin\n    max_ttl: 0s",
                "routes[0].max_ttl",
                "greater than zero",
            ),
            (
                "ttl: origin\n    max_ttl: 5s\n    default_ttl: 6s",
                "routes[0].default_ttl",
                "exceeds max_ttl",
            ),
            (
                "ttl: 60s\n    max_ttl: 5s",
                "routes[0].max_ttl",
                "ttl: origin",
            ),
            (
                "ttl: 60s\n    default_ttl: 5s",
                "routes[0].default_ttl",
                "ttl: origin",
            ),
            (
                "ttl: origin\n    max_ttl: 5s\n    origin_cache_control: ignore",
                "routes[0].origin_cache_control",
                "contradicts",
            ),
            ("ttl: originn", "routes[0].ttl", "origin"),
            (
                "ttl: origin\n    max_ttl: 800h",
                "routes[0].max_grace",
                "at most",
            ),
            (
                "ttl: origin\n    max_ttl: 800h\n    max_grace: 0s",
                "routes[0].keep",
                "at most",
            ),
        ] {
            let e = err(&APP.replace("ttl: 60s", keys));
            assert!(e.contains(path), "{keys}: expected {path} in: {e}");
            assert!(e.contains(words), "{keys}: expected {words:?} in: {e}");
        }
    }
}
