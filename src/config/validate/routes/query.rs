//! A route's query keys (`routes[i].query`, `routes[i].query_ignore`):
//! the mode or allow-list, and the patterns of parameters dropped from the
//! key, each checked on its own and against the allow-list.

use crate::config::file::{FileQuery, FileQueryMode};
use crate::config::query_ignore::{ParamGlob, QueryIgnore};
use crate::config::route::QueryMode;
use crate::config::validate::{err, Result};

/// `query` and `query_ignore` of route `at`.
pub(super) fn query(
    at: &str,
    query: FileQuery,
    ignore: &[String],
) -> Result<(QueryMode, QueryIgnore)> {
    let mode = match query {
        FileQuery::Mode(FileQueryMode::Include) => QueryMode::Include,
        FileQuery::Mode(FileQueryMode::Ignore) => QueryMode::Ignore,
        FileQuery::Allow(mut names) => {
            names.sort();
            names.dedup();
            QueryMode::Allow(names)
        }
    };
    if mode == QueryMode::Ignore && !ignore.is_empty() {
        return err(
            format!("{at}.query_ignore"),
            "has no effect with `query: ignore`, which drops the whole query",
        );
    }
    let mut globs = Vec::with_capacity(ignore.len());
    for (i, text) in ignore.iter().enumerate() {
        let path = || format!("{at}.query_ignore[{i}]");
        let glob = ParamGlob::parse(text).or_else(|e| err(path(), format!("{text:?}: {e}")))?;
        // A name both kept and dropped: one of the two lists is a mistake,
        // and which one wins would be a guess.
        if let QueryMode::Allow(names) = &mode {
            if let Some(name) = names.iter().find(|n| glob.matches(n)) {
                return err(
                    path(),
                    format!("{text:?} matches {name:?}, which `query` keeps in the key"),
                );
            }
        }
        globs.push(glob);
    }
    Ok((mode, QueryIgnore::new(globs)))
}

#[cfg(test)]
mod tests {
    use crate::config::testing::{err, parse};

    fn yaml(query: &str, ignore: &str) -> String {
        format!(
            "routes:\n  - name: r\n    path: /r/{{id}}\n    params: {{ id: \"[0-9]+\" }}\n    ttl: 1s\n    query: {query}\n    query_ignore: {ignore}\n"
        )
    }

    #[test]
    fn bad_patterns_name_their_yaml_path() {
        for (ignore, words) in [
            (r#"[fbclid, "utm=*"]"#, "routes[0].query_ignore[1]"),
            (r#"[fbclid, "utm=*"]"#, "'=' cannot be part"),
            (r#"["*"]"#, "use `query: ignore`"),
            (r#"[""]"#, "is empty"),
            (r#"["utm_[ab]"]"#, "`*` is the only wildcard"),
            (r#"["a%g1"]"#, "percent-encoded byte"),
        ] {
            let e = err(&yaml("include", ignore));
            assert!(e.contains(words), "{ignore}: {e}");
            assert!(e.contains("routes[0].query_ignore["), "{ignore}: {e}");
        }
    }

    #[test]
    fn a_pattern_may_not_drop_a_kept_name() {
        let e = err(&yaml("[page, utm_campaign]", "[fbclid, \"utm_*\"]"));
        assert!(e.contains("routes[0].query_ignore[1]"), "{e}");
        assert!(e.contains("\"utm_campaign\""), "{e}");
        let e = err(&yaml("ignore", "[fbclid]"));
        assert!(
            e.contains("routes[0].query_ignore") && e.contains("no effect"),
            "{e}"
        );
        let cfg = parse(&yaml("[page]", "[fbclid, \"utm_*\"]")).expect("valid");
        let names: Vec<&str> = cfg.routes.routes[0]
            .query_ignore
            .globs()
            .iter()
            .map(|g| g.as_str())
            .collect();
        assert_eq!(names, ["fbclid", "utm_*"]);
    }
}
