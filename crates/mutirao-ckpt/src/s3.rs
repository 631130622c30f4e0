//! [`S3Store`]: a [`BlobStore`] on S3-compatible object storage through the `object_store` crate.
//!
//! `object_store` is async; an `S3Store` owns a small current-thread tokio runtime and blocks on
//! it, so its API stays synchronous. It must not be called from inside another tokio runtime
//! (it answers such a call with an error instead of blocking that runtime).

use crate::{check_key, BlobStore, StoreError};
use futures_util::StreamExt;
use object_store::aws::{AmazonS3, AmazonS3Builder};
use object_store::path::Path as ObjPath;
use object_store::{ObjectStore, ObjectStoreExt, PutPayload};
use std::future::Future;

/// Where and how to reach an S3-compatible bucket.
#[derive(Clone, Default)]
pub struct S3Config {
    /// The service's URL, e.g. `http://127.0.0.1:9000` for a local server; `None` = AWS itself.
    pub endpoint: Option<String>,
    /// The bucket, which must exist.
    pub bucket: String,
    /// The region, e.g. `us-east-1`.
    pub region: String,
    /// Static credentials; `None` leaves credentials to `object_store`'s defaults
    /// (instance metadata and the like).
    pub access_key_id: Option<String>,
    pub secret_access_key: Option<String>,
    pub session_token: Option<String>,
    /// Allow plain `http://` endpoints (a local test server); never needed for AWS itself.
    pub allow_http: bool,
    /// Prepended to every key (e.g. `mutirao/`), so one bucket can hold other things too.
    pub prefix: String,
}

impl std::fmt::Debug for S3Config {
    // Credentials are not printed.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("S3Config")
            .field("endpoint", &self.endpoint)
            .field("bucket", &self.bucket)
            .field("region", &self.region)
            .field("access_key_id", &self.access_key_id)
            .field("allow_http", &self.allow_http)
            .field("prefix", &self.prefix)
            .finish_non_exhaustive()
    }
}

impl S3Config {
    /// A configuration for `bucket` from the usual AWS variables: `AWS_ENDPOINT_URL` (or
    /// `AWS_ENDPOINT`), `AWS_REGION` (or `AWS_DEFAULT_REGION`, else `us-east-1`),
    /// `AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`, `AWS_SESSION_TOKEN`, and `AWS_ALLOW_HTTP`
    /// (`true`/`1`).
    pub fn from_env(bucket: &str) -> S3Config {
        Self::from_vars(bucket, |k| std::env::var(k).ok().filter(|v| !v.is_empty()))
    }

    /// As [`S3Config::from_env`], reading variables through `var` (testable without touching the
    /// process environment).
    pub fn from_vars(bucket: &str, var: impl Fn(&str) -> Option<String>) -> S3Config {
        S3Config {
            endpoint: var("AWS_ENDPOINT_URL").or_else(|| var("AWS_ENDPOINT")),
            bucket: bucket.to_string(),
            region: var("AWS_REGION")
                .or_else(|| var("AWS_DEFAULT_REGION"))
                .unwrap_or_else(|| "us-east-1".to_string()),
            access_key_id: var("AWS_ACCESS_KEY_ID"),
            secret_access_key: var("AWS_SECRET_ACCESS_KEY"),
            session_token: var("AWS_SESSION_TOKEN"),
            allow_http: var("AWS_ALLOW_HTTP")
                .map(|v| matches!(v.to_ascii_lowercase().as_str(), "1" | "true" | "yes"))
                .unwrap_or(false),
            prefix: String::new(),
        }
    }
}

/// Blobs in an S3 bucket. Keys are checked with [`check_key`]; a put is one S3 PUT (atomic).
pub struct S3Store {
    store: AmazonS3,
    rt: tokio::runtime::Runtime,
    name: String,
    prefix: String,
}

impl S3Store {
    /// Connects lazily (no request is made here): builds the client and its runtime.
    pub fn new(cfg: &S3Config) -> Result<S3Store, StoreError> {
        let name = format!("s3://{}", cfg.bucket);
        let bad = |detail: String| StoreError::Backend {
            store: name.clone(),
            op: "open",
            key: String::new(),
            detail,
        };
        if cfg.bucket.is_empty() {
            return Err(bad("no bucket given; name an existing bucket".into()));
        }
        let prefix = cfg.prefix.trim_matches('/').to_string();
        if !prefix.is_empty() {
            check_key(&prefix)?;
        }
        let mut b = AmazonS3Builder::new()
            .with_bucket_name(&cfg.bucket)
            .with_region(&cfg.region)
            .with_allow_http(cfg.allow_http);
        if let Some(e) = &cfg.endpoint {
            b = b.with_endpoint(e);
        }
        if let Some(k) = &cfg.access_key_id {
            b = b.with_access_key_id(k);
        }
        if let Some(k) = &cfg.secret_access_key {
            b = b.with_secret_access_key(k);
        }
        if let Some(t) = &cfg.session_token {
            b = b.with_token(t);
        }
        let store = b.build().map_err(|e| {
            bad(format!(
                "{e}; check the endpoint, region, bucket and credentials"
            ))
        })?;
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| bad(format!("cannot start the I/O runtime: {e}")))?;
        Ok(S3Store {
            store,
            rt,
            name,
            prefix,
        })
    }

    fn path(&self, key: &str) -> ObjPath {
        if self.prefix.is_empty() {
            ObjPath::from(key)
        } else {
            ObjPath::from(format!("{}/{key}", self.prefix))
        }
    }

    fn err(&self, op: &'static str, key: &str, e: impl std::fmt::Display) -> StoreError {
        StoreError::Backend {
            store: self.name.clone(),
            op,
            key: key.to_string(),
            detail: format!("{e}; check the service is reachable and the credentials allow {op}"),
        }
    }

    fn block<F: Future>(&self, op: &'static str, key: &str, f: F) -> Result<F::Output, StoreError> {
        if tokio::runtime::Handle::try_current().is_ok() {
            return Err(StoreError::Backend {
                store: self.name.clone(),
                op,
                key: key.to_string(),
                detail: "called from inside an async runtime; call S3Store from a plain thread \
                         (e.g. tokio::task::spawn_blocking)"
                    .into(),
            });
        }
        Ok(self.rt.block_on(f))
    }
}

impl BlobStore for S3Store {
    fn put(&self, key: &str, bytes: &[u8]) -> Result<(), StoreError> {
        check_key(key)?;
        let p = self.path(key);
        let payload = PutPayload::from(bytes.to_vec());
        self.block("put", key, self.store.put(&p, payload))?
            .map(|_| ())
            .map_err(|e| self.err("put", key, e))
    }

    fn get(&self, key: &str) -> Result<Option<Vec<u8>>, StoreError> {
        check_key(key)?;
        let p = self.path(key);
        self.block("get", key, async {
            match self.store.get(&p).await {
                Ok(r) => r.bytes().await.map(|b| Some(b.to_vec())),
                Err(object_store::Error::NotFound { .. }) => Ok(None),
                Err(e) => Err(e),
            }
        })?
        .map_err(|e| self.err("get", key, e))
    }

    fn delete(&self, key: &str) -> Result<(), StoreError> {
        check_key(key)?;
        let p = self.path(key);
        match self.block("delete", key, self.store.delete(&p))? {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(e) => Err(self.err("delete", key, e)),
        }
    }

    fn list(&self, prefix: &str) -> Result<Vec<String>, StoreError> {
        // object_store lists by whole path segments: list the directory part of the prefix,
        // then keep the keys that start with the whole prefix string.
        let dir = match prefix.rfind('/') {
            Some(i) => &prefix[..i],
            None => "",
        };
        let full_dir = match (self.prefix.is_empty(), dir.is_empty()) {
            (true, _) => dir.to_string(),
            (false, true) => self.prefix.clone(),
            (false, false) => format!("{}/{dir}", self.prefix),
        };
        let strip = if self.prefix.is_empty() {
            String::new()
        } else {
            format!("{}/", self.prefix)
        };
        let metas = self.block("list", prefix, async {
            let p = ObjPath::from(full_dir.as_str());
            let mut s = self
                .store
                .list(if full_dir.is_empty() { None } else { Some(&p) });
            let mut out = Vec::new();
            while let Some(m) = s.next().await {
                out.push(m?.location.to_string());
            }
            Ok::<_, object_store::Error>(out)
        })?;
        let mut keys: Vec<String> = metas
            .map_err(|e| self.err("list", prefix, e))?
            .into_iter()
            .filter_map(|k| k.strip_prefix(strip.as_str()).map(str::to_string))
            .filter(|k| k.starts_with(prefix))
            .collect();
        keys.sort();
        Ok(keys)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    #[test]
    fn config_from_aws_variables() {
        let vars: HashMap<&str, &str> = [
            ("AWS_ENDPOINT_URL", "http://127.0.0.1:9"),
            ("AWS_DEFAULT_REGION", "eu-west-1"),
            ("AWS_ACCESS_KEY_ID", "ak"),
            ("AWS_SECRET_ACCESS_KEY", "sk"),
            ("AWS_ALLOW_HTTP", "true"),
        ]
        .into_iter()
        .collect();
        let c = S3Config::from_vars("b", |k| vars.get(k).map(|v| v.to_string()));
        assert_eq!(c.endpoint.as_deref(), Some("http://127.0.0.1:9"));
        assert_eq!(c.region, "eu-west-1");
        assert_eq!(c.access_key_id.as_deref(), Some("ak"));
        assert!(c.allow_http);
        assert!(c.session_token.is_none());
        assert!(!format!("{c:?}").contains("sk"), "secret printed");
        let d = S3Config::from_vars("b", |_| None);
        assert_eq!(d.region, "us-east-1");
        assert!(!d.allow_http);
        assert!(S3Store::new(&S3Config::default()).is_err());
    }
}
