//! `server`: the runtime layout of the client listener.

use super::{err, Result};
use crate::config::file::FileConfig;
use crate::config::ServerConfig;

/// Most threads `server.workers` may ask for: far more than any machine a
/// sidecar gets, few enough that a typo cannot start thousands of threads.
const MAX_WORKERS: usize = 256;

pub(super) fn server(raw: &FileConfig) -> Result<ServerConfig> {
    let workers = match raw.server.workers {
        Some(n) if !(1..=MAX_WORKERS).contains(&n) => {
            return err(
                "server.workers",
                format!("must be between 1 and {MAX_WORKERS}"),
            )
        }
        n => n,
    };
    Ok(ServerConfig {
        runtime: raw.server.runtime,
        workers,
    })
}

#[cfg(test)]
mod tests {
    use crate::config::testing::{parse, APP};

    #[test]
    fn server_layout_is_typed_validated_and_restart_only() {
        use crate::config::RuntimeLayout;
        let default = parse(APP).expect("valid");
        assert_eq!(default.server.runtime, RuntimeLayout::MultiThread);
        assert_eq!(default.server.workers, None);
        let per_core = parse(&format!(
            "server:\n  runtime: per_core\n  workers: 3\n{APP}"
        ))
        .expect("valid");
        assert_eq!(per_core.server.runtime, RuntimeLayout::PerCore);
        assert_eq!(per_core.server.workers, Some(3));
        assert_eq!(default.restart_only_changes(&per_core), vec!["server"]);
        for (yaml, path) in [
            ("server:\n  workers: 0\n", "server.workers"),
            ("server:\n  workers: 257\n", "server.workers"),
            ("server:\n  runtime: threads\n", "server.runtime"),
            ("server:\n  cores: 2\n", "server"),
        ] {
            let e = parse(&format!("{yaml}{APP}")).expect_err(yaml);
            assert!(e.to_string().contains(path), "{yaml:?}: {e}");
        }
    }
}
