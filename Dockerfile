# syntax=docker/dockerfile:1
#
# sidecache container image: a release build on the Rust image, copied into
# a slim Debian runtime that runs as a non-root user.
#
#   docker build -t sidecache .
#   docker run --rm -v "$PWD/my.yaml:/etc/sidecache/sidecache.yaml:ro" \
#       -p 8080:8080 sidecache
#
# The image ships config/sidecache.yaml (the commented reference) as its
# default config; mount your own over /etc/sidecache/sidecache.yaml. The
# HEALTHCHECK calls the admin listener on 127.0.0.1:9090 from inside the
# container, so keep `admin.listen` on port 9090 (127.0.0.1 or 0.0.0.0).
#
# The same build also produces the example upstream service
# (examples/upstream.rs) as a separate target, used by examples/compose.yaml:
#
#   docker build --target upstream -t sidecache-example-upstream .
#
# The default (last) stage is sidecache; it does not contain the example.

FROM rust:1-bookworm AS build
WORKDIR /src
COPY . .
# Cache mounts keep the registry and target dir between builds (BuildKit);
# the binary is copied out of the cached target dir in the same step.
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked --bin sidecache --example upstream \
    && install -D -m 0755 target/release/sidecache /out/sidecache \
    && install -D -m 0755 target/release/examples/upstream /out/upstream

# The runtime base shared by both images.
FROM debian:bookworm-slim AS runtime
# ca-certificates for rediss:// and TLS to Postgres; curl only for HEALTHCHECK.
RUN apt-get update \
    && apt-get install -y --no-install-recommends ca-certificates curl \
    && rm -rf /var/lib/apt/lists/* \
    && groupadd --system --gid 10001 sidecache \
    && useradd --system --uid 10001 --gid 10001 --no-create-home \
        --home-dir /nonexistent --shell /usr/sbin/nologin sidecache

# The example upstream (`--target upstream`). In-memory unless DATABASE_URL
# is set; then Postgres with an outbox row per change.
FROM runtime AS upstream
COPY --from=build /out/upstream /usr/local/bin/upstream
USER 10001:10001
EXPOSE 8000
HEALTHCHECK --interval=10s --timeout=3s --start-period=5s --retries=3 \
    CMD ["curl", "-fsS", "-o", "/dev/null", "http://127.0.0.1:8000/healthz"]
ENTRYPOINT ["upstream"]
CMD ["--listen", "0.0.0.0:8000"]

# sidecache (the default target).
FROM runtime AS sidecache
COPY --from=build /out/sidecache /usr/local/bin/sidecache
COPY config/sidecache.yaml /etc/sidecache/sidecache.yaml
USER 10001:10001
ENV SIDECACHE_LOG=info
EXPOSE 8080 9090
HEALTHCHECK --interval=10s --timeout=3s --start-period=5s --retries=3 \
    CMD ["curl", "-fsS", "-o", "/dev/null", "http://127.0.0.1:9090/healthz"]
ENTRYPOINT ["sidecache"]
CMD ["run", "--config", "/etc/sidecache/sidecache.yaml"]
