//! [`ParamPattern`]: a path param's pattern (`params:` in a route), matched
//! against a whole value on every request that reaches the route's shape.
//!
//! `regex::Regex::is_match` pays the meta engine's per-call set-up (its cache
//! pool, the lazy DFA's start state) on every short value: a large part of a
//! HIT's route classification (bench/README.md). So the pattern is also
//! compiled ahead of time into a dense DFA (`regex-automata`, the engine under
//! `regex`, same syntax and semantics), capped in size; a pattern whose DFA
//! would be larger, or that a DFA cannot express (Unicode word boundaries), is
//! matched by the `Regex` alone, as before.

use regex::Regex;
use regex_automata::dfa::{dense, Automaton, StartKind};
use regex_automata::{Anchored, Input, MatchKind};

/// Largest DFA kept per pattern: `[A-Za-z0-9_-]{1,64}` needs ~10 KiB;
/// Unicode classes with long repetitions (`\w{1,64}`) need far more and
/// stay with the `Regex`.
const DFA_LIMIT: usize = 64 * 1024;

#[derive(Debug, Clone)]
pub struct ParamPattern {
    /// Anchored: `^(?:pattern)$`. Its text is what admin and explain show.
    regex: Regex,
    dfa: Option<dense::DFA<Vec<u32>>>,
}

impl ParamPattern {
    /// Compiles a param's pattern, anchored at both ends.
    pub(crate) fn new(pattern: &str) -> Result<ParamPattern, regex::Error> {
        let anchored = format!("^(?:{pattern})$");
        let regex = Regex::new(&anchored)?;
        // `All`: any match counts, as for `Regex::is_match` (no branch is
        // dropped for an earlier one that matched).
        let config = dense::Config::new()
            .match_kind(MatchKind::All)
            .start_kind(StartKind::Anchored)
            .dfa_size_limit(Some(DFA_LIMIT))
            .determinize_size_limit(Some(4 * DFA_LIMIT));
        let dfa = dense::Builder::new()
            .configure(config)
            .build(&anchored)
            .ok();
        Ok(ParamPattern { regex, dfa })
    }

    /// Whether all of `value` matches.
    pub(crate) fn is_match(&self, value: &str) -> bool {
        match &self.dfa {
            Some(dfa) => walk(dfa, value).unwrap_or_else(|| self.regex.is_match(value)),
            None => self.regex.is_match(value),
        }
    }

    /// The anchored pattern, `^(?:...)$`.
    pub(crate) fn as_str(&self) -> &str {
        self.regex.as_str()
    }

    /// Whether matching goes through the DFA (for tests).
    #[cfg(test)]
    fn has_dfa(&self) -> bool {
        self.dfa.is_some()
    }
}

/// Runs `value` through the DFA byte by byte (the `Automaton` API's own
/// search sets up more per call than one short value takes to walk:
/// bench/README.md). The pattern ends in `$`, so a match can only be at the
/// end: the state after the end of input says it. `None` if the DFA gave up.
fn walk(dfa: &dense::DFA<Vec<u32>>, value: &str) -> Option<bool> {
    let input = Input::new(value).anchored(Anchored::Yes);
    let mut state = dfa.start_state_forward(&input).ok()?;
    for &b in value.as_bytes() {
        state = dfa.next_state(state, b);
        if dfa.is_special_state(state) {
            if dfa.is_dead_state(state) {
                return Some(false);
            }
            if dfa.is_quit_state(state) {
                return None;
            }
        }
    }
    Some(dfa.is_match_state(dfa.next_eoi_state(state)))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The DFA and the `Regex` agree on every value, including values that
    /// match only a prefix or a suffix of the pattern.
    fn agree(pattern: &str, values: &[&str]) -> ParamPattern {
        let p = ParamPattern::new(pattern).unwrap();
        for v in values {
            assert_eq!(p.is_match(v), p.regex.is_match(v), "{pattern} on {v:?}");
        }
        p
    }

    #[test]
    fn simple_patterns_get_a_dfa_that_matches_whole_values_only() {
        let (n18, n19, a64, a65) = (
            "9".repeat(18),
            "9".repeat(19),
            "a".repeat(64),
            "a".repeat(65),
        );
        let values = [
            "", "1", "0", "12", "012", "a1", "1a", "acme", "ac/me", "x-y_z", "ç", &n18, &n19, &a64,
            &a65,
        ];
        let id = agree("[1-9][0-9]{0,17}", &values);
        assert!(id.has_dfa());
        assert!(id.is_match("123") && !id.is_match("0123") && !id.is_match("12a"));
        assert!(!id.is_match(&"9".repeat(19)));
        let tenant = agree("[A-Za-z0-9_-]{1,64}", &values);
        assert!(tenant.has_dfa());
        assert!(tenant.is_match("x-y_z") && !tenant.is_match("") && !tenant.is_match("ac/me"));
        assert!(!tenant.is_match(&"a".repeat(65)));
        // Alternation: the anchors hold for each branch.
        let alt = agree("a|bc", &["a", "bc", "abc", "bca", "ab", ""]);
        assert!(alt.is_match("a") && alt.is_match("bc") && !alt.is_match("abc"));
        // A branch that matches a prefix first does not hide a longer one.
        let prefix = agree(
            "a|ab|[0-9]+x?",
            &["a", "ab", "abc", "1", "12x", "12xx", "x"],
        );
        assert!(prefix.is_match("ab") && prefix.is_match("12x") && !prefix.is_match("12xx"));
    }

    #[test]
    fn patterns_a_dfa_cannot_hold_still_match() {
        // Unicode word boundaries: no DFA; a large Unicode class: over the cap.
        let x70 = "x".repeat(70);
        let values = ["ab", "a b", "día", "日本", "", &x70];
        let boundary = agree(r"\b\w+\b", &values);
        assert!(!boundary.has_dfa());
        assert!(boundary.is_match("día") && !boundary.is_match("a b"));
        let wide = agree(r"\w{1,64}", &values);
        assert!(!wide.has_dfa());
        assert!(wide.is_match("日本") && !wide.is_match(&"x".repeat(70)));
    }
}
