//! The principal's JWT signing key: generation and a summary for inspection.
//!
//! Keys are PKCS#8 PEM (`-----BEGIN PRIVATE KEY-----`), the format upstream stores in Secret
//! `argocd-agent-jwt` key `jwt.key` and the format `jsonwebtoken`'s `EncodingKey::from_ec_pem`
//! / `from_rsa_pem` read. ECDSA P-256 (ES256) is the default because it is fast to generate;
//! RSA (upstream signs RS512 with RSA-4096) is there for principals that expect an RSA key.

use std::fmt;
use std::str::FromStr;

use rsa::pkcs8::{DecodePrivateKey, EncodePrivateKey, LineEnding};
use sha2::{Digest, Sha256};

use super::PkiError;

/// Key type to generate.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum JwtKeyAlgorithm {
    /// ECDSA P-256, for ES256 tokens.
    #[default]
    Es256,
    /// RSA with the given modulus size (2048, 3072 or 4096), for RS256/RS512 tokens.
    Rsa {
        /// Modulus size in bits.
        bits: usize,
    },
}

impl FromStr for JwtKeyAlgorithm {
    type Err = String;
    /// `es256`, `rsa` (4096 bits), or `rsa2048`/`rsa3072`/`rsa4096`.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.to_ascii_lowercase().as_str() {
            "es256" | "ecdsa" | "ec" => Ok(Self::Es256),
            "rsa" | "rsa4096" => Ok(Self::Rsa { bits: 4096 }),
            "rsa3072" => Ok(Self::Rsa { bits: 3072 }),
            "rsa2048" => Ok(Self::Rsa { bits: 2048 }),
            other => Err(format!(
                "unknown key algorithm {other:?}; expected es256, rsa2048, rsa3072 or rsa4096"
            )),
        }
    }
}

impl fmt::Display for JwtKeyAlgorithm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Es256 => f.write_str("es256"),
            Self::Rsa { bits } => write!(f, "rsa{bits}"),
        }
    }
}

/// Generate a signing key, PKCS#8 PEM.
pub fn generate_jwt_signing_key(algorithm: JwtKeyAlgorithm) -> Result<String, PkiError> {
    match algorithm {
        JwtKeyAlgorithm::Es256 => {
            let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256)
                .map_err(PkiError::KeyGeneration)?;
            Ok(key.serialize_pem())
        }
        JwtKeyAlgorithm::Rsa { bits } => {
            if ![2048, 3072, 4096].contains(&bits) {
                return Err(PkiError::JwtKey(format!(
                    "RSA key size {bits} not supported; use 2048, 3072 or 4096"
                )));
            }
            let mut rng = rsa::rand_core::OsRng;
            let key = rsa::RsaPrivateKey::new(&mut rng, bits)
                .map_err(|e| PkiError::JwtKey(format!("generating RSA key: {e}")))?;
            let pem = key
                .to_pkcs8_pem(LineEnding::LF)
                .map_err(|e| PkiError::JwtKey(format!("encoding RSA key: {e}")))?;
            Ok(pem.to_string())
        }
    }
}

/// What a JWT signing key is, without revealing it.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct JwtKeyInfo {
    /// `ECDSA` or `RSA`.
    pub key_type: String,
    /// Key size in bits.
    pub bits: usize,
    /// The JWT `alg` this key is meant for (`ES256`, `ES384`, `RS512`).
    pub jwt_algorithm: String,
    /// SHA-256 of the public key (SubjectPublicKeyInfo DER), lowercase hex as upstream prints.
    pub public_key_sha256: String,
}

/// Summarise a PKCS#8 PEM signing key.
pub fn inspect_jwt_key(key_pem: &str) -> Result<JwtKeyInfo, PkiError> {
    let key = super::load_signing_key(key_pem, "JWT signing key")?;
    let alg = key.algorithm();
    let (key_type, bits, jwt_algorithm) = if alg == &rcgen::PKCS_ECDSA_P256_SHA256 {
        ("ECDSA", 256, "ES256")
    } else if alg == &rcgen::PKCS_ECDSA_P384_SHA384 {
        ("ECDSA", 384, "ES384")
    } else if alg == &rcgen::PKCS_RSA_SHA256 {
        let bits = rsa::RsaPrivateKey::from_pkcs8_pem(key_pem)
            .map(|k| rsa::traits::PublicKeyParts::size(&k) * 8)
            .unwrap_or(0);
        ("RSA", bits, "RS512")
    } else {
        return Err(PkiError::JwtKey(
            "unsupported key type; expected ECDSA P-256/P-384 or RSA".into(),
        ));
    };
    Ok(JwtKeyInfo {
        key_type: key_type.to_owned(),
        bits,
        jwt_algorithm: jwt_algorithm.to_owned(),
        public_key_sha256: hex::encode(Sha256::digest(
            rcgen::PublicKeyData::subject_public_key_info(&key),
        )),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use jsonwebtoken::{decode, encode, Algorithm, DecodingKey, EncodingKey, Header, Validation};

    #[derive(serde::Serialize, serde::Deserialize)]
    struct Claims {
        sub: String,
        exp: u64,
    }

    fn round_trip(pem: &str, public_pem: &str, alg: Algorithm) {
        let enc = match alg {
            Algorithm::ES256 => EncodingKey::from_ec_pem(pem.as_bytes()).unwrap(),
            _ => EncodingKey::from_rsa_pem(pem.as_bytes()).unwrap(),
        };
        let dec = match alg {
            Algorithm::ES256 => DecodingKey::from_ec_pem(public_pem.as_bytes()).unwrap(),
            _ => DecodingKey::from_rsa_pem(public_pem.as_bytes()).unwrap(),
        };
        let claims = Claims {
            sub: "spoke1".into(),
            exp: 4_000_000_000,
        };
        let token = encode(&Header::new(alg), &claims, &enc).unwrap();
        let back = decode::<Claims>(&token, &dec, &Validation::new(alg)).unwrap();
        assert_eq!(back.claims.sub, "spoke1");
    }

    #[test]
    fn es256_key_is_pkcs8_and_usable_by_jsonwebtoken() {
        let pem = generate_jwt_signing_key(JwtKeyAlgorithm::Es256).unwrap();
        assert!(pem.starts_with("-----BEGIN PRIVATE KEY-----"));
        let public = rcgen::KeyPair::from_pem(&pem).unwrap().public_key_pem();
        round_trip(&pem, &public, Algorithm::ES256);
        let info = inspect_jwt_key(&pem).unwrap();
        assert_eq!(info.jwt_algorithm, "ES256");
        assert_eq!(info.bits, 256);
    }

    #[test]
    fn rsa_key_is_pkcs8_and_usable_by_jsonwebtoken() {
        let pem = generate_jwt_signing_key(JwtKeyAlgorithm::Rsa { bits: 2048 }).unwrap();
        assert!(pem.starts_with("-----BEGIN PRIVATE KEY-----"));
        let key = rsa::RsaPrivateKey::from_pkcs8_pem(&pem).unwrap();
        let public =
            rsa::pkcs8::EncodePublicKey::to_public_key_pem(&key.to_public_key(), LineEnding::LF)
                .unwrap();
        round_trip(&pem, &public, Algorithm::RS512);
        let info = inspect_jwt_key(&pem).unwrap();
        assert_eq!((info.key_type.as_str(), info.bits), ("RSA", 2048));
        assert_eq!(info.jwt_algorithm, "RS512");
    }

    #[test]
    fn algorithm_names_parse() {
        assert_eq!("ES256".parse(), Ok(JwtKeyAlgorithm::Es256));
        assert_eq!("rsa".parse(), Ok(JwtKeyAlgorithm::Rsa { bits: 4096 }));
        assert!("dsa".parse::<JwtKeyAlgorithm>().is_err());
        assert!(generate_jwt_signing_key(JwtKeyAlgorithm::Rsa { bits: 1024 }).is_err());
    }
}
