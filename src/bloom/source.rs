//! Where a build reads the members of one scope: the [`IdSource`] trait
//! (a stream of ids, so a large catalogue is never held in memory) and its
//! Postgres implementation, [`PgSource`], which runs the route's `source`
//! SQL with the scope value as `$1`.

use futures_util::stream::{self, BoxStream, StreamExt};
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use tokio_postgres::types::Type;

pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;
pub type IdStream = BoxStream<'static, Result<String, SourceError>>;

#[derive(Debug, Clone, thiserror::Error)]
pub enum SourceError {
    #[error("no membership source configured (bloom needs invalidation.outbox.url)")]
    NotConfigured,
    #[error("membership source: {0}")]
    Query(String),
}

/// The members of one scope value.
pub trait IdSource: Send + Sync + 'static {
    /// Streams the ids `sql` returns for `scope` (bound as `$1`, text).
    fn ids<'a>(
        &'a self,
        sql: &'a str,
        scope: &'a str,
    ) -> BoxFuture<'a, Result<IdStream, SourceError>>;
}

/// Postgres: one connection per build (builds are minutes apart), the
/// query streamed row by row (`query_raw`), so memory stays flat.
///
/// `$1` is declared `text`; a query on a non-text column casts it
/// (`WHERE tenant_id = $1::bigint`). The first column is the id; `text`,
/// `int8`, `int4` and `int2` columns are accepted (ids are compared as
/// their decimal text, like the path param they are checked against).
pub struct PgSource {
    /// A `postgres://` URL or key=value string; may hold a password, never logged.
    conninfo: String,
}

impl PgSource {
    pub fn new(conninfo: impl Into<String>) -> Arc<PgSource> {
        Arc::new(PgSource {
            conninfo: conninfo.into(),
        })
    }
}

fn query_error(e: tokio_postgres::Error) -> SourceError {
    SourceError::Query(e.to_string())
}

fn id_text(row: &tokio_postgres::Row) -> Result<String, SourceError> {
    let Some(column) = row.columns().first() else {
        return Err(SourceError::Query("source query returns no column".into()));
    };
    let ty = column.type_().clone();
    let text = if ty == Type::INT8 {
        row.try_get::<_, Option<i64>>(0)
            .map(|v| v.map(|n| n.to_string()))
    } else if ty == Type::INT4 {
        row.try_get::<_, Option<i32>>(0)
            .map(|v| v.map(|n| n.to_string()))
    } else if ty == Type::INT2 {
        row.try_get::<_, Option<i16>>(0)
            .map(|v| v.map(|n| n.to_string()))
    } else {
        row.try_get::<_, Option<String>>(0)
    };
    match text {
        Ok(Some(id)) => Ok(id),
        Ok(None) => Err(SourceError::Query("source query returned a NULL id".into())),
        Err(e) => Err(SourceError::Query(format!(
            "source column type {ty} is not text or an integer: {e}"
        ))),
    }
}

impl IdSource for PgSource {
    fn ids<'a>(
        &'a self,
        sql: &'a str,
        scope: &'a str,
    ) -> BoxFuture<'a, Result<IdStream, SourceError>> {
        Box::pin(async move {
            let connect_error = |e: crate::pg::PgError| SourceError::Query(e.to_string());
            let connector = crate::pg::PgConnector::parse(&self.conninfo).map_err(connect_error)?;
            let (client, connection) = connector.connect().await.map_err(connect_error)?;
            tokio::spawn(async move {
                if let Err(e) = connection.await {
                    tracing::debug!(error = %e, "bloom source connection ended");
                }
            });
            // `$1` is always declared (a query without it simply ignores it),
            // so one binding works for scoped and unscoped filters.
            let statement = client
                .prepare_typed(sql, &[Type::TEXT])
                .await
                .map_err(query_error)?;
            let rows = client
                .query_raw(&statement, [scope])
                .await
                .map_err(query_error)?;
            // The client moves into the stream: dropping it early would end
            // the connection under the rows still in flight.
            let rows = Box::pin(rows);
            let ids = stream::unfold((client, rows), |(client, mut rows)| async move {
                let next = rows.next().await?;
                let item = next.map_err(query_error).and_then(|row| id_text(&row));
                Some((item, (client, rows)))
            });
            Ok(ids.boxed())
        })
    }
}

/// A fixed or test-controlled catalogue, per scope value.
#[derive(Default)]
pub struct StaticSource {
    scopes: std::sync::Mutex<std::collections::HashMap<String, Vec<String>>>,
}

impl StaticSource {
    pub fn new() -> Arc<StaticSource> {
        Arc::new(StaticSource::default())
    }

    /// Replaces the members of `scope`.
    pub fn set(&self, scope: &str, ids: Vec<String>) {
        self.scopes
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(scope.to_owned(), ids);
    }

    /// Adds one member to `scope`.
    pub fn push(&self, scope: &str, id: &str) {
        self.scopes
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(scope.to_owned())
            .or_default()
            .push(id.to_owned());
    }
}

impl IdSource for StaticSource {
    fn ids<'a>(
        &'a self,
        _sql: &'a str,
        scope: &'a str,
    ) -> BoxFuture<'a, Result<IdStream, SourceError>> {
        // A snapshot, like a query's: members pushed later are not seen.
        let ids = self
            .scopes
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(scope)
            .cloned()
            .unwrap_or_default();
        Box::pin(async move { Ok(stream::iter(ids.into_iter().map(Ok)).boxed()) })
    }
}
