//! Human-written units in the config file: durations (`250ms`, `5s`, `10m`)
//! and sizes (`512KiB`, `1MiB`). Parse errors surface through serde so the
//! loader can name the YAML path.

use serde::{Deserialize, Deserializer};
use std::fmt;
use std::time::Duration;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct HumanDuration(pub Duration);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct HumanSize(pub u64);

/// Splits `"250ms"` into `(250, "ms")`; the number must be a whole number.
fn split_number(s: &str) -> Option<(u64, &str)> {
    let s = s.trim();
    let end = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    if end == 0 {
        return None;
    }
    let n = s[..end].parse().ok()?;
    Some((n, s[end..].trim()))
}

pub(crate) fn parse_duration(s: &str) -> Result<Duration, String> {
    let bad = || {
        format!("invalid duration {s:?}: expected a whole number with a unit (ms, s, m, h), e.g. \"250ms\"")
    };
    let (n, unit) = split_number(s).ok_or_else(bad)?;
    let d = match unit {
        "ms" => Duration::from_millis(n),
        "s" => Duration::from_secs(n),
        "m" => Duration::from_secs(n.checked_mul(60).ok_or_else(bad)?),
        "h" => Duration::from_secs(n.checked_mul(3600).ok_or_else(bad)?),
        _ => return Err(bad()),
    };
    Ok(d)
}

pub(crate) fn parse_size(s: &str) -> Result<u64, String> {
    let bad = || {
        format!("invalid size {s:?}: expected a whole number with a unit (B, KiB, MiB, GiB), e.g. \"1MiB\"")
    };
    let (n, unit) = split_number(s).ok_or_else(bad)?;
    let mult: u64 = match unit {
        "" | "B" => 1,
        "KiB" | "KB" | "k" => 1024,
        "MiB" | "MB" | "M" => 1024 * 1024,
        "GiB" | "GB" | "G" => 1024 * 1024 * 1024,
        _ => return Err(bad()),
    };
    n.checked_mul(mult).ok_or_else(bad)
}

impl schemars::JsonSchema for HumanDuration {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "Duration".into()
    }
    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({
            "description": "A whole number with a unit: ms, s, m or h (`250ms`, `5s`).",
            "type": "string",
            "pattern": "^[0-9]+(ms|s|m|h)$"
        })
    }
}

impl schemars::JsonSchema for HumanSize {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "Size".into()
    }
    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({
            "description": "Bytes: a number, or a whole number with a unit (B, KiB, MiB, GiB).",
            "anyOf": [
                { "type": "integer", "minimum": 0 },
                { "type": "string", "pattern": "^[0-9]+ ?(B|KiB|KB|k|MiB|MB|M|GiB|GB|G)?$" }
            ]
        })
    }
}

impl<'de> Deserialize<'de> for HumanDuration {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        parse_duration(&s)
            .map(HumanDuration)
            .map_err(serde::de::Error::custom)
    }
}

impl<'de> Deserialize<'de> for HumanSize {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        // Accept a bare YAML number of bytes as well as "1MiB".
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            N(u64),
            S(String),
        }
        match Raw::deserialize(d)? {
            Raw::N(n) => Ok(HumanSize(n)),
            Raw::S(s) => parse_size(&s)
                .map(HumanSize)
                .map_err(serde::de::Error::custom),
        }
    }
}

impl fmt::Display for HumanDuration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}", self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse_duration("5s"), Ok(Duration::from_secs(5)));
        assert_eq!(parse_duration("10m"), Ok(Duration::from_secs(600)));
        assert_eq!(parse_duration("2h"), Ok(Duration::from_secs(7200)));
        for bad in [
            "",
            "5",
            "s",
            "1.5s",
            "-1s",
            "5 minutes",
            "99999999999999999999h",
        ] {
            assert!(parse_duration(bad).is_err(), "{bad:?} should be rejected");
        }
    }

    #[test]
    fn sizes() {
        assert_eq!(parse_size("1MiB"), Ok(1 << 20));
        assert_eq!(parse_size("512KiB"), Ok(512 << 10));
        assert_eq!(parse_size("100"), Ok(100));
        assert!(parse_size("1 parsec").is_err());
    }
}
