//! A test CA and certificates it signs, made with openssl, for the TLS
//! tests (the daemon's listener, mutual TLS to plugins' origins, Redis).

use std::path::PathBuf;
use std::process::Command;

use crate::Scratch;

/// Runs openssl, failing the test with its error if it fails.
fn openssl(args: &[&str]) {
    let out = Command::new("openssl")
        .args(args)
        .output()
        .expect("openssl");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A test CA and a server certificate it signed for localhost and
/// 127.0.0.1, made with openssl. Returns the server's cert and key; the CA
/// is `ca.pem` in `dir`.
pub fn certificate(dir: &Scratch) -> (PathBuf, PathBuf) {
    let (ca_key, ca) = (
        dir.path("ca.key").display().to_string(),
        dir.path("ca.pem").display().to_string(),
    );
    let mut a = vec!["req", "-x509"];
    a.extend(EC_KEY);
    a.extend([
        "-days",
        "1",
        "-subj",
        "/CN=plimsoll test CA",
        "-keyout",
        &ca_key,
        "-out",
        &ca,
    ]);
    openssl(&a);
    signed_by_test_ca(
        dir,
        ["key.pem", "server.csr", "ext.cnf", "cert.pem"],
        "/CN=localhost",
        "subjectAltName=DNS:localhost,IP:127.0.0.1\nbasicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth\n",
    )
}

/// A client certificate signed by the CA `certificate` made in `dir` (call
/// that first), for mutual TLS. Returns the certificate and key files.
pub fn client_certificate(dir: &Scratch) -> (PathBuf, PathBuf) {
    signed_by_test_ca(
        dir,
        ["client.key", "client.csr", "client.cnf", "client.pem"],
        "/CN=plimsoll plugin",
        "basicConstraints=CA:FALSE\nextendedKeyUsage=clientAuth\n",
    )
}

/// A P-256 key, made unencrypted.
const EC_KEY: [&str; 5] = [
    "-newkey",
    "ec",
    "-pkeyopt",
    "ec_paramgen_curve:P-256",
    "-nodes",
];

/// A key and a certificate for `subject` with the extensions `ext`, signed
/// by the test CA in `dir`. `files` names the key, request, extension and
/// certificate files; returns the certificate and key.
fn signed_by_test_ca(
    dir: &Scratch,
    files: [&str; 4],
    subject: &str,
    ext_text: &str,
) -> (PathBuf, PathBuf) {
    let p = |n: &str| dir.path(n).display().to_string();
    let (key, csr, ext, cert) = (p(files[0]), p(files[1]), p(files[2]), p(files[3]));
    let mut a = vec!["req"];
    a.extend(EC_KEY);
    a.extend(["-subj", subject, "-keyout", &key, "-out", &csr]);
    openssl(&a);
    std::fs::write(&ext, ext_text).expect("ext");
    openssl(&[
        "x509",
        "-req",
        "-in",
        &csr,
        "-CA",
        &p("ca.pem"),
        "-CAkey",
        &p("ca.key"),
        "-CAcreateserial",
        "-days",
        "1",
        "-extfile",
        &ext,
        "-out",
        &cert,
    ]);
    (dir.path(files[3]), dir.path(files[0]))
}

pub fn test_ca(dir: &Scratch) -> reqwest::Certificate {
    reqwest::Certificate::from_pem(&std::fs::read(dir.path("ca.pem")).expect("ca")).expect("pem")
}
