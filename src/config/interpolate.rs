//! `${VAR}` and `${VAR:-default}` in string values, replaced from the
//! environment. Done on parsed values, not on the raw text, so a variable's
//! content can never change the YAML structure. `$$` is a literal `$`.

use super::ConfigError;
use serde_json::Value;

pub(crate) fn interpolate(
    value: &mut Value,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<(), ConfigError> {
    walk(value, &mut String::new(), env)
}

fn walk(
    value: &mut Value,
    path: &mut String,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<(), ConfigError> {
    match value {
        Value::String(s) if s.contains('$') => {
            *s = expand(s, env).map_err(|m| ConfigError::invalid(path.clone(), m))?;
        }
        Value::Array(items) => {
            for (i, item) in items.iter_mut().enumerate() {
                let len = path.len();
                path.push_str(&format!("[{i}]"));
                walk(item, path, env)?;
                path.truncate(len);
            }
        }
        Value::Object(map) => {
            for (k, v) in map.iter_mut() {
                let len = path.len();
                if !path.is_empty() {
                    path.push('.');
                }
                path.push_str(k);
                walk(v, path, env)?;
                path.truncate(len);
            }
        }
        _ => {}
    }
    Ok(())
}

/// Expands one string.
pub(crate) fn expand(s: &str, env: &dyn Fn(&str) -> Option<String>) -> Result<String, String> {
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(pos) = rest.find('$') {
        out.push_str(&rest[..pos]);
        let after = &rest[pos + 1..];
        if let Some(tail) = after.strip_prefix('$') {
            out.push('$');
            rest = tail;
        } else if let Some(body) = after.strip_prefix('{') {
            let end = body
                .find('}')
                .ok_or_else(|| format!("unterminated ${{...}} in {s:?}"))?;
            let expr = &body[..end];
            let (name, default) = match expr.split_once(":-") {
                Some((n, d)) => (n, Some(d)),
                None => (expr, None),
            };
            if name.is_empty() || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
                return Err(format!("bad variable name {name:?} in {s:?}"));
            }
            match (env(name).filter(|v| !v.is_empty() || default.is_none()), default) {
                (Some(v), _) => out.push_str(&v),
                (None, Some(d)) => out.push_str(d),
                (None, None) => {
                    return Err(format!(
                        "environment variable {name} is not set (use ${{{name}:-default}} for a default)"
                    ))
                }
            }
            rest = &body[end + 1..];
        } else {
            out.push('$');
            rest = after;
        }
    }
    out.push_str(rest);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(k: &str) -> Option<String> {
        match k {
            "A" => Some("alpha".into()),
            "EMPTY" => Some(String::new()),
            _ => None,
        }
    }

    #[test]
    fn expands() {
        assert_eq!(expand("x${A}y", &env).as_deref(), Ok("xalphay"));
        assert_eq!(expand("${B:-dflt}", &env).as_deref(), Ok("dflt"));
        assert_eq!(expand("${EMPTY:-d}", &env).as_deref(), Ok("d"));
        assert_eq!(expand("${EMPTY}", &env).as_deref(), Ok(""));
        assert_eq!(expand("${B:-}", &env).as_deref(), Ok(""));
        assert_eq!(expand("$$A $5", &env).as_deref(), Ok("$A $5"));
        assert!(expand("${B}", &env).unwrap_err().contains("B is not set"));
        assert!(expand("${A", &env).is_err());
    }

    #[test]
    fn names_the_path() {
        let mut v: Value = serde_json::json!({"routes": [{"x": 1}, {"ttl": "${NOPE}"}]});
        let err = interpolate(&mut v, &env).unwrap_err().to_string();
        assert!(err.contains("routes[1].ttl"), "{err}");
    }
}
