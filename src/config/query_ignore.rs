//! [`QueryIgnore`]: a route's `query_ignore` list, the query parameters
//! (tracking and the like: `utm_*`, `fbclid`) that are dropped from the
//! key and from the fill request, and so never split the cache nor make a
//! request BYPASS it (docs/caching.md#tracking-parameters).
//!
//! A pattern is a parameter name as written in the URL (percent-encoded,
//! compared without decoding, like the rest of the key) in which `*`
//! stands for any run of characters. One wildcard is all such names need,
//! so the matcher is the few lines below rather than a path-glob crate,
//! whose `/`, `**`, classes and alternation have no meaning here.

use thiserror::Error;

/// Why a `query_ignore` pattern is refused.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum GlobError {
    #[error("is empty")]
    Empty,
    #[error("matches every parameter: use `query: ignore` to drop the whole query")]
    MatchesAll,
    #[error("{0:?} cannot be part of a query parameter name (`*` is the only wildcard; write other characters percent-encoded, as in the URL)")]
    BadChar(char),
    #[error("a `%` must start a percent-encoded byte (`%` and two hex digits)")]
    BadEscape,
}

/// One `query_ignore` pattern: the literal pieces between its `*`s.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParamGlob {
    text: String,
    /// `text` split on `*`: the first piece is a prefix, the last a
    /// suffix, the middle ones appear in order between them.
    pieces: Vec<String>,
}

impl ParamGlob {
    /// Parses a pattern; its characters must be those a query parameter
    /// name can hold unencoded (RFC 3986 `query`, minus `&` and `=`).
    pub fn parse(text: &str) -> Result<ParamGlob, GlobError> {
        if text.is_empty() {
            return Err(GlobError::Empty);
        }
        if text.chars().all(|c| c == '*') {
            return Err(GlobError::MatchesAll);
        }
        let bytes = text.as_bytes();
        for (i, c) in text.char_indices() {
            let allowed = c.is_ascii_alphanumeric() || "-._~!$'()*+,;:@/?%".contains(c);
            if !allowed {
                return Err(GlobError::BadChar(c));
            }
            let hex = |j: usize| bytes.get(j).is_some_and(u8::is_ascii_hexdigit);
            if c == '%' && !(hex(i + 1) && hex(i + 2)) {
                return Err(GlobError::BadEscape);
            }
        }
        Ok(ParamGlob {
            text: text.to_owned(),
            pieces: text.split('*').map(str::to_owned).collect(),
        })
    }

    /// The pattern as written in the config.
    pub fn as_str(&self) -> &str {
        &self.text
    }

    /// Whether `name` (as written in the URL) matches the whole pattern.
    pub fn matches(&self, name: &str) -> bool {
        let (first, rest) = match self.pieces.split_first() {
            Some(split) => split,
            None => return false,
        };
        let Some(mut left) = name.strip_prefix(first.as_str()) else {
            return false;
        };
        let Some((last, middle)) = rest.split_last() else {
            // No `*`: the name is the pattern.
            return left.is_empty();
        };
        for piece in middle {
            match left.find(piece.as_str()) {
                Some(at) => left = &left[at + piece.len()..],
                None => return false,
            }
        }
        left.ends_with(last.as_str())
    }
}

/// A route's `query_ignore` patterns (empty: none, the common case, which
/// costs one length check per query pair).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct QueryIgnore {
    globs: Vec<ParamGlob>,
}

impl QueryIgnore {
    pub fn new(globs: Vec<ParamGlob>) -> QueryIgnore {
        QueryIgnore { globs }
    }

    pub fn is_empty(&self) -> bool {
        self.globs.is_empty()
    }

    pub fn globs(&self) -> &[ParamGlob] {
        &self.globs
    }

    /// Whether the query pair `pair` (`name` or `name=value`) names an
    /// ignored parameter.
    pub fn drops(&self, pair: &str) -> bool {
        if self.globs.is_empty() {
            return false;
        }
        let name = pair.split_once('=').map_or(pair, |(n, _)| n);
        self.globs.iter().any(|g| g.matches(name))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn glob(text: &str) -> ParamGlob {
        ParamGlob::parse(text).expect("valid pattern")
    }

    #[test]
    fn stars_match_any_run_and_the_rest_is_literal() {
        for (pattern, name, expected) in [
            ("fbclid", "fbclid", true),
            ("fbclid", "fbclid2", false),
            ("fbclid", "xfbclid", false),
            ("utm_*", "utm_source", true),
            ("utm_*", "utm_", true),
            ("utm_*", "utm", false),
            ("utm_*", "xutm_source", false),
            ("*_id", "click_id", true),
            ("*_id", "click_idx", false),
            ("a*b*c", "abc", true),
            ("a*b*c", "a-b-b-c", true),
            ("a*b*c", "acb", false),
            ("a*bc", "abc", true),
            ("ab*bc", "abc", false),
            ("mc_*", "MC_eid", false),
            ("a%5B%5D", "a%5B%5D", true),
        ] {
            assert_eq!(glob(pattern).matches(name), expected, "{pattern} ~ {name}");
        }
    }

    #[test]
    fn drops_compares_the_name_of_a_pair() {
        let ignore = QueryIgnore::new(vec![glob("utm_*"), glob("gclid")]);
        assert!(ignore.drops("utm_source=news"));
        assert!(ignore.drops("gclid"));
        assert!(ignore.drops("gclid="));
        assert!(!ignore.drops("page=utm_x"));
        assert!(!ignore.drops("gclid2=1"));
        assert!(!QueryIgnore::default().drops("utm_source=x"));
    }

    #[test]
    fn bad_patterns_are_refused() {
        for (text, e) in [
            ("", GlobError::Empty),
            ("*", GlobError::MatchesAll),
            ("**", GlobError::MatchesAll),
            ("utm=*", GlobError::BadChar('=')),
            ("a&b", GlobError::BadChar('&')),
            ("a b", GlobError::BadChar(' ')),
            ("utm_[ab]", GlobError::BadChar('[')),
            ("{a,b}", GlobError::BadChar('{')),
            ("ütm", GlobError::BadChar('ü')),
            ("a%zz", GlobError::BadEscape),
            ("a%4", GlobError::BadEscape),
        ] {
            assert_eq!(ParamGlob::parse(text), Err(e), "{text:?}");
        }
    }
}
