//! `admin`: the admin listener's address and who may reach it.

use super::{addr, err, Result};
use crate::config::file::FileConfig;
use crate::config::AdminConfig;
use std::net::SocketAddr;

/// `admin`; `listen` is the client listener's address, which it must not share.
pub(super) fn admin(raw: &FileConfig, listen: SocketAddr) -> Result<AdminConfig> {
    let admin = AdminConfig {
        listen: addr("admin.listen", &raw.admin.listen)?,
        token: raw.admin.token.clone().filter(|t| !t.is_empty()),
    };
    if admin.listen == listen {
        return err("admin.listen", "must differ from listen");
    }
    // Whoever reaches /admin/* can invalidate everything and start builds.
    if !admin.listen.ip().is_loopback() && admin.token.is_none() && !raw.admin.allow_unauthenticated
    {
        return err(
            "admin.token",
            format!(
                "admin.listen {} is not a loopback address and no token is set: anyone who reaches it \
                 could invalidate the cache; set admin.token, or admin.allow_unauthenticated: true \
                 if only trusted peers can reach that port",
                admin.listen
            ),
        );
    }
    Ok(admin)
}

#[cfg(test)]
mod tests {
    use crate::config::testing::{APP, BASE};
    use crate::config::Config;

    #[test]
    fn admin_on_a_public_address_needs_a_token_or_an_explicit_opt_out() {
        let public = BASE.replace(
            "admin: { listen: 127.0.0.1:9090 }",
            "admin: { listen: 0.0.0.0:9090 }",
        );
        let e = Config::parse(&format!("{public}{APP}"), &|_| None)
            .map(|_| ())
            .expect_err("public admin without a token");
        assert!(e.to_string().contains("admin.token"), "{e}");
        for admin in [
            "admin: { listen: 0.0.0.0:9090, token: t }",
            "admin: { listen: 0.0.0.0:9090, allow_unauthenticated: true }",
            "admin: { listen: \"[::1]:9090\" }",
        ] {
            let yaml = BASE.replace("admin: { listen: 127.0.0.1:9090 }", admin);
            assert!(
                Config::parse(&format!("{yaml}{APP}"), &|_| None).is_ok(),
                "{admin}"
            );
        }
    }
}
