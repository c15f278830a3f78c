//! Throwaway certificate authorities for the servers that speak TLS.
//!
//! `openssl` makes a CA and a server certificate signed by it, in a
//! directory the caller owns (the server's temp dir). Nothing is trusted
//! outside the test: the CA lives two days and its key stays in that
//! directory.

use std::path::{Path, PathBuf};
use std::process::Command;

use super::process::{find_binary, run_client};
use super::HarnessError;

/// A CA and one server certificate it signed, as PEM files.
#[derive(Debug, Clone)]
pub struct TestCerts {
    /// The CA certificate a client trusts.
    pub ca: PathBuf,
    /// The server's certificate.
    pub cert: PathBuf,
    /// The server's private key (mode 0600).
    pub key: PathBuf,
}

/// Makes `ca.crt`, `server.crt` and `server.key` in `dir`. `sans` is the
/// server certificate's subjectAltName list, e.g. `"IP:127.0.0.1,DNS:localhost"`.
pub fn make_certs(dir: &Path, sans: &str) -> Result<TestCerts, HarnessError> {
    let openssl = find_binary("openssl", &[], "apt-get install openssl")?;
    let run = |args: &[&str]| {
        let mut c = Command::new(&openssl);
        c.current_dir(dir).args(args);
        run_client(c).map_err(|e| HarnessError::start("openssl", e))
    };
    make_ca(&run, "ca")?;
    run(&[
        "req",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        "server.key",
        "-out",
        "server.csr",
        "-subj",
        "/CN=distlock-test-server",
    ])?;
    std::fs::write(dir.join("ext.cnf"), format!("subjectAltName={sans}\n"))
        .map_err(|e| HarnessError::start("openssl", e.to_string()))?;
    run(&[
        "x509",
        "-req",
        "-in",
        "server.csr",
        "-CA",
        "ca.crt",
        "-CAkey",
        "ca.key",
        "-CAcreateserial",
        "-out",
        "server.crt",
        "-days",
        "2",
        "-extfile",
        "ext.cnf",
    ])?;
    let key = dir.join("server.key");
    set_private(&key)?;
    Ok(TestCerts {
        ca: dir.join("ca.crt"),
        cert: dir.join("server.crt"),
        key,
    })
}

/// Makes `other-ca.crt` in `dir`: a CA that signed nothing the servers
/// present, for the "wrong CA" cases.
pub fn make_unrelated_ca(dir: &Path) -> Result<PathBuf, HarnessError> {
    let openssl = find_binary("openssl", &[], "apt-get install openssl")?;
    let run = |args: &[&str]| {
        let mut c = Command::new(&openssl);
        c.current_dir(dir).args(args);
        run_client(c).map_err(|e| HarnessError::start("openssl", e))
    };
    make_ca(&run, "other-ca")?;
    Ok(dir.join("other-ca.crt"))
}

fn make_ca(
    run: &dyn Fn(&[&str]) -> Result<String, HarnessError>,
    stem: &str,
) -> Result<(), HarnessError> {
    let (key, crt) = (format!("{stem}.key"), format!("{stem}.crt"));
    run(&[
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        &key,
        "-out",
        &crt,
        "-days",
        "2",
        "-subj",
        &format!("/CN=distlock-test-{stem}"),
    ])
    .map(drop)
}

fn set_private(path: &Path) -> Result<(), HarnessError> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))
        .map_err(|e| HarnessError::start("openssl", e.to_string()))
}
