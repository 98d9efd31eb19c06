//! A JSON serialiser for `serde_json::Value` that reproduces Go's `encoding/json.Marshal`
//! byte for byte, so checksums computed here match checksums computed by a Go peer.
//!
//! Go's rules, as applied to `map[string]interface{}` trees (Kubernetes unstructured objects):
//! object keys sorted by byte order; no whitespace; strings escape `"` and `\\`, `\n` `\r` `\t`
//! `\b` `\f` by name, other control characters as `\u00xx` (lower-case hex), the HTML-sensitive
//! `<` `>` `&` as `\u003c` `\u003e` `\u0026`, and U+2028/U+2029 as `\u2028`/`\u2029`; integers in
//! decimal; floats in the shortest round-tripping form, using exponent notation (`1e+21`,
//! `1e-7`) only below 1e-6 or from 1e21 on.

use serde_json::{Number, Value};

/// Serialise `v` the way Go's `json.Marshal` would.
pub fn to_string(v: &Value) -> String {
    let mut out = String::new();
    write_value(&mut out, v);
    out
}

/// Serialise `v` the way Go's `json.Marshal` would, as bytes.
pub fn to_vec(v: &Value) -> Vec<u8> {
    to_string(v).into_bytes()
}

/// Append the Go serialisation of `v` to `out`.
pub fn write_value(out: &mut String, v: &Value) {
    match v {
        Value::Null => out.push_str("null"),
        Value::Bool(true) => out.push_str("true"),
        Value::Bool(false) => out.push_str("false"),
        Value::Number(n) => write_number(out, n),
        Value::String(s) => write_string(out, s),
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_value(out, item);
            }
            out.push(']');
        }
        Value::Object(map) => {
            // Sort explicitly: serde_json's map keeps insertion order when the
            // `preserve_order` feature is enabled anywhere in the build.
            let mut entries: Vec<(&String, &Value)> = map.iter().collect();
            entries.sort_by(|a, b| a.0.as_bytes().cmp(b.0.as_bytes()));
            out.push('{');
            for (i, (k, val)) in entries.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_string(out, k);
                out.push(':');
                write_value(out, val);
            }
            out.push('}');
        }
    }
}

fn write_number(out: &mut String, n: &Number) {
    if let Some(u) = n.as_u64() {
        out.push_str(&u.to_string());
    } else if let Some(i) = n.as_i64() {
        out.push_str(&i.to_string());
    } else if let Some(f) = n.as_f64() {
        out.push_str(&format_float(f));
    } else {
        // Arbitrary-precision numbers (only with serde_json's `arbitrary_precision`): keep text.
        out.push_str(&n.to_string());
    }
}

/// Go's `encoding/json` float64 encoding.
pub fn format_float(f: f64) -> String {
    let abs = f.abs();
    if abs != 0.0 && !(1e-6..1e21).contains(&abs) {
        // Exponent form: mantissa as shortest repr, exponent with explicit sign; Go pads the
        // exponent to two digits and then strips the padding of negative one-digit exponents.
        let s = format!("{f:e}");
        match s.split_once('e') {
            Some((mantissa, exp)) => {
                let exp: i32 = exp.parse().unwrap_or(0);
                if exp < 0 {
                    format!("{mantissa}e-{}", -exp)
                } else {
                    format!("{mantissa}e+{exp:02}")
                }
            }
            None => s,
        }
    } else {
        // Rust's Display is the shortest round-tripping form without exponent, as Go's 'f', -1.
        format!("{f}")
    }
}

/// Append a JSON string literal with Go's escaping (HTML-safe) to `out`.
pub fn write_string(out: &mut String, s: &str) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            '<' | '>' | '&' | '\u{0}'..='\u{1f}' => {
                let b = c as u32 as u8;
                out.push_str("\\u00");
                out.push(HEX[(b >> 4) as usize] as char);
                out.push(HEX[(b & 0xf) as usize] as char);
            }
            '\u{2028}' => out.push_str("\\u2028"),
            '\u{2029}' => out.push_str("\\u2029"),
            c => out.push(c),
        }
    }
    out.push('"');
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn floats_like_go() {
        assert_eq!(format_float(1.0), "1");
        assert_eq!(format_float(1.5), "1.5");
        assert_eq!(format_float(-0.0), "-0");
        assert_eq!(format_float(0.1), "0.1");
        assert_eq!(format_float(1e20), "100000000000000000000");
        assert_eq!(format_float(1e21), "1e+21");
        assert_eq!(format_float(1.5e300), "1.5e+300");
        assert_eq!(format_float(0.000001), "0.000001");
        assert_eq!(format_float(0.0000001), "1e-7");
        assert_eq!(format_float(1.25e-10), "1.25e-10");
        assert_eq!(format_float(123456.789), "123456.789");
    }

    #[test]
    fn escapes_like_go() {
        let v = json!("a<b>&c\"d\\e\nf\rg\th\u{8}i\u{c}j\u{1}k\u{7f}l\u{2028}m\u{2029}né€😀");
        assert_eq!(
            to_string(&v),
            "\"a\\u003cb\\u003e\\u0026c\\\"d\\\\e\\nf\\rg\\th\\bi\\fj\\u0001k\u{7f}l\\u2028m\\u2029né€😀\""
        );
    }

    #[test]
    fn sorted_compact() {
        let v = json!({"b": [1, -2, 3.5, null, true], "a": {"z": "x", "B": false}, "A": 1});
        assert_eq!(
            to_string(&v),
            r#"{"A":1,"a":{"B":false,"z":"x"},"b":[1,-2,3.5,null,true]}"#
        );
    }
}
