//! `Fs`: the s3s-fs backend behind S3's answers where s3s-fs differs
//! (listed at the top of `s3/mod.rs`), with the injected faults, the
//! request counts and the open uploads of `State`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::Ordering;

use s3s::dto::{
    AbortMultipartUploadInput, AbortMultipartUploadOutput, ChecksumAlgorithm, ChecksumType,
    CompleteMultipartUploadInput, CompleteMultipartUploadOutput, CreateMultipartUploadInput,
    CreateMultipartUploadOutput, DeleteObjectInput, DeleteObjectOutput, GetObjectInput,
    GetObjectOutput, HeadObjectInput, HeadObjectOutput, ListObjectsV2Input, ListObjectsV2Output,
    PutObjectInput, PutObjectOutput, StreamingBlob, UploadPartInput, UploadPartOutput,
};
use s3s::{S3Request, S3Response, S3Result, s3_error};

use super::checksum::{
    Algorithm, sent_checksums, set_checksum, single, type_mismatch, verify_body,
};
use super::multipart::{check_parts, object_checksum};
use super::{Completion, DropAnswer, OTHER_WRITER_BYTES, Op, OpenUpload, PartRecord, State};

/// A PutObject or UploadPart body is held in memory to be verified before
/// s3s-fs stores it: up to this many bytes, more than the tests and the
/// benchmarks send in one request, few enough that a runaway client cannot
/// take the machine's memory (S3 allows 5 GiB, beyond any use here).
const MAX_BODY: usize = 1 << 30;

/// Reads a request body whole (at most `MAX_BODY` bytes); it is then
/// `body.bytes()`, and goes on to s3s-fs as `StreamingBlob::from(body)`.
async fn read_body(
    body: Option<StreamingBlob>,
    content_length: Option<i64>,
) -> S3Result<s3s::Body> {
    let body = body.ok_or_else(|| s3_error!(IncompleteBody))?;
    if content_length.is_some_and(|n| n > MAX_BODY as i64) {
        return Err(s3_error!(EntityTooLarge));
    }
    let mut body = s3s::Body::from(body);
    body.store_all_limited(MAX_BODY)
        .await
        .map_err(|e| s3_error!(IncompleteBody, "reading the body: {e}"))?;
    Ok(body)
}

/// The `x-amz-checksum-*` values of a PutObject or UploadPart request,
/// by algorithm, those in the trailers of an aws-chunked body (read whole
/// before this) counted as headers.
macro_rules! sent_with_trailers {
    ($req:ident) => {{
        let trailers = $req.trailing_headers.take().and_then(|t| t.take());
        let i = &mut $req.input;
        let fields = [
            ("x-amz-checksum-crc32", &mut i.checksum_crc32),
            ("x-amz-checksum-crc32c", &mut i.checksum_crc32c),
            ("x-amz-checksum-crc64nvme", &mut i.checksum_crc64nvme),
            ("x-amz-checksum-sha1", &mut i.checksum_sha1),
            ("x-amz-checksum-sha256", &mut i.checksum_sha256),
        ];
        for (name, field) in fields {
            if let Some(v) = trailers.as_ref().and_then(|t| t.get(name)) {
                let v = v.to_str().map_err(|_| s3_error!(InvalidArgument))?;
                *field = Some(v.to_string());
            }
        }
        sent_checksums!(i)
    }};
}

/// The s3s-fs backend with S3's answers where s3s-fs differs (see the top
/// of `s3/mod.rs`), injected faults and counters.
pub(super) struct Fs {
    pub(super) inner: s3s_fs::FileSystem,
    pub(super) root: PathBuf,
    pub(super) state: Arc<State>,
}

impl Fs {
    /// Counts the request and answers an injected fault, if one is set.
    fn enter(&self, op: Op, part_number: Option<i32>) -> S3Result<()> {
        self.state.count(op);
        match self.state.fault(op, part_number) {
            Some((e, _)) => Err(e),
            None => Ok(()),
        }
    }

    fn bucket_exists(&self, bucket: &str) -> S3Result<()> {
        if self.root.join(bucket).is_dir() {
            Ok(())
        } else {
            Err(s3_error!(NoSuchBucket))
        }
    }

    /// Removes what s3s-fs keeps of `upload_id`'s parts not in the
    /// completed object (S3 frees them when the upload completes).
    fn free_parts(&self, upload_id: &str) {
        let prefix = format!(".upload_id-{upload_id}.part-");
        for name in dir_names(&self.root) {
            if name.starts_with(&prefix) {
                let _ = std::fs::remove_file(self.root.join(name));
            }
        }
    }
}

impl Fs {
    /// Puts `OTHER_WRITER_BYTES` at the key of `req`, as another writer
    /// whose object lands there first.
    async fn other_writer(&self, req: &S3Request<CompleteMultipartUploadInput>) -> S3Result<()> {
        let (bucket, key) = (req.input.bucket.clone(), req.input.key.clone());
        let input = PutObjectInput {
            body: Some(StreamingBlob::from(s3s::Body::from(
                OTHER_WRITER_BYTES.to_vec(),
            ))),
            content_length: Some(OTHER_WRITER_BYTES.len() as i64),
            bucket: bucket.clone(),
            key: key.clone(),
            ..Default::default()
        };
        let put = S3Request {
            input,
            method: hyper::Method::PUT,
            uri: req.uri.clone(),
            headers: Default::default(),
            extensions: Default::default(),
            credentials: req.credentials.clone(),
            region: req.region.clone(),
            service: req.service.clone(),
            trailing_headers: None,
        };
        let lock = self.state.key_lock(&bucket, &key);
        let _held = lock.lock().await;
        s3s::S3::put_object(&self.inner, put).await.map(drop)
    }
}

fn checksum_type(full_object: bool) -> ChecksumType {
    ChecksumType::from_static(if full_object {
        ChecksumType::FULL_OBJECT
    } else {
        ChecksumType::COMPOSITE
    })
}

/// Names of the entries of `dir` (none if it cannot be read).
pub(super) fn dir_names(dir: &Path) -> Vec<String> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    entries
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .collect()
}

#[async_trait::async_trait]
impl s3s::S3 for Fs {
    async fn get_object(
        &self,
        req: S3Request<GetObjectInput>,
    ) -> S3Result<S3Response<GetObjectOutput>> {
        self.enter(Op::GetObject, None)?;
        self.state.denied(&req.input.bucket, &req.input.key)?;
        self.bucket_exists(&req.input.bucket)?;
        let (bucket, key) = (req.input.bucket.clone(), req.input.key.clone());
        let condition = req.input.if_match.clone();
        // The condition is checked against the answer s3s-fs made (its
        // ETag and its open file go together), so no rewrite falls between.
        let answer = self.inner.get_object(req).await?;
        let etag = answer.output.e_tag.clone();
        let ignore = self.state.ignore_if_match.load(Ordering::SeqCst);
        if let Some(c) = condition
            && !ignore
        {
            use s3s::dto::{ETag, ETagCondition};
            // RFC 9110 §13.1.1: strong comparison; a weak tag never matches.
            let holds = match (&c, &etag) {
                (ETagCondition::Any, Some(_)) => true,
                (ETagCondition::ETag(ETag::Strong(want)), Some(ETag::Strong(have))) => want == have,
                _ => false,
            };
            if !holds {
                self.state
                    .precondition_failed
                    .fetch_add(1, Ordering::SeqCst);
                return Err(s3_error!(PreconditionFailed));
            }
        }
        let tag = etag.map(|t| t.value().to_string()).unwrap_or_default();
        self.state.served(&self.root, &bucket, &key, tag);
        Ok(answer)
    }

    async fn head_object(
        &self,
        req: S3Request<HeadObjectInput>,
    ) -> S3Result<S3Response<HeadObjectOutput>> {
        self.enter(Op::HeadObject, None)?;
        self.state.denied(&req.input.bucket, &req.input.key)?;
        self.inner.head_object(req).await
    }

    async fn list_objects_v2(
        &self,
        req: S3Request<ListObjectsV2Input>,
    ) -> S3Result<S3Response<ListObjectsV2Output>> {
        self.enter(Op::ListObjectsV2, None)?;
        let prefix = req.input.prefix.clone().unwrap_or_default();
        self.state.denied(&req.input.bucket, &prefix)?;
        let bucket = req.input.bucket.clone();
        let mut resp = self.inner.list_objects_v2(req).await?;
        // s3s-fs lists no ETags; S3 lists each object's, the one its GET
        // answers with (what a client may pin its reads to).
        for o in resp.output.contents.iter_mut().flatten() {
            if o.e_tag.is_none()
                && let Some(key) = &o.key
            {
                o.e_tag = self
                    .state
                    .listed_etag(&self.root, &bucket, key)
                    .map(s3s::dto::ETag::Strong);
            }
        }
        Ok(resp)
    }

    async fn put_object(
        &self,
        mut req: S3Request<PutObjectInput>,
    ) -> S3Result<S3Response<PutObjectOutput>> {
        self.state.count(Op::PutObject);
        // The body is read before any answer, so that a client still
        // sending it gets the answer rather than a reset.
        let input = &mut req.input;
        let body = read_body(input.body.take(), input.content_length).await?;
        if let Some((e, _)) = self.state.fault(Op::PutObject, None) {
            return Err(e);
        }
        self.bucket_exists(&input.bucket)?;
        self.state.denied(&input.bucket, &input.key)?;
        let sent = sent_with_trailers!(req);
        let input = &mut req.input;
        let data = body.bytes().unwrap_or_default();
        verify_body(&data, input.content_md5.as_deref(), single(&sent)?)?;
        input.body = Some(StreamingBlob::from(body));
        let lock = self.state.key_lock(&input.bucket, &input.key);
        let _held = lock.lock().await;
        self.inner.put_object(req).await
    }

    async fn delete_object(
        &self,
        req: S3Request<DeleteObjectInput>,
    ) -> S3Result<S3Response<DeleteObjectOutput>> {
        self.enter(Op::DeleteObject, None)?;
        let lock = self.state.key_lock(&req.input.bucket, &req.input.key);
        let _held = lock.lock().await;
        self.inner.delete_object(req).await
    }

    async fn create_multipart_upload(
        &self,
        req: S3Request<CreateMultipartUploadInput>,
    ) -> S3Result<S3Response<CreateMultipartUploadOutput>> {
        self.enter(Op::CreateMultipartUpload, None)?;
        let input = &req.input;
        self.bucket_exists(&input.bucket)?;
        self.state.denied(&input.bucket, &input.key)?;
        let algorithm = match &input.checksum_algorithm {
            Some(a) => Some(Algorithm::parse(a.as_str())?),
            None => None,
        };
        let full_object = match (input.checksum_type.as_ref().map(|t| t.as_str()), algorithm) {
            (None, a) => a == Some(Algorithm::Crc64Nvme),
            (Some(_), None) => {
                return Err(s3_error!(
                    InvalidRequest,
                    "The x-amz-checksum-type header can only be used with the x-amz-checksum-algorithm header."
                ));
            }
            (Some(ChecksumType::FULL_OBJECT), Some(a)) => {
                if !matches!(
                    a,
                    Algorithm::Crc32 | Algorithm::Crc32c | Algorithm::Crc64Nvme
                ) {
                    return Err(s3_error!(
                        InvalidRequest,
                        "The FULL_OBJECT checksum type cannot be used with the {} checksum algorithm.",
                        a.name()
                    ));
                }
                true
            }
            (Some(ChecksumType::COMPOSITE), Some(a)) => {
                if a == Algorithm::Crc64Nvme {
                    return Err(s3_error!(
                        InvalidRequest,
                        "The COMPOSITE checksum type cannot be used with the crc64nvme checksum algorithm."
                    ));
                }
                false
            }
            (Some(t), _) => {
                return Err(s3_error!(
                    InvalidRequest,
                    "Value for x-amz-checksum-type header is invalid: {t}"
                ));
            }
        };
        let (bucket, key) = (input.bucket.clone(), input.key.clone());
        let mut resp = self.inner.create_multipart_upload(req).await?;
        let out = &mut resp.output;
        let upload_id = out
            .upload_id
            .clone()
            .ok_or_else(|| s3_error!(InternalError))?;
        if let Some(a) = algorithm {
            out.checksum_algorithm = Some(ChecksumAlgorithm::from_static(a.header_name()));
            out.checksum_type = Some(checksum_type(full_object));
        }
        self.state.uploads.lock().unwrap().insert(
            upload_id,
            OpenUpload {
                bucket,
                key,
                algorithm,
                full_object,
                parts: BTreeMap::new(),
            },
        );
        Ok(resp)
    }

    async fn upload_part(
        &self,
        mut req: S3Request<UploadPartInput>,
    ) -> S3Result<S3Response<UploadPartOutput>> {
        self.state.count(Op::UploadPart);
        let input = &mut req.input;
        let body = read_body(input.body.take(), input.content_length).await?;
        if let Some((e, _)) = self.state.fault(Op::UploadPart, Some(input.part_number)) {
            return Err(e);
        }
        let hold = self.state.hold_parts.lock().unwrap().clone();
        if let Some(file) = hold.filter(|f| f.exists()) {
            self.state.parts_held.fetch_add(1, Ordering::Relaxed);
            eprintln!(
                "s3_server: holding UploadPart {} of {}/{}",
                input.part_number, input.bucket, input.key
            );
            // Polled: a test releases the parts by removing the file, from
            // another process; 10 ms is nothing beside a part's transfer.
            while file.exists() {
                tokio::time::sleep(std::time::Duration::from_millis(10)).await;
            }
            self.state.parts_held.fetch_sub(1, Ordering::Relaxed);
        }
        if !(1..=10_000).contains(&input.part_number) {
            return Err(s3_error!(
                InvalidArgument,
                "Part number must be an integer between 1 and 10000, inclusive"
            ));
        }
        let upload = self
            .state
            .open_upload(&input.upload_id, &input.bucket, &input.key)?;
        let sent = sent_with_trailers!(req);
        let input = &mut req.input;
        let checksum = single(&sent)?;
        // A part carries the upload's algorithm and no other; without one,
        // S3 computes it for a FULL_OBJECT upload and refuses the part of a
        // COMPOSITE one.
        match (upload.algorithm, checksum.map(|c| c.0)) {
            (want, Some(got)) if want != Some(got) => return Err(type_mismatch(want, Some(got))),
            (Some(want), None) if !upload.full_object => {
                return Err(type_mismatch(Some(want), None));
            }
            _ => {}
        }
        let data = body.bytes().unwrap_or_default();
        let crcs = verify_body(&data, input.content_md5.as_deref(), checksum)?;
        let part_checksum = upload.algorithm.map(|a| a.checksum(&data, &crcs));
        let (upload_id, part_number) = (input.upload_id.clone(), input.part_number);
        input.body = Some(StreamingBlob::from(body));
        let mut resp = self.inner.upload_part(req).await?;
        let out = &mut resp.output;
        set_checksum!(out, upload.algorithm, part_checksum.clone());
        let e_tag = out.e_tag.as_ref().map(|e| e.value().to_string());
        let record = PartRecord {
            e_tag: e_tag.ok_or_else(|| s3_error!(InternalError))?,
            size: data.len() as u64,
            crcs,
            checksum: part_checksum,
        };
        if let Some(u) = self.state.uploads.lock().unwrap().get_mut(&upload_id) {
            u.parts.insert(part_number, record);
        }
        Ok(resp)
    }

    async fn complete_multipart_upload(
        &self,
        req: S3Request<CompleteMultipartUploadInput>,
    ) -> S3Result<S3Response<CompleteMultipartUploadOutput>> {
        self.state.count(Op::CompleteMultipartUpload);
        if let Some((e, in_body)) = self.state.fault(Op::CompleteMultipartUpload, None) {
            if !in_body {
                return Err(e);
            }
            return Ok(S3Response::new(CompleteMultipartUploadOutput {
                future: Some(Box::pin(async move { Err(e) })),
                ..Default::default()
            }));
        }
        let input = &req.input;
        let mode = self.state.completion();
        if mode == Some(Completion::Hold) {
            self.state.held.fetch_add(1, Ordering::Relaxed);
            eprintln!(
                "s3_server: holding CompleteMultipartUpload of {}/{}",
                input.bucket, input.key
            );
            return std::future::pending().await;
        }
        let completed = self
            .state
            .completed
            .lock()
            .unwrap()
            .contains(&input.upload_id);
        if completed && input.if_none_match.is_some() {
            // A retry of a completion that succeeded: the object it made
            // is there, so the condition fails, as in S3.
            return Err(s3_error!(PreconditionFailed, "Object already exists"));
        }
        let upload = self
            .state
            .open_upload(&input.upload_id, &input.bucket, &input.key)?;
        if mode == Some(Completion::OtherWriterFirst) {
            self.other_writer(&req).await?;
            let mut resp = S3Response::new(CompleteMultipartUploadOutput::default());
            resp.extensions.insert(DropAnswer);
            return Ok(resp);
        }
        let parts = check_parts(input, &upload)?;
        let checksum = object_checksum(&upload, &parts);
        let sent = sent_checksums!(input);
        if let Some((a, v)) = single(&sent)? {
            if upload.algorithm != Some(*a) {
                return Err(type_mismatch(upload.algorithm, Some(*a)));
            }
            // A COMPOSITE value may come with or without its `-N`.
            let matches = checksum.as_ref().is_some_and(|c| {
                c == v || (!upload.full_object && c.split('-').next() == Some(v.as_str()))
            });
            if !matches {
                return Err(s3_error!(
                    BadDigest,
                    "The {} you specified did not match the calculated checksum.",
                    a.header_name()
                ));
            }
        }
        let upload_id = input.upload_id.clone();
        let lock = self.state.key_lock(&input.bucket, &input.key);
        let held = lock.lock().await;
        let result = self.inner.complete_multipart_upload(req).await;
        drop(held);
        // A precondition that failed leaves the upload open, as in S3;
        // s3s-fs deletes its upload record once past the checks.
        let upload_record = self.root.join(format!(".upload-{upload_id}.json"));
        if result.is_ok() || !upload_record.exists() {
            self.state.uploads.lock().unwrap().remove(&upload_id);
            self.free_parts(&upload_id);
        }
        if result.is_ok() {
            self.state
                .completed
                .lock()
                .unwrap()
                .insert(upload_id.clone());
        }
        let mut resp = result?;
        let (algorithm, full_object) = (upload.algorithm, upload.full_object);
        if let Some(future) = resp.output.future.take() {
            resp.output.future = Some(Box::pin(async move {
                let mut out = future.await?;
                set_checksum!(out, algorithm, checksum);
                if algorithm.is_some() {
                    out.checksum_type = Some(checksum_type(full_object));
                }
                Ok(out)
            }));
        }
        if mode == Some(Completion::LoseAnswer) {
            resp.extensions.insert(DropAnswer);
        }
        Ok(resp)
    }

    async fn abort_multipart_upload(
        &self,
        req: S3Request<AbortMultipartUploadInput>,
    ) -> S3Result<S3Response<AbortMultipartUploadOutput>> {
        self.enter(Op::AbortMultipartUpload, None)?;
        let input = &req.input;
        self.state
            .open_upload(&input.upload_id, &input.bucket, &input.key)?;
        let upload_id = input.upload_id.clone();
        let resp = self.inner.abort_multipart_upload(req).await?;
        self.state.uploads.lock().unwrap().remove(&upload_id);
        Ok(resp)
    }
}
