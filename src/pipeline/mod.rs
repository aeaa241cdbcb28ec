//! The read pipeline for requests that match a cache route (SPEC §5).
//! PLACEHOLDER body: `serve` forwards until the stages land.

use crate::config::{Config, Route};
use crate::metrics::Metrics;
use crate::proxy::body::Body;
use crate::proxy::client::UpstreamClient;
use crate::store::{GuardedStore, StoreError};
use http::{Request, Response};
use hyper::body::Incoming;
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;

/// Why an invalidation request was refused.
#[derive(Debug, thiserror::Error)]
pub enum InvalidateError {
    #[error("unknown route {0:?}")]
    UnknownRoute(String),
    #[error("param {0:?} is missing or fails its pattern")]
    BadParam(String),
    #[error(transparent)]
    Store(#[from] StoreError),
}

pub struct Pipeline {
    store: Arc<GuardedStore>,
    client: UpstreamClient,
    metrics: Metrics,
}

impl Pipeline {
    pub fn new(store: Arc<GuardedStore>, client: UpstreamClient, metrics: Metrics, _cfg: &Config) -> Pipeline {
        Pipeline { store, client, metrics }
    }

    /// Applies limits from a reloaded config (fill permits).
    pub fn reconfigure(&self, _cfg: &Config) {}

    pub fn store(&self) -> &Arc<GuardedStore> {
        &self.store
    }

    /// Serves a cache read. `params` are the raw path param values in
    /// template order, already validated against their patterns.
    pub async fn serve(
        &self,
        cfg: Arc<Config>,
        _route: Arc<Route>,
        _params: Vec<String>,
        req: Request<Incoming>,
        peer: SocketAddr,
    ) -> Response<Body> {
        crate::proxy::forward::forward(&self.client, req, peer, cfg.upstream.timeout, &self.metrics).await
    }

    /// Replaces the generation of one object (every variant goes stale).
    pub async fn invalidate(
        &self,
        _cfg: &Config,
        _route: &str,
        _params: &BTreeMap<String, String>,
    ) -> Result<(), InvalidateError> {
        todo!()
    }
}
