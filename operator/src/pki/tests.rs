//! Unit tests for the CA: issuance, loading, CSR signing and inspection.

use super::*;
use rcgen::{CertificateParams, KeyPair};
use rsa::pkcs1::EncodeRsaPrivateKey;
use rsa::pkcs8::EncodePrivateKey;

fn ca() -> CertificateAuthority {
    CertificateAuthority::generate("test-ca", days(365)).unwrap()
}

fn key_body(pem: &str) -> String {
    pem.lines().nth(1).unwrap().to_owned()
}

fn csr(cn: &str, customise: impl FnOnce(&mut CertificateParams)) -> String {
    let mut params = CertificateParams::default();
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, cn);
    dn.push(
        DnType::OrganizationName,
        "system:open-cluster-management:addon",
    );
    params.distinguished_name = dn;
    customise(&mut params);
    let key = KeyPair::generate().unwrap();
    params.serialize_request(&key).unwrap().pem().unwrap()
}

#[test]
fn generated_ca_is_a_p256_ca_and_round_trips_through_pem() {
    let ca = ca();
    let info = ca.info();
    assert!(info.is_ca);
    assert_eq!(info.subject_cn.as_deref(), Some("test-ca"));
    assert_eq!(info.issuer_cn.as_deref(), Some("test-ca"));
    assert_eq!(info.public_key, "ECDSA 256");
    assert!(info.not_after > Utc::now() + chrono::Duration::days(364));
    assert!(info.not_before < Utc::now());

    let again = CertificateAuthority::from_pem(ca.cert_pem(), &ca.key_pem()).unwrap();
    let issued = again.issue_client("x", days(1)).unwrap();
    ca.verify_issued(&issued.cert_pem).unwrap();
}

#[test]
fn issued_server_cert_has_cn_sans_and_verifies_against_the_ca() {
    let ca = ca();
    let issued = ca
        .issue_server(
            PRINCIPAL_COMMON_NAME,
            &["localhost".into(), "principal.argocd.svc".into()],
            &["127.0.0.1".parse().unwrap(), "::1".parse().unwrap()],
            days(30),
        )
        .unwrap();
    ca.verify_issued(&issued.cert_pem).unwrap();
    let info = inspect(&issued.cert_pem).unwrap();
    assert_eq!(info.subject_cn.as_deref(), Some("argocd-agent-principal"));
    assert_eq!(info.issuer_cn.as_deref(), Some("test-ca"));
    assert_eq!(
        info.sans,
        [
            "DNS:localhost",
            "DNS:principal.argocd.svc",
            "IP:127.0.0.1",
            "IP:::1"
        ]
    );
    assert_eq!(info.extended_key_usages, ["serverAuth"]);
    assert!(!info.is_ca);
    assert_eq!(info.fingerprint_sha256.len(), 64);
}

#[test]
fn issued_client_cert_is_client_auth_only_and_foreign_certs_do_not_verify() {
    let ca = ca();
    let agent = AgentName::new("spoke1").unwrap();
    let issued = ca.issue_agent(&agent, days(30)).unwrap();
    let info = inspect(&issued.cert_pem).unwrap();
    assert_eq!(info.subject_cn.as_deref(), Some("spoke1"));
    assert!(info.sans.is_empty());
    assert_eq!(info.extended_key_usages, ["clientAuth"]);
    ca.verify_issued(&issued.cert_pem).unwrap();

    // Same subject name, different key: the signature check must catch it.
    let impostor = CertificateAuthority::generate("test-ca", days(1)).unwrap();
    let foreign = impostor.issue_agent(&agent, days(1)).unwrap();
    let err = ca.verify_issued(&foreign.cert_pem).unwrap_err();
    assert!(matches!(err, PkiError::NotIssuedByCa { .. }), "{err}");
}

#[test]
fn serials_are_unique() {
    let ca = ca();
    let a = inspect(&ca.issue_client("a", days(1)).unwrap().cert_pem).unwrap();
    let b = inspect(&ca.issue_client("a", days(1)).unwrap().cert_pem).unwrap();
    assert_ne!(a.serial, b.serial);
}

#[test]
fn from_pem_rejects_mismatched_key_and_non_ca_certificate() {
    let ca = ca();
    let other = CertificateAuthority::generate("other", days(1)).unwrap();
    let err = CertificateAuthority::from_pem(ca.cert_pem(), &other.key_pem()).unwrap_err();
    assert!(matches!(err, PkiError::KeyMismatch { .. }), "{err}");

    let leaf = ca.issue_client("leaf", days(1)).unwrap();
    let err = CertificateAuthority::from_pem(&leaf.cert_pem, &leaf.key_pem).unwrap_err();
    assert!(matches!(err, PkiError::NotCa { .. }), "{err}");

    let err = CertificateAuthority::from_pem("nothing", &ca.key_pem()).unwrap_err();
    assert!(matches!(err, PkiError::NoCertificate { .. }), "{err}");
    let err = CertificateAuthority::from_pem(ca.cert_pem(), "nothing").unwrap_err();
    assert!(matches!(err, PkiError::BadKey { .. }), "{err}");
    assert!(!err.to_string().contains(&key_body(&ca.key_pem())));
}

#[test]
fn rsa_ca_with_pkcs1_key_from_upstream_tooling_is_accepted() {
    let mut rng = rsa::rand_core::OsRng;
    let rsa_key = rsa::RsaPrivateKey::new(&mut rng, 2048).unwrap();
    let pkcs8 = rsa_key.to_pkcs8_pem(rsa::pkcs8::LineEnding::LF).unwrap();
    let pkcs1 = rsa_key.to_pkcs1_pem(rsa::pkcs8::LineEnding::LF).unwrap();
    assert!(pkcs1.starts_with("-----BEGIN RSA PRIVATE KEY-----"));
    let key = KeyPair::from_pem(&pkcs8).unwrap();
    let mut params = CertificateParams::default();
    params.distinguished_name = dn_with_cn("argocd-agent-ca").unwrap();
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    let cert = params.self_signed(&key).unwrap();

    let ca = CertificateAuthority::from_pem(&cert.pem(), &pkcs1).unwrap();
    assert_eq!(ca.info().public_key, "RSA 2048");
    let issued = ca.issue_client("spoke1", days(1)).unwrap();
    ca.verify_issued(&issued.cert_pem).unwrap();
}

#[test]
fn csr_for_the_expected_cn_is_signed_as_a_client_certificate() {
    let ca = ca();
    let request = csr("agent-spoke1", |p| {
        p.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        p.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    });
    let cert = ca.sign_csr(&request, "agent-spoke1", days(7)).unwrap();
    ca.verify_issued(&cert).unwrap();
    let info = inspect(&cert).unwrap();
    assert_eq!(info.subject, "CN=agent-spoke1");
    assert_eq!(info.extended_key_usages, ["clientAuth"]);

    // No EKU requested at all is fine too: the issued cert is still clientAuth only.
    let bare = csr("agent-spoke1", |_| {});
    let info = inspect(&ca.sign_csr(&bare, "agent-spoke1", days(7)).unwrap()).unwrap();
    assert_eq!(info.extended_key_usages, ["clientAuth"]);
}

#[test]
fn csr_with_a_different_cn_is_refused() {
    let ca = ca();
    let request = csr("someone-else", |_| {});
    let err = ca.sign_csr(&request, "agent-spoke1", days(7)).unwrap_err();
    assert!(matches!(err, PkiError::CsrRefused(_)), "{err}");
    assert!(err.to_string().contains("someone-else"), "{err}");
}

#[test]
fn csr_asking_for_more_than_client_auth_is_refused() {
    let ca = ca();
    let server = csr("agent-spoke1", |p| {
        p.extended_key_usages = vec![
            ExtendedKeyUsagePurpose::ClientAuth,
            ExtendedKeyUsagePurpose::ServerAuth,
        ]
    });
    let err = ca.sign_csr(&server, "agent-spoke1", days(7)).unwrap_err();
    assert!(err.to_string().contains("ServerAuth"), "{err}");

    let with_san = csr("agent-spoke1", |p| {
        p.subject_alt_names = vec![SanType::DnsName("evil.example".try_into().unwrap())]
    });
    assert!(matches!(
        ca.sign_csr(&with_san, "agent-spoke1", days(7)),
        Err(PkiError::CsrRefused(_))
    ));

    let wants_ca = csr("agent-spoke1", |p| {
        p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained)
    });
    assert!(matches!(
        ca.sign_csr(&wants_ca, "agent-spoke1", days(7)),
        Err(PkiError::CsrRefused(_))
    ));

    let signer = csr("agent-spoke1", |p| {
        p.key_usages = vec![KeyUsagePurpose::KeyCertSign]
    });
    assert!(matches!(
        ca.sign_csr(&signer, "agent-spoke1", days(7)),
        Err(PkiError::CsrRefused(_))
    ));

    assert!(matches!(
        ca.sign_csr(
            "-----BEGIN CERTIFICATE REQUEST-----\nAAAA\n-----END CERTIFICATE REQUEST-----\n",
            "x",
            days(1)
        ),
        Err(PkiError::BadCsr(_))
    ));
}

#[test]
fn validity_must_be_positive_and_representable() {
    assert!(matches!(
        CertificateAuthority::generate("x", Duration::ZERO),
        Err(PkiError::BadValidity { .. })
    ));
    assert!(matches!(
        CertificateAuthority::generate("x", days(u32::MAX)),
        Err(PkiError::BadValidity { .. })
    ));
    assert!(matches!(
        CertificateAuthority::generate("", days(1)),
        Err(PkiError::InvalidName { .. })
    ));
}

#[test]
fn debug_output_never_contains_private_keys() {
    let ca = ca();
    let issued = ca.issue_client("x", days(1)).unwrap();
    assert!(!format!("{issued:?}").contains(&key_body(&issued.key_pem)));
    assert!(!format!("{ca:?}").contains(&key_body(&ca.key_pem())));
}
