//! An S3-compatible server for the tests, on 127.0.0.1: s3s with SigV4
//! verification over the s3s-fs backend (each folder of the root a bucket),
//! on its own Tokio runtime.
//!
//! Included by the test crates through `tests/support/mod.rs`; it uses
//! nothing else of `support`.

#![allow(dead_code)]

use std::net::SocketAddr;
use std::path::Path;

pub const ACCESS_KEY: &str = "AKIARINGFEEDTEST";
pub const SECRET_KEY: &str = "ringfeed-test-secret-0123456789abcdef";

/// s3s-fs, except that GetObject on a missing bucket says NoSuchBucket, as
/// S3 does (s3s-fs 0.14 says NoSuchKey there; its HeadObject and
/// ListObjectsV2 already check the bucket).
struct Fs {
    inner: s3s_fs::FileSystem,
    root: std::path::PathBuf,
}

#[async_trait::async_trait]
impl s3s::S3 for Fs {
    async fn get_object(
        &self,
        req: s3s::S3Request<s3s::dto::GetObjectInput>,
    ) -> s3s::S3Result<s3s::S3Response<s3s::dto::GetObjectOutput>> {
        if !self.root.join(&req.input.bucket).is_dir() {
            return Err(s3s::s3_error!(NoSuchBucket));
        }
        self.inner.get_object(req).await
    }

    async fn head_object(
        &self,
        req: s3s::S3Request<s3s::dto::HeadObjectInput>,
    ) -> s3s::S3Result<s3s::S3Response<s3s::dto::HeadObjectOutput>> {
        self.inner.head_object(req).await
    }

    async fn list_objects_v2(
        &self,
        req: s3s::S3Request<s3s::dto::ListObjectsV2Input>,
    ) -> s3s::S3Result<s3s::S3Response<s3s::dto::ListObjectsV2Output>> {
        self.inner.list_objects_v2(req).await
    }
}

/// An s3s-fs server on 127.0.0.1 serving `root` (each folder a bucket),
/// on its own Tokio runtime thread; stops when dropped.
pub struct S3Server {
    pub addr: SocketAddr,
    _runtime: tokio::runtime::Runtime,
}

impl S3Server {
    pub fn start(root: &Path) -> S3Server {
        use hyper_util::rt::{TokioExecutor, TokioIo};
        use hyper_util::server::conn::auto::Builder as ConnBuilder;
        use s3s::auth::SimpleAuth;
        use s3s::service::S3ServiceBuilder;

        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let fs = Fs {
            inner: s3s_fs::FileSystem::new(root).unwrap(),
            root: root.to_path_buf(),
        };
        let mut b = S3ServiceBuilder::new(fs);
        b.set_auth(SimpleAuth::from_single(ACCESS_KEY, SECRET_KEY));
        let service = b.build();
        let listener = runtime
            .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
            .unwrap();
        let addr = listener.local_addr().unwrap();
        runtime.spawn(async move {
            let http = ConnBuilder::new(TokioExecutor::new());
            loop {
                let Ok((socket, _)) = listener.accept().await else {
                    continue;
                };
                let conn = http
                    .serve_connection(TokioIo::new(socket), service.clone())
                    .into_owned();
                tokio::spawn(async move {
                    let _ = conn.await;
                });
            }
        });
        S3Server {
            addr,
            _runtime: runtime,
        }
    }

    pub fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }
}
