//! Cache tags: what a tag may look like and how many one answer or event
//! may carry. Shared by the read pipeline (tags from the route's
//! `tags_from` response header) and invalidation (tag events), so a tag a
//! response carries is exactly one an event can name.

/// Tags one entry (or one event) may carry: each costs the hit a tag
/// generation check, and an entry is stamped with all of them.
pub(crate) const MAX_TAGS: usize = 32;
/// Bytes per tag.
pub(crate) const MAX_TAG_LEN: usize = 128;

/// Why a tag list is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum TagError {
    #[error("more than {MAX_TAGS} tags")]
    TooMany,
    #[error("tag {0:?} is empty, longer than {MAX_TAG_LEN} bytes, or has whitespace or control characters")]
    Bad(String),
}

/// One tag: 1..=128 bytes, no whitespace, no control characters, no comma
/// (the separators of the header form).
pub(crate) fn check(tag: &str) -> Result<(), TagError> {
    let bad = tag.is_empty()
        || tag.len() > MAX_TAG_LEN
        || tag
            .chars()
            .any(|c| c.is_whitespace() || c.is_control() || c == ',');
    if bad {
        return Err(TagError::Bad(tag.chars().take(MAX_TAG_LEN).collect()));
    }
    Ok(())
}

/// A list of tags (an event's), checked, sorted and without duplicates.
pub(crate) fn checked(tags: Vec<String>) -> Result<Vec<String>, TagError> {
    if tags.len() > MAX_TAGS {
        return Err(TagError::TooMany);
    }
    for t in &tags {
        check(t)?;
    }
    let mut tags = tags;
    tags.sort_unstable();
    tags.dedup();
    Ok(tags)
}

/// The tags of a response header's values (`Surrogate-Key: a b`,
/// `Cache-Tag: a,b`; several header lines add up), checked, sorted and
/// without duplicates. A value that is not visible ASCII is a bad tag.
pub(crate) fn from_header<'a>(
    values: impl Iterator<Item = &'a http::HeaderValue>,
) -> Result<Vec<String>, TagError> {
    let mut tags = Vec::new();
    for value in values {
        let text = value
            .to_str()
            .map_err(|_| TagError::Bad(String::from_utf8_lossy(value.as_bytes()).into_owned()))?;
        for tag in text.split([' ', ',', '\t']).filter(|t| !t.is_empty()) {
            if tags.len() == MAX_TAGS {
                return Err(TagError::TooMany);
            }
            tags.push(tag.to_owned());
        }
    }
    checked(tags)
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    #[test]
    fn header_values_split_on_spaces_and_commas() {
        let v = [
            HeaderValue::from_static("app:acme:1  tenant:acme,list"),
            HeaderValue::from_static("app:acme:1"),
        ];
        assert_eq!(
            from_header(v.iter()),
            Ok(vec![
                "app:acme:1".to_owned(),
                "list".to_owned(),
                "tenant:acme".to_owned()
            ])
        );
        assert_eq!(from_header([].iter()), Ok(vec![]));
    }

    #[test]
    fn bounds_and_bad_characters_are_refused() {
        let many = (0..=MAX_TAGS).map(|i| format!("t{i}")).collect::<Vec<_>>();
        let header = HeaderValue::from_str(&many.join(" ")).unwrap();
        assert_eq!(from_header([header].iter()), Err(TagError::TooMany));
        assert_eq!(checked(many), Err(TagError::TooMany));
        let long = "x".repeat(MAX_TAG_LEN + 1);
        assert!(matches!(check(&long), Err(TagError::Bad(_))));
        assert!(check(&"x".repeat(MAX_TAG_LEN)).is_ok());
        for bad in ["", "a b", "a\u{7}b", "a\nb", "a,b"] {
            assert!(check(bad).is_err(), "{bad:?}");
        }
        let obs = HeaderValue::from_bytes(b"caf\xe9").unwrap();
        assert!(from_header([obs].iter()).is_err());
    }
}
