//! A small static-file HTTP/1.1 server on std threads: `ringfeed serve DIR`
//! for users, and the loopback server `ringfeed demo` streams from so that
//! the demo exercises the network path.
//!
//! It serves the files under one root with `GET` and `HEAD`, single byte
//! ranges (`206`, `416`), keep-alive and pipelining, and an `ETag` (inode,
//! modification time, size) that `If-Match` is compared with: a client
//! reading a file in several ranges gets `412` once the file changed, as
//! from nginx, instead of the new version's bytes. The decisions (request
//! head, target to path, range) are pure functions in `request.rs`; bodies
//! go out with `sendfile` (`body.rs`). The shell is one accept thread and
//! one thread per connection, at most `max_connections` of them (a client
//! over the limit gets `503` with `Retry-After`, which ringfeed's own
//! client retries as throttling). Dropping the [`Server`] stops the accept
//! thread, shuts every connection down and joins every thread.
//!
//! Robustness: the request head is bounded (`431` past the limit) and must
//! arrive within a time-out; malformed heads and requests with bodies get
//! `400` and the connection is closed (the stream can no longer be framed);
//! targets are percent-decoded before any `..` check; idle keep-alive
//! connections are closed after a time-out so they do not hold a slot.
//!
//! The files: `options.rs` (the tunables, the start-up error, the stats),
//! `server.rs` (the [`Server`], its accept loop and connection slots),
//! `connection.rs` (one connection: reading request heads and writing
//! responses), `request.rs` and `body.rs` as above. Only the server and
//! its options are public.
//!
//! Beside it, `metrics.rs`: the scrape endpoint (`/metrics` on loopback)
//! of a running loader or node engine.

mod body;
mod connection;
pub mod metrics;
mod options;
mod request;
mod server;

pub use options::{ServeError, ServeOptions, ServeStats};
pub use server::Server;
