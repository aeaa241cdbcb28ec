//! The one body type that flows through sidecache: a boxed stream of
//! `Bytes`, so hits (`Full`), streamed upstream bodies (`Incoming`) and
//! short error texts share one response type.

use bytes::Bytes;
use http_body_util::{combinators::BoxBody, BodyExt, Empty, Full};

pub(crate) type BoxError = Box<dyn std::error::Error + Send + Sync>;
pub(crate) type Body = BoxBody<Bytes, BoxError>;

pub(crate) fn full(bytes: impl Into<Bytes>) -> Body {
    Full::new(bytes.into())
        .map_err(|never| match never {})
        .boxed()
}

pub(crate) fn empty() -> Body {
    Empty::new().map_err(|never| match never {}).boxed()
}

/// Boxes any body whose error converts into [`BoxError`] (e.g. `Incoming`).
pub(crate) fn boxed<B>(body: B) -> Body
where
    B: http_body::Body<Data = Bytes> + Send + Sync + 'static,
    B::Error: Into<BoxError>,
{
    body.map_err(Into::into).boxed()
}
