//! A blocking client of the coordinator's API (for `mutirao submit`/`jobs`/…, and for agents:
//! register, heartbeat, append logs, download programs — verified before they are returned).

use crate::api::{
    HostView, JobView, Registered, SubmitRequest, Uploaded, JOB_STATE_HEADER, LOG_LENGTH_HEADER,
};
use crate::{Error, HostReport, Job, JobState, Result};
use std::io::Read;
use std::time::Duration;

/// Largest JSON answer read.
const MAX_ANSWER: u64 = 512 << 20;

/// A coordinator's address and the token to speak with.
pub struct Client {
    base: String,
    token: String,
    agent: ureq::Agent,
}

/// One read of a job's log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogRead {
    /// The bytes from the offset asked.
    pub data: Vec<u8>,
    /// The log's length when read.
    pub length: u64,
    /// The job's state when read.
    pub state: JobState,
}

fn remote(e: ureq::Error, what: &str) -> Error {
    match e {
        ureq::Error::Status(status, resp) => {
            let text = resp.into_string().unwrap_or_default();
            let message = serde_json::from_str::<serde_json::Value>(&text)
                .ok()
                .and_then(|v| v["error"].as_str().map(str::to_string))
                .unwrap_or(text);
            Error::Remote { status, message }
        }
        ureq::Error::Transport(t) => Error::Unreachable(format!(
            "{what}: cannot reach the coordinator: {t} (is `mutirao coordinator` running at that address? set MUTIRAO_COORD or --coord)"
        )),
    }
}

impl Client {
    /// The coordinator's address, as given.
    pub fn base(&self) -> &str {
        &self.base
    }

    /// A client of the coordinator at `base` (`http://127.0.0.1:7210`), using `token`.
    pub fn new(base: &str, token: &str) -> Result<Client> {
        let base = base.trim_end_matches('/').to_string();
        if !base.starts_with("http://") {
            return Err(Error::Invalid(format!(
                "coordinator address {base:?} must start with http:// (e.g. http://127.0.0.1:7210)"
            )));
        }
        if token.is_empty() {
            return Err(Error::Invalid(
                "no token: set MUTIRAO_COORD_TOKEN or pass --token".into(),
            ));
        }
        Ok(Client {
            base,
            token: token.to_string(),
            agent: ureq::AgentBuilder::new()
                .timeout_connect(Duration::from_secs(10))
                .timeout_read(Duration::from_secs(30 + crate::api::MAX_WAIT_MS / 1000))
                .build(),
        })
    }

    fn req(&self, method: &str, path: &str) -> ureq::Request {
        self.agent
            .request(method, &format!("{}{path}", self.base))
            .set("Authorization", &format!("Bearer {}", self.token))
    }

    fn json<T: serde::de::DeserializeOwned>(r: ureq::Response, what: &str) -> Result<T> {
        // Read whole, then parse: serde_json over a reader goes byte by byte (3× slower on
        // a 10⁴-job listing).
        let mut body = Vec::new();
        r.into_reader()
            .take(MAX_ANSWER + 1)
            .read_to_end(&mut body)
            .map_err(|e| Error::Unreachable(format!("{what}: {e}")))?;
        if body.len() as u64 > MAX_ANSWER {
            return Err(Error::Unreachable(format!(
                "{what}: the answer is larger than {MAX_ANSWER} bytes"
            )));
        }
        serde_json::from_slice(&body)
            .map_err(|e| Error::Unreachable(format!("{what}: malformed answer: {e}")))
    }

    /// Upload content to the repository; the coordinator checks the digest computed here.
    pub fn upload(&self, bytes: &[u8]) -> Result<Uploaded> {
        let digest = crate::repo::digest_of(bytes);
        let r = self
            .req("POST", "/blobs")
            .query("digest", &digest)
            .send_bytes(bytes)
            .map_err(|e| remote(e, "upload"))?;
        let u: Uploaded = Self::json(r, "upload")?;
        if u.digest != digest {
            return Err(Error::Tampered {
                expected: digest,
                actual: u.digest,
            });
        }
        Ok(u)
    }

    /// Download content by digest, verified against it (at most `max` bytes).
    pub fn download(&self, digest: &str, max: u64) -> Result<Vec<u8>> {
        crate::repo::check_digest(digest)?;
        let r = self
            .req("GET", &format!("/blobs/{digest}"))
            .call()
            .map_err(|e| remote(e, "download"))?;
        let mut bytes = Vec::new();
        r.into_reader()
            .take(max.saturating_add(1))
            .read_to_end(&mut bytes)
            .map_err(|e| Error::Unreachable(format!("download {digest}: {e}")))?;
        if bytes.len() as u64 > max {
            return Err(Error::TooLarge {
                size: bytes.len() as u64,
                max,
            });
        }
        crate::repo::verify(digest, &bytes)?;
        Ok(bytes)
    }

    /// Submit a job.
    pub fn submit(&self, s: &SubmitRequest) -> Result<Job> {
        let r = self
            .req("POST", "/jobs")
            .send_json(s)
            .map_err(|e| remote(e, "submit"))?;
        Self::json(r, "submit")
    }

    /// My jobs, newest first.
    pub fn jobs(&self) -> Result<Vec<Job>> {
        let r = self
            .req("GET", "/jobs")
            .call()
            .map_err(|e| remote(e, "jobs"))?;
        Self::json(r, "jobs")
    }

    /// My newest `limit` jobs, newest first.
    pub fn jobs_newest(&self, limit: u64) -> Result<Vec<Job>> {
        let r = self
            .req("GET", "/jobs")
            .query("limit", &limit.max(1).to_string())
            .call()
            .map_err(|e| remote(e, "jobs"))?;
        Self::json(r, "jobs")
    }

    /// One job and its journal.
    pub fn job(&self, id: i64) -> Result<JobView> {
        let r = self
            .req("GET", &format!("/jobs/{id}"))
            .call()
            .map_err(|e| remote(e, "job"))?;
        Self::json(r, "job")
    }

    /// Cancel a job.
    pub fn cancel(&self, id: i64) -> Result<Job> {
        let r = self
            .req("POST", &format!("/jobs/{id}/cancel"))
            .call()
            .map_err(|e| remote(e, "cancel"))?;
        Self::json(r, "cancel")
    }

    /// Read a job's log from `offset`, waiting up to `wait_ms` for output if there is none yet.
    pub fn read_log(&self, id: i64, offset: u64, wait_ms: u64) -> Result<LogRead> {
        let r = self
            .req("GET", &format!("/jobs/{id}/logs"))
            .query("offset", &offset.to_string())
            .query("wait_ms", &wait_ms.to_string())
            .call()
            .map_err(|e| remote(e, "logs"))?;
        let length = r
            .header(LOG_LENGTH_HEADER)
            .and_then(|v| v.parse().ok())
            .ok_or_else(|| Error::Unreachable(format!("logs: no {LOG_LENGTH_HEADER} header")))?;
        let state = r
            .header(JOB_STATE_HEADER)
            .and_then(JobState::parse)
            .ok_or_else(|| Error::Unreachable(format!("logs: no {JOB_STATE_HEADER} header")))?;
        let mut data = Vec::new();
        r.into_reader()
            .take(crate::api::MAX_LOG_READ as u64 + 1)
            .read_to_end(&mut data)
            .map_err(|e| Error::Unreachable(format!("logs: {e}")))?;
        Ok(LogRead {
            data,
            length,
            state,
        })
    }

    /// Append output to a job's log (agents).
    pub fn append_log(&self, id: i64, data: &[u8]) -> Result<u64> {
        let r = self
            .req("POST", &format!("/jobs/{id}/logs"))
            .send_bytes(data)
            .map_err(|e| remote(e, "append log"))?;
        let v: serde_json::Value = Self::json(r, "append log")?;
        v["length"]
            .as_u64()
            .ok_or_else(|| Error::Unreachable("append log: no length in the answer".into()))
    }

    /// Register this agent's host (agents).
    pub fn register(&self, r: &HostReport) -> Result<Registered> {
        let a = self
            .req("POST", "/agents/register")
            .send_json(r)
            .map_err(|e| remote(e, "register"))?;
        Self::json(a, "register")
    }

    /// Heartbeat with a resource report (agents).
    pub fn heartbeat(&self, r: &HostReport) -> Result<Registered> {
        let a = self
            .req("POST", "/agents/heartbeat")
            .send_json(r)
            .map_err(|e| remote(e, "heartbeat"))?;
        Self::json(a, "heartbeat")
    }

    /// The hosts known.
    pub fn hosts(&self) -> Result<Vec<HostView>> {
        let r = self
            .req("GET", "/hosts")
            .call()
            .map_err(|e| remote(e, "hosts"))?;
        Self::json(r, "hosts")
    }
}
