//! Token quantities: `131072`, `"600M"`, `"11B"`, `"1.5B"`.

use std::borrow::Cow;

use schemars::{JsonSchema, Schema, SchemaGenerator, json_schema};
use serde::{Deserialize, Serialize};

/// A count of tokens, written as an integer or as a string with an optional
/// K (10^3), M (10^6), B (10^9) or T (10^12) suffix.
///
/// The original spelling is kept, so a manifest reads back as it was written;
/// [`TokenQuantity::value`] parses it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum TokenQuantity {
    Int(u64),
    Text(String),
}

/// Rejected spellings of a token quantity.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum QuantityError {
    #[error(
        "{0:?} is not a token count; write an integer or a number with a K, M, B or T suffix, e.g. \"11B\" or \"600M\""
    )]
    Malformed(String),
    #[error("{0:?} is not a whole number of tokens")]
    Fractional(String),
    #[error("{0:?} is too large")]
    Overflow(String),
    #[error("must be at least 1 token")]
    Zero,
}

/// The spelling the API server accepts for a token count written as a string: digits,
/// an optional fraction, an optional K, M, B or T, and not zero. Integers must be at
/// least [`MIN_TOKENS`]. Plain OpenAPI checks rather than a CEL rule: the API server's
/// cost estimator cannot bound a regex match on an int-or-string value, and would
/// refuse the whole CRD.
pub const PATTERN: &str = r"^([0-9]*[1-9][0-9]*(\.[0-9]+)?|[0-9]+\.[0-9]*[1-9][0-9]*)[kKmMbBtT]?$";
/// The smallest token count.
pub const MIN_TOKENS: u64 = 1;
/// The longest spelling: 20 digits of u64, a fraction and a suffix fit well within it.
pub const MAX_LENGTH: u64 = 32;

impl TokenQuantity {
    /// The number of tokens.
    pub fn value(&self) -> Result<u64, QuantityError> {
        match self {
            TokenQuantity::Int(0) => Err(QuantityError::Zero),
            TokenQuantity::Int(n) => Ok(*n),
            TokenQuantity::Text(s) => parse_tokens(s),
        }
    }
}

impl From<u64> for TokenQuantity {
    fn from(n: u64) -> Self {
        TokenQuantity::Int(n)
    }
}

impl From<&str> for TokenQuantity {
    fn from(s: &str) -> Self {
        TokenQuantity::Text(s.to_string())
    }
}

/// Parses `"11B"`, `"600M"`, `"1.5B"`, `"64K"`, `"2T"` or `"131072"`.
pub fn parse_tokens(text: &str) -> Result<u64, QuantityError> {
    let malformed = || QuantityError::Malformed(text.to_string());
    let s = text.trim();
    let (number, scale): (&str, u64) = match s.chars().last() {
        Some('k' | 'K') => (&s[..s.len() - 1], 1_000),
        Some('m' | 'M') => (&s[..s.len() - 1], 1_000_000),
        Some('b' | 'B') => (&s[..s.len() - 1], 1_000_000_000),
        Some('t' | 'T') => (&s[..s.len() - 1], 1_000_000_000_000),
        Some(c) if c.is_ascii_digit() => (s, 1),
        _ => return Err(malformed()),
    };
    let (whole, frac) = number.split_once('.').unwrap_or((number, ""));
    if whole.is_empty() || !whole.bytes().all(|b| b.is_ascii_digit()) || !frac.bytes().all(|b| b.is_ascii_digit()) {
        return Err(malformed());
    }
    if number.ends_with('.') {
        return Err(malformed());
    }
    let overflow = || QuantityError::Overflow(text.to_string());
    let whole: u64 = whole.parse().map_err(|_| overflow())?;
    let mut value = whole.checked_mul(scale).ok_or_else(overflow)?;
    // Exact decimal arithmetic: "1.5B" is 1_500_000_000, never 1_499_999_999.
    let mut unit = scale;
    for digit in frac.bytes() {
        if unit % 10 != 0 {
            return Err(QuantityError::Fractional(text.to_string()));
        }
        unit /= 10;
        value = value.checked_add(u64::from(digit - b'0') * unit).ok_or_else(overflow)?;
    }
    if value == 0 {
        return Err(QuantityError::Zero);
    }
    Ok(value)
}

/// Parses an amount of memory as Kubernetes writes it: `"48Gi"`, `"80G"`, `"47.5Gi"`,
/// `"1024Mi"` or a plain byte count; `"48GiB"` and `"80GB"` are read as the same units.
/// Binary suffixes Ki Mi Gi Ti are powers of 1024, decimal k M G T powers of 1000.
pub fn parse_bytes(text: &str) -> Result<u64, String> {
    let s = text.trim();
    let s = s.strip_suffix('B').filter(|rest| rest.ends_with(|c: char| c.is_ascii_alphabetic())).unwrap_or(s);
    let units: [(&str, f64); 8] = [
        ("Ki", 1024.0),
        ("Mi", 1024.0 * 1024.0),
        ("Gi", 1024.0 * 1024.0 * 1024.0),
        ("Ti", 1024.0 * 1024.0 * 1024.0 * 1024.0),
        ("k", 1e3),
        ("M", 1e6),
        ("G", 1e9),
        ("T", 1e12),
    ];
    let (number, scale) =
        units.iter().find_map(|(suffix, scale)| s.strip_suffix(suffix).map(|n| (n, *scale))).unwrap_or((s, 1.0));
    let malformed = || format!("{text:?} is not an amount of memory; write e.g. \"48Gi\", \"80G\" or \"47.5Gi\"");
    if number.is_empty() || !number.bytes().all(|b| b.is_ascii_digit() || b == b'.') {
        return Err(malformed());
    }
    let value: f64 = number.parse().map_err(|_| malformed())?;
    let bytes = (value * scale).round();
    if bytes < 1.0 || bytes > u64::MAX as f64 {
        return Err(format!("{text:?} is not a usable amount of memory"));
    }
    Ok(bytes as u64)
}

/// Formats a count the way people write it: 11B, 600M, 1.5B, 131072.
pub fn format_tokens(n: u64) -> String {
    for (scale, suffix) in [(1_000_000_000_000, "T"), (1_000_000_000, "B"), (1_000_000, "M"), (1_000, "K")] {
        if n >= scale {
            let v = n as f64 / scale as f64;
            return if n.is_multiple_of(scale) {
                format!("{}{suffix}", n / scale)
            } else {
                format!("{}{suffix}", (v * 100.0).round() / 100.0)
            };
        }
    }
    n.to_string()
}

impl JsonSchema for TokenQuantity {
    fn schema_name() -> Cow<'static, str> {
        "TokenQuantity".into()
    }

    fn inline_schema() -> bool {
        true
    }

    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        json_schema!({
            "x-kubernetes-int-or-string": true,
            "minimum": MIN_TOKENS,
            "maxLength": MAX_LENGTH,
            "pattern": PATTERN,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memory_reads_kubernetes_quantities_and_their_byte_spellings() {
        const GI: u64 = 1 << 30;
        for (text, bytes) in [
            ("48Gi", 48 * GI),
            ("48GiB", 48 * GI),
            ("80G", 80_000_000_000),
            ("80GB", 80_000_000_000),
            ("47.5Gi", 47 * GI + GI / 2),
            ("1024Mi", GI),
            ("512Ki", 512 * 1024),
            ("1Ti", 1024 * GI),
            ("4096", 4096),
        ] {
            assert_eq!(parse_bytes(text), Ok(bytes), "{text}");
        }
        for bad in ["", "Gi", "48 apples", "-1Gi", "0", "1.2.3G", "48gb"] {
            let err = parse_bytes(bad).unwrap_err();
            assert!(err.contains(&format!("{bad:?}")), "{bad}: {err}");
        }
    }

    #[test]
    fn parses_suffixes_exactly() {
        assert_eq!(parse_tokens("11B"), Ok(11_000_000_000));
        assert_eq!(parse_tokens("600M"), Ok(600_000_000));
        assert_eq!(parse_tokens("100B"), Ok(100_000_000_000));
        assert_eq!(parse_tokens("1.5B"), Ok(1_500_000_000));
        assert_eq!(parse_tokens("0.6B"), Ok(600_000_000));
        assert_eq!(parse_tokens("64k"), Ok(64_000));
        assert_eq!(parse_tokens("2T"), Ok(2_000_000_000_000));
        assert_eq!(parse_tokens("131072"), Ok(131_072));
        assert_eq!(parse_tokens(" 2M "), Ok(2_000_000));
    }

    #[test]
    fn rejects_bad_spellings() {
        for bad in ["", "B", "11X", "1e9", "-5", "1.5", "1.", ".5B", "11 B", "1,000", "eleven"] {
            let err = parse_tokens(bad).unwrap_err();
            assert!(matches!(err, QuantityError::Malformed(_) | QuantityError::Fractional(_)), "{bad:?} gave {err:?}");
        }
        assert_eq!(parse_tokens("1.0001K"), Err(QuantityError::Fractional("1.0001K".into())));
        assert_eq!(parse_tokens("0"), Err(QuantityError::Zero));
        assert_eq!(parse_tokens("0M"), Err(QuantityError::Zero));
        assert!(matches!(parse_tokens("99999999999T"), Err(QuantityError::Overflow(_))));
        assert!(matches!(parse_tokens("99999999999999999999"), Err(QuantityError::Overflow(_))));
        assert_eq!(TokenQuantity::Int(0).value(), Err(QuantityError::Zero));
    }

    #[test]
    fn error_says_what_to_write() {
        let msg = parse_tokens("11X").unwrap_err().to_string();
        assert!(msg.contains("\"11X\"") && msg.contains("\"11B\""), "{msg}");
    }

    #[test]
    fn deserializes_int_or_string() {
        let q: TokenQuantity = serde_json::from_str("131072").unwrap();
        assert_eq!(q.value(), Ok(131_072));
        let q: TokenQuantity = serde_json::from_str("\"11B\"").unwrap();
        assert_eq!(q.value(), Ok(11_000_000_000));
        assert_eq!(serde_json::to_string(&q).unwrap(), "\"11B\"");
    }

    #[test]
    fn formats_round_numbers() {
        assert_eq!(format_tokens(11_000_000_000), "11B");
        assert_eq!(format_tokens(1_500_000_000), "1.5B");
        assert_eq!(format_tokens(131_072), "131.07K");
        assert_eq!(format_tokens(999), "999");
    }
}
