//! A workload's object storage, configured as MLPerf Storage's `object` mode configures
//! DLIO (RULES.md §6): `storage.storage_type: s3` (or `object` with `protocol: s3`),
//! `storage.storage_root` = bucket[/prefix], `storage.storage_library`, and
//! `storage.storage_options` (endpoint_url, region, secure, access/secret keys). The same
//! keys under `reader:` are read too (MLPerf's test_unet3d_*_s3.yaml put them there).
//!
//! The endpoint is the file's `storage_options.endpoint_url` when it gives one (mlpstorage
//! sets it from the environment only when the user has not), else the first set of
//! S3_ENDPOINT_URIS (its first entry), S3_ENDPOINT_TEMPLATE, S3_ENDPOINT_FILE (the file's
//! first line), AWS_ENDPOINT_URL, S3_ENDPOINT; credentials come from
//! AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY unless the file gives non-empty keys.

use crate::object::s3_client::{Endpoint, Tls};
use anyhow::{bail, Result};
use serde_yaml::Value;
use std::sync::Arc;

/// The client libraries of MLPerf's object mode, each replayed as it issues requests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Library {
    S3dlio,
    Minio,
    S3TorchConnector,
}

/// How a library reads a sample and writes an object.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pattern {
    /// 0: one GetObject of the whole object per sample; else ranged GETs of this size.
    pub get_part: u64,
    /// Ranged GETs of one sample in flight at once (per reader).
    pub get_parallel: usize,
    /// Objects above this go up as a multipart upload.
    pub multipart_threshold: u64,
    pub put_part: u64,
    /// Parts of one upload in flight at once.
    pub put_parallel: usize,
}

const MIB: u64 = 1 << 20;

impl Library {
    pub fn parse(name: &str) -> Option<Library> {
        match name.to_ascii_lowercase().as_str() {
            "s3dlio" => Some(Library::S3dlio),
            "minio" => Some(Library::Minio),
            "s3torchconnector" | "s3-torch-connector" => Some(Library::S3TorchConnector),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Library::S3dlio => "s3dlio",
            Library::Minio => "minio",
            Library::S3TorchConnector => "s3torchconnector",
        }
    }

    /// Each library's defaults (docs/object-storage.md):
    /// - s3dlio: `get` fetches the whole object in one request (its parallel range
    ///   download is opt-in); uploads above 32 MiB go multipart in 16 MiB parts;
    /// - minio (minio-py): `get_object` streams the whole object; `put_object` of a known
    ///   length goes multipart above its 5 MiB minimum part, 3 parts in parallel;
    /// - s3torchconnector: the CRT client splits every GET and PUT into 8 MiB parts
    ///   (S3ClientConfig.part_size) and runs the parts of one object at once over its
    ///   pool, which is sized for 10 Gb/s; 16 at most here.
    pub fn pattern(self) -> Pattern {
        match self {
            Library::S3dlio => Pattern {
                get_part: 0,
                get_parallel: 1,
                multipart_threshold: 32 * MIB,
                put_part: 16 * MIB,
                put_parallel: 1,
            },
            Library::Minio => Pattern {
                get_part: 0,
                get_parallel: 1,
                multipart_threshold: 5 * MIB,
                put_part: 5 * MIB,
                put_parallel: 3,
            },
            Library::S3TorchConnector => Pattern {
                get_part: 8 * MIB,
                get_parallel: 16,
                multipart_threshold: 8 * MIB,
                put_part: 8 * MIB,
                put_parallel: 16,
            },
        }
    }
}

/// The object storage a workload names, before the environment is read.
#[derive(Debug, Clone, PartialEq)]
pub struct ObjectStore {
    pub bucket: String,
    /// Key prefix inside the bucket: storage_root's path and dataset.data_folder, joined
    /// by `/`, without leading or trailing `/` (empty: the bucket's top).
    pub prefix: String,
    pub library: Library,
    pub endpoint_url: Option<String>,
    pub region: Option<String>,
    /// `storage_options.secure: false`: plain HTTP even on an https:// endpoint.
    pub insecure: bool,
    pub access_key: Option<String>,
    pub secret_key: Option<String>,
}

fn text(v: Option<&Value>) -> Option<String> {
    match v? {
        Value::String(s) => Some(s.trim().to_string()).filter(|s| !s.is_empty()),
        Value::Number(n) => Some(n.to_string()),
        Value::Bool(b) => Some(b.to_string()),
        _ => None,
    }
}

/// Joins key parts with `/`, dropping empty parts and `.`.
pub fn join_key(parts: &[&str]) -> String {
    parts.iter().flat_map(|p| p.split('/')).filter(|s| !s.is_empty() && *s != ".").collect::<Vec<_>>().join("/")
}

impl ObjectStore {
    /// The workload's object storage, None for local files. Refuses what trainio cannot
    /// replay (another protocol, an unknown library, a root without a bucket).
    pub fn from_root(root: &Value) -> Result<Option<ObjectStore>> {
        let storage = root.get("storage").filter(|v| v.is_mapping());
        let reader = root.get("reader").filter(|v| v.is_mapping());
        let key = |k: &str| storage.and_then(|s| s.get(k)).or_else(|| reader.and_then(|r| r.get(k)));
        let folder = text(root.get("dataset").and_then(|d| d.get("data_folder")));
        let kind = text(key("storage_type"));
        let section = if storage.and_then(|s| s.get("storage_type")).is_some() { "storage" } else { "reader" };
        match kind.as_deref().map(str::to_ascii_lowercase).as_deref() {
            Some("local_fs") => return Ok(None),
            None => {
                if let Some(f) = folder.as_deref().filter(|f| f.contains("://")) {
                    bail!(
                        "dataset.data_folder: {f}: give object storage as MLPerf's object mode does (storage.storage_type: s3, storage.storage_root: BUCKET), or add --param storage.storage_type=local_fs to run on local files"
                    );
                }
                return Ok(None);
            }
            Some("s3") => {}
            Some("object") => {
                let protocol = text(key("protocol")).unwrap_or_else(|| "s3".into());
                if !protocol.eq_ignore_ascii_case("s3") {
                    bail!("{section}.protocol: {protocol}: trainio replays the s3 protocol only");
                }
            }
            Some(other) => bail!(
                "{section}.storage_type: {other}: trainio replays local files (local_fs) and S3 (s3, or object with protocol s3)"
            ),
        }
        let options = key("storage_options");
        let opt = |k: &str| text(options.and_then(|o| o.get(k)));
        let library_name =
            text(key("storage_library")).or_else(|| opt("storage_library")).unwrap_or_else(|| "s3dlio".into());
        let Some(library) = Library::parse(&library_name) else {
            bail!("{section}.storage_library: {library_name}: expected s3dlio, minio or s3torchconnector");
        };
        let Some(root_text) = text(key("storage_root")) else {
            bail!("{section}.storage_root: missing: give the bucket (and an optional prefix), e.g. storage_root: mlp-bucket");
        };
        let bare = root_text.split_once("://").map_or(root_text.as_str(), |(_, r)| r);
        let bare = bare.trim_matches('/');
        let (bucket, root_prefix) = bare.split_once('/').unwrap_or((bare, ""));
        let valid = (3..=63).contains(&bucket.len())
            && bucket.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.');
        if !valid {
            bail!(
                "{section}.storage_root: '{root_text}': '{bucket}' is not an S3 bucket name (3 to 63 lower-case letters, digits, '-' or '.')"
            );
        }
        let secure = options.and_then(|o| o.get("secure"));
        let insecure = matches!(secure, Some(Value::Bool(false)))
            || matches!(secure, Some(Value::String(s)) if s.eq_ignore_ascii_case("false"));
        // DLIO's dlio-main files give the folder as a URI of the same bucket
        // (data_folder: s3://BUCKET[/prefix]): the part after the bucket is the prefix.
        let folder = folder.unwrap_or_default();
        let folder = match folder.split_once("://") {
            Some((_, rest)) => match rest.trim_matches('/').split_once('/') {
                Some((b, p)) if b == bucket => p.to_string(),
                None if rest.trim_matches('/') == bucket => String::new(),
                _ => bail!("dataset.data_folder: {folder}: not in the bucket of {section}.storage_root ({bucket})"),
            },
            None => folder,
        };
        Ok(Some(ObjectStore {
            bucket: bucket.to_string(),
            prefix: join_key(&[root_prefix, &folder]),
            library,
            endpoint_url: opt("endpoint_url"),
            region: opt("region"),
            insecure,
            access_key: opt("access_key_id"),
            secret_key: opt("secret_access_key"),
        }))
    }

    /// The endpoint and credentials, from the file or the environment `env`.
    pub fn endpoint(&self, env: &dyn Fn(&str) -> Option<String>) -> Result<Endpoint> {
        let from_env = || -> Option<(String, &'static str)> {
            let get = |k: &str| env(k).map(|v| v.trim().to_string()).filter(|v| !v.is_empty());
            if let Some(v) = get("S3_ENDPOINT_URIS") {
                if let Some(first) = v.split(',').map(str::trim).find(|s| !s.is_empty()) {
                    return Some((first.to_string(), "S3_ENDPOINT_URIS"));
                }
            }
            if let Some(v) = get("S3_ENDPOINT_TEMPLATE") {
                return Some((v, "S3_ENDPOINT_TEMPLATE"));
            }
            if let Some(path) = get("S3_ENDPOINT_FILE") {
                let first =
                    std::fs::read_to_string(&path).ok()?.lines().map(str::trim).find(|l| !l.is_empty())?.to_string();
                return Some((first, "S3_ENDPOINT_FILE"));
            }
            for k in ["AWS_ENDPOINT_URL", "S3_ENDPOINT"] {
                if let Some(v) = get(k) {
                    return Some((v, if k == "S3_ENDPOINT" { "S3_ENDPOINT" } else { "AWS_ENDPOINT_URL" }));
                }
            }
            None
        };
        let (url, origin) = match &self.endpoint_url {
            Some(u) => (u.clone(), "storage.storage_options.endpoint_url"),
            None => from_env().ok_or_else(|| {
                anyhow::anyhow!(
                    "no S3 endpoint: set AWS_ENDPOINT_URL (or S3_ENDPOINT_URIS, S3_ENDPOINT) or storage.storage_options.endpoint_url"
                )
            })?,
        };
        let (scheme, rest) = url.split_once("://").unwrap_or(("http", url.as_str()));
        let scheme = scheme.to_ascii_lowercase();
        if scheme != "http" && scheme != "https" {
            bail!("{origin}: {url}: expected an http:// or https:// endpoint");
        }
        let tls = if scheme == "https" && !self.insecure { Some(tls_config(env)?) } else { None };
        let authority = rest.split('/').next().unwrap_or("");
        let (host, port) = match authority.rsplit_once(':') {
            Some((h, p)) => match p.parse::<u16>() {
                Ok(p) if p > 0 => (h.to_string(), p),
                _ => bail!("{origin}: {url}: '{p}' is not a port"),
            },
            None => (authority.to_string(), if tls.is_some() { 443 } else { 80 }),
        };
        if host.is_empty() {
            bail!("{origin}: {url}: no host");
        }
        let key = self.access_key.clone().or_else(|| env("AWS_ACCESS_KEY_ID").filter(|v| !v.is_empty()));
        let secret = self.secret_key.clone().or_else(|| env("AWS_SECRET_ACCESS_KEY").filter(|v| !v.is_empty()));
        let (Some(access_key), Some(secret_key)) = (key, secret) else {
            bail!("no S3 credentials: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY");
        };
        let region = self
            .region
            .clone()
            .or_else(|| env("AWS_REGION").filter(|v| !v.is_empty()))
            .unwrap_or_else(|| "us-east-1".into());
        Ok(Endpoint { url, host, port, region, access_key, secret_key, tls })
    }

    /// `s3://bucket/prefix` (for messages and the results).
    pub fn uri(&self) -> String {
        if self.prefix.is_empty() {
            format!("s3://{}", self.bucket)
        } else {
            format!("s3://{}/{}", self.bucket, self.prefix)
        }
    }

    /// Where checkpoints go: `checkpoint_folder` as a full s3:// URI names its own bucket
    /// (MLPerf's llama3_8b_checkpoint_minio.yaml); otherwise it is a prefix under the
    /// storage root. Returns (bucket, prefix).
    pub fn checkpoint_location(&self, folder: &str) -> (String, String) {
        match folder.strip_prefix("s3://") {
            Some(rest) => {
                let (b, p) = rest.trim_matches('/').split_once('/').unwrap_or((rest.trim_matches('/'), ""));
                (b.to_string(), join_key(&[p]))
            }
            None => {
                let root_prefix = self.prefix.clone();
                (self.bucket.clone(), join_key(&[&root_prefix, folder]))
            }
        }
    }
}

/// TLS settings for an https endpoint: the certificates of `AWS_CA_BUNDLE` (a PEM file,
/// as the AWS SDKs and boto3 read it) or else the system's roots (`SSL_CERT_FILE`, or
/// Debian's /etc/ssl/certs/ca-certificates.crt). A bundle that cannot be read or holds no
/// certificate is an error naming it.
fn tls_config(env: &dyn Fn(&str) -> Option<String>) -> Result<Tls> {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::CertificateDer;
    let (path, origin) = match env("AWS_CA_BUNDLE").filter(|v| !v.trim().is_empty()) {
        Some(p) => (p, "AWS_CA_BUNDLE"),
        None => match env("SSL_CERT_FILE").filter(|v| !v.trim().is_empty()) {
            Some(p) => (p, "SSL_CERT_FILE"),
            None => ("/etc/ssl/certs/ca-certificates.crt".to_string(), "the system's CA bundle"),
        },
    };
    let bad = |why: String| anyhow::anyhow!("{origin}={path}: {why}");
    let certs: Vec<CertificateDer> = CertificateDer::pem_file_iter(&path)
        .map_err(|e| bad(format!("{e:?}")))?
        .collect::<std::result::Result<_, _>>()
        .map_err(|e| bad(format!("not a PEM certificate bundle ({e:?})")))?;
    let mut roots = rustls::RootCertStore::empty();
    let (added, _) = roots.add_parsable_certificates(certs);
    if added == 0 {
        bail!(bad("no CA certificate in it".into()));
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| bad(format!("{e}")))?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(Tls(Arc::new(config)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn store(yaml: &str) -> Result<Option<ObjectStore>> {
        ObjectStore::from_root(&serde_yaml::from_str(yaml).unwrap())
    }

    #[test]
    fn mlperf_layouts_are_read() {
        let s = store("dataset: {data_folder: test-run/unet3d}\nstorage: {storage_type: s3, storage_root: mlp-minio, storage_library: minio, storage_options: {endpoint_url: 'https://10.0.0.1:9000', secure: false}}\n").unwrap().unwrap();
        assert_eq!((s.bucket.as_str(), s.prefix.as_str(), s.library), ("mlp-minio", "test-run/unet3d", Library::Minio));
        assert!(s.insecure);
        let t = store("dataset: {data_folder: .}\nreader: {storage_type: object, protocol: s3, storage_library: s3dlio, storage_root: pr1-test-bucket/unet3d, storage_options: {access_key_id: '', endpoint_url: ''}}\n").unwrap().unwrap();
        assert_eq!((t.bucket.as_str(), t.prefix.as_str(), t.library), ("pr1-test-bucket", "unet3d", Library::S3dlio));
        assert_eq!(t.endpoint_url, None, "an empty endpoint is no endpoint");
        assert!(store("dataset: {data_folder: x}\n").unwrap().is_none());
        let uri = store("dataset: {data_folder: 's3://bkt/run'}\nstorage: {storage_type: s3, storage_root: bkt}\n")
            .unwrap()
            .unwrap();
        assert_eq!(uri.prefix, "run", "a folder given as a URI of the same bucket");
        assert!(
            store("dataset: {data_folder: 's3://other'}\nstorage: {storage_type: s3, storage_root: bkt}\n").is_err()
        );
        assert!(store("dataset: {data_folder: 's3://bkt'}\nstorage: {storage_type: local_fs}\n").unwrap().is_none());
    }

    #[test]
    fn bad_sections_are_named() {
        let e = store("storage: {storage_type: s3, storage_root: B}\n").unwrap_err().to_string();
        assert!(e.contains("storage.storage_root") && e.contains("bucket name"), "{e}");
        let e =
            store("storage: {storage_type: s3, storage_root: abc, storage_library: boto}\n").unwrap_err().to_string();
        assert!(e.contains("storage.storage_library: boto"), "{e}");
        let e = store("storage: {storage_type: gcs}\n").unwrap_err().to_string();
        assert!(e.contains("storage.storage_type: gcs"), "{e}");
        let e = store("storage: {storage_type: s3}\n").unwrap_err().to_string();
        assert!(e.contains("storage_root: missing"), "{e}");
    }

    #[test]
    fn endpoint_comes_from_the_file_then_the_environment_in_mlperf_order() {
        let s = store("storage: {storage_type: s3, storage_root: bkt}\n").unwrap().unwrap();
        let env = |pairs: &'static [(&'static str, &'static str)]| {
            move |k: &str| pairs.iter().find(|(n, _)| *n == k).map(|(_, v)| v.to_string())
        };
        let creds: &[(&str, &str)] = &[("AWS_ACCESS_KEY_ID", "a"), ("AWS_SECRET_ACCESS_KEY", "b")];
        let e = s.endpoint(&env(creds)).unwrap_err().to_string();
        assert!(e.contains("no S3 endpoint") && e.contains("AWS_ENDPOINT_URL"), "{e}");
        let all: &[(&str, &str)] = &[
            ("AWS_ACCESS_KEY_ID", "a"),
            ("AWS_SECRET_ACCESS_KEY", "b"),
            ("AWS_ENDPOINT_URL", "http://aws:1"),
            ("S3_ENDPOINT_URIS", "http://first:9000, http://second:9000"),
        ];
        let ep = s.endpoint(&env(all)).unwrap();
        assert_eq!((ep.host.as_str(), ep.port, ep.region.as_str()), ("first", 9000, "us-east-1"));
        let aws: &[(&str, &str)] =
            &[("AWS_ACCESS_KEY_ID", "a"), ("AWS_SECRET_ACCESS_KEY", "b"), ("AWS_ENDPOINT_URL", "http://aws:1")];
        assert_eq!(s.endpoint(&env(aws)).unwrap().host, "aws");
        let no_secret: &[(&str, &str)] = &[("AWS_ACCESS_KEY_ID", "a"), ("AWS_ENDPOINT_URL", "http://aws:1")];
        assert!(s.endpoint(&env(no_secret)).unwrap_err().to_string().contains("AWS_SECRET_ACCESS_KEY"));
        let tls: &[(&str, &str)] =
            &[("AWS_ACCESS_KEY_ID", "a"), ("AWS_SECRET_ACCESS_KEY", "b"), ("AWS_ENDPOINT_URL", "https://aws")];
        let ep = s.endpoint(&env(tls)).unwrap();
        assert!(ep.tls.is_some() && ep.port == 443, "https: TLS with the system's roots, port 443");
        const CREDS: [(&str, &str); 3] =
            [("AWS_ACCESS_KEY_ID", "a"), ("AWS_SECRET_ACCESS_KEY", "b"), ("AWS_ENDPOINT_URL", "https://aws")];
        const MISSING: [(&str, &str); 4] = [CREDS[0], CREDS[1], CREDS[2], ("AWS_CA_BUNDLE", "/nonexistent/ca.pem")];
        let e = s.endpoint(&env(&MISSING)).unwrap_err().to_string();
        assert!(e.starts_with("AWS_CA_BUNDLE=/nonexistent/ca.pem: ") && !e.contains('\n'), "{e}");
        const NOT_PEM: [(&str, &str); 4] = [CREDS[0], CREDS[1], CREDS[2], ("AWS_CA_BUNDLE", "/etc/hostname")];
        let e = s.endpoint(&env(&NOT_PEM)).unwrap_err().to_string();
        assert!(e.contains("AWS_CA_BUNDLE=/etc/hostname: no CA certificate"), "{e}");
    }

    #[test]
    fn checkpoint_folders_name_their_bucket_or_sit_under_the_root() {
        let s = store("storage: {storage_type: s3, storage_root: bkt/run1}\n").unwrap().unwrap();
        assert_eq!(s.checkpoint_location("s3://ck/minio/llama3-8b"), ("ck".into(), "minio/llama3-8b".into()));
        assert_eq!(s.checkpoint_location("checkpoints/unet3d"), ("bkt".into(), "run1/checkpoints/unet3d".into()));
    }
}
