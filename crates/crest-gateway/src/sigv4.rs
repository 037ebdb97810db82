//! AWS Signature Version 4, verified: what every AWS SDK signs its requests with.
//!
//! The verifier rebuilds the canonical request from what arrived (method, path, query, the
//! signed headers, the body's SHA-256), the string to sign, and the signing key derived from
//! the access key's secret for the request's date, region and service, and compares
//! signatures in constant time. A request more than [`SKEW_MAX`] away from the gateway's
//! clock is refused, so a captured request cannot be replayed later. A presigned request
//! (the signature in its query string, `X-Amz-Signature`, as botocore's `SigV4QueryAuth` and
//! the SDKs' presigners make them) is taken from its `X-Amz-Date` until its `X-Amz-Expires`
//! (at most [`PRESIGNED_EXPIRES_MAX`]) has passed, and not before its date less
//! [`SKEW_MAX`].
//! Reference: <https://docs.aws.amazon.com/IAM/latest/UserGuide/create-signed-request.html>.

use ring::{digest, hmac};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Largest difference between a request's `X-Amz-Date` and the gateway's clock.
pub const SKEW_MAX: Duration = Duration::from_secs(15 * 60);

/// Longest a presigned request may say it stays valid (`X-Amz-Expires`): seven days, as AWS.
pub const PRESIGNED_EXPIRES_MAX: u64 = 7 * 24 * 3600;

/// Why a request's signature was not accepted (each maps to an SQS error code).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SignatureError {
    /// No `Authorization` header, or not a SigV4 one.
    #[error("the request is not signed with AWS Signature Version 4: {0}")]
    Missing(String),
    /// The header is SigV4 but malformed.
    #[error("malformed Authorization header: {0}")]
    Malformed(String),
    /// The access key id is not one the gateway knows.
    #[error("the access key id {0:?} is not known")]
    UnknownKey(String),
    /// The signature does not match the request.
    #[error(
        "the request signature we calculated does not match the signature you provided; check \
         your AWS secret access key and signing method"
    )]
    Mismatch,
    /// The request's time is too far from the gateway's.
    #[error("the request's time {0} is more than 15 minutes from the gateway's clock")]
    Expired(String),
    /// A presigned request whose `X-Amz-Expires` has passed.
    #[error("the presigned request dated {0} expired {1} seconds after it")]
    PresignedExpired(String, u64),
    /// An `x-amz-content-sha256` header that is not the SHA-256 of the body that came.
    #[error("the provided 'x-amz-content-sha256' header does not match what was computed")]
    ContentHashMismatch,
}

/// What a request is made of, as the signature covers it.
pub struct Signed<'a> {
    /// `POST`, `GET`.
    pub method: &'a str,
    /// The path as sent (`/`, `/default/jobs`).
    pub path: &'a str,
    /// The query string as sent, without `?` (empty when none).
    pub query: &'a str,
    /// Every header, names in any case.
    pub headers: Vec<(String, String)>,
    /// The body.
    pub body: &'a [u8],
}

/// The parts of a SigV4 `Authorization` header.
#[derive(Debug, PartialEq, Eq)]
struct Authorization {
    key_id: String,
    /// `YYYYMMDD/region/service/aws4_request`.
    scope: String,
    date: String,
    region: String,
    service: String,
    signed_headers: Vec<String>,
    signature: String,
    /// Presigned: how long it stays valid, in seconds (`None`: an `Authorization` header).
    expires: Option<u64>,
}

fn parse_authorization(value: &str) -> Result<Authorization, SignatureError> {
    let rest = value
        .strip_prefix("AWS4-HMAC-SHA256 ")
        .ok_or_else(|| SignatureError::Missing("not AWS4-HMAC-SHA256".into()))?;
    let (mut credential, mut signed, mut signature) = (None, None, None);
    for part in rest.split(',') {
        let (name, value) = part
            .trim()
            .split_once('=')
            .ok_or_else(|| SignatureError::Malformed(format!("{part:?} is not NAME=VALUE")))?;
        match name {
            "Credential" => credential = Some(value),
            "SignedHeaders" => signed = Some(value),
            "Signature" => signature = Some(value),
            _ => {}
        }
    }
    let missing = |what: &str| SignatureError::Malformed(format!("no {what}"));
    let credential = credential.ok_or_else(|| missing("Credential"))?;
    let signed = signed.ok_or_else(|| missing("SignedHeaders"))?;
    let signature = signature.ok_or_else(|| missing("Signature"))?;
    let (key_id, scope) = credential
        .split_once('/')
        .ok_or_else(|| SignatureError::Malformed("Credential has no scope".into()))?;
    let parts: Vec<&str> = scope.split('/').collect();
    let [date, region, service, "aws4_request"] = parts[..] else {
        return Err(SignatureError::Malformed(format!(
            "scope {scope:?} is not DATE/REGION/SERVICE/aws4_request"
        )));
    };
    Ok(Authorization {
        key_id: key_id.to_string(),
        scope: scope.to_string(),
        date: date.to_string(),
        region: region.to_string(),
        service: service.to_string(),
        signed_headers: signed.split(';').map(str::to_ascii_lowercase).collect(),
        signature: signature.to_ascii_lowercase(),
        expires: None,
    })
}

/// The SigV4 parameters of a presigned request's query string (decoded), if it has
/// `X-Amz-Algorithm`; with its `X-Amz-Date`.
fn parse_presigned(query: &str) -> Option<Result<(Authorization, String), SignatureError>> {
    let params: Vec<(String, String)> = query
        .split('&')
        .filter_map(|pair| pair.split_once('='))
        .filter(|(name, _)| name.starts_with("X-Amz-"))
        .map(|(name, value)| (name.to_string(), decode(value)))
        .collect();
    let param = |name: &str| {
        params
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    };
    let algorithm = param("X-Amz-Algorithm")?;
    Some((|| {
        if algorithm != "AWS4-HMAC-SHA256" {
            return Err(SignatureError::Missing(format!(
                "X-Amz-Algorithm {algorithm:?} is not AWS4-HMAC-SHA256"
            )));
        }
        let missing = |what: &str| SignatureError::Malformed(format!("no {what}"));
        let credential = param("X-Amz-Credential").ok_or_else(|| missing("X-Amz-Credential"))?;
        let signed = param("X-Amz-SignedHeaders").ok_or_else(|| missing("X-Amz-SignedHeaders"))?;
        let signature = param("X-Amz-Signature").ok_or_else(|| missing("X-Amz-Signature"))?;
        let date = param("X-Amz-Date").ok_or_else(|| missing("X-Amz-Date"))?;
        let expires = param("X-Amz-Expires").ok_or_else(|| missing("X-Amz-Expires"))?;
        let expires = expires
            .parse::<u64>()
            .ok()
            .filter(|e| (1..=PRESIGNED_EXPIRES_MAX).contains(e))
            .ok_or_else(|| {
                SignatureError::Malformed(format!(
                    "X-Amz-Expires {expires:?} is not 1 to {PRESIGNED_EXPIRES_MAX} seconds"
                ))
            })?;
        let header = format!(
            "AWS4-HMAC-SHA256 Credential={credential}, SignedHeaders={signed}, \
             Signature={signature}"
        );
        let mut auth = parse_authorization(&header)?;
        auth.expires = Some(expires);
        Ok((auth, date.to_string()))
    })())
}

/// The access key id a request claims, once its `Authorization` header is well formed, its
/// time within [`SKEW_MAX`] of `now` and its host signed: what can be checked before its
/// body is read (and is, so a request that cannot verify holds no body).
pub fn claimed_key(request: &Signed<'_>, now: SystemTime) -> Result<String, SignatureError> {
    Ok(claimed(request, now)?.key_id)
}

/// What a request's signature claims, checked as [`claimed_key`] says: the access key and
/// the region it was signed for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Claim {
    /// The access key id.
    pub key_id: String,
    /// The region of the credential's scope.
    pub region: String,
}

/// The access key and region a request claims; see [`claimed_key`].
pub fn claimed(request: &Signed<'_>, now: SystemTime) -> Result<Claim, SignatureError> {
    let auth = checked_head(request, now)?.0;
    Ok(Claim {
        key_id: auth.key_id,
        region: auth.region,
    })
}

/// The request's parsed `Authorization` and its `X-Amz-Date`, checked as [`claimed_key`]
/// says.
fn checked_head(
    request: &Signed<'_>,
    now: SystemTime,
) -> Result<(Authorization, String), SignatureError> {
    let (auth, amz_date) = match header(request, "authorization") {
        Some(value) => {
            let amz_date = header(request, "x-amz-date")
                .ok_or_else(|| SignatureError::Malformed("no X-Amz-Date header".into()))?;
            (parse_authorization(value)?, amz_date.to_string())
        }
        None => parse_presigned(request.query).unwrap_or_else(|| {
            Err(SignatureError::Missing(
                "no Authorization header, nor X-Amz-Signature in the query".into(),
            ))
        })?,
    };
    let at = parse_amz_date(&amz_date)
        .ok_or_else(|| SignatureError::Malformed(format!("X-Amz-Date {amz_date:?}")))?;
    if !amz_date.starts_with(&auth.date) {
        return Err(SignatureError::Malformed(
            "the credential's date is not the request's".into(),
        ));
    }
    match (now.duration_since(at), auth.expires) {
        // Dated ahead of the gateway's clock: by no more than the skew, presigned or not.
        (Err(ahead), _) if ahead.duration() > SKEW_MAX => {
            return Err(SignatureError::Expired(amz_date));
        }
        (Ok(behind), None) if behind > SKEW_MAX => {
            return Err(SignatureError::Expired(amz_date));
        }
        (Ok(behind), Some(expires)) if behind > Duration::from_secs(expires) => {
            return Err(SignatureError::PresignedExpired(amz_date, expires));
        }
        _ => {}
    }
    if !auth.signed_headers.iter().any(|h| h == "host") {
        return Err(SignatureError::Malformed(
            "the host header is not signed".into(),
        ));
    }
    Ok((auth, amz_date))
}

fn header<'a>(request: &'a Signed<'_>, name: &str) -> Option<&'a str> {
    request
        .headers
        .iter()
        .find(|(n, _)| n.eq_ignore_ascii_case(name))
        .map(|(_, v)| v.as_str())
}

/// Checks `request`'s signature with `secret` at `now`.
pub fn verify(request: &Signed<'_>, secret: &str, now: SystemTime) -> Result<(), SignatureError> {
    let (auth, amz_date) = checked_head(request, now)?;
    let canonical = canonical_request(request, &auth.signed_headers, auth.expires.is_some())?;
    let to_sign = format!(
        "AWS4-HMAC-SHA256\n{amz_date}\n{}\n{}",
        auth.scope,
        hex(digest::digest(&digest::SHA256, canonical.as_bytes()).as_ref())
    );
    let key = signing_key(secret, &auth.date, &auth.region, &auth.service);
    let expected = hex(hmac::sign(&key, to_sign.as_bytes()).as_ref());
    // Constant time: a timing difference must not reveal how much of a guess was right.
    if ring_eq(expected.as_bytes(), auth.signature.as_bytes()) {
        Ok(())
    } else {
        Err(SignatureError::Mismatch)
    }
}

fn ring_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// The SigV4 signing key for a day, region and service.
fn signing_key(secret: &str, date: &str, region: &str, service: &str) -> hmac::Key {
    let step = |key: &[u8], data: &str| {
        hmac::sign(&hmac::Key::new(hmac::HMAC_SHA256, key), data.as_bytes())
    };
    let k_date = step(format!("AWS4{secret}").as_bytes(), date);
    let k_region = step(k_date.as_ref(), region);
    let k_service = step(k_region.as_ref(), service);
    let k_signing = step(k_service.as_ref(), "aws4_request");
    hmac::Key::new(hmac::HMAC_SHA256, k_signing.as_ref())
}

/// The canonical request of `request` signing the headers `signed` (`presigned`: its query
/// holds the signature, which is left out).
fn canonical_request(
    request: &Signed<'_>,
    signed: &[String],
    presigned: bool,
) -> Result<String, SignatureError> {
    let mut headers = String::new();
    for name in signed {
        let values: Vec<&str> = request
            .headers
            .iter()
            .filter(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
            .collect();
        if values.is_empty() {
            return Err(SignatureError::Malformed(format!(
                "signed header {name:?} is missing"
            )));
        }
        let value = values
            .iter()
            .map(|v| v.split_whitespace().collect::<Vec<_>>().join(" "))
            .collect::<Vec<_>>()
            .join(",");
        headers.push_str(&format!("{name}:{value}\n"));
    }
    // The body is always hashed: a client's `x-amz-content-sha256` (signed or not) only
    // says what it hashed, and one that differs is refused, so a captured signature cannot
    // carry another body. `UNSIGNED-PAYLOAD` (S3's) is not taken: the signature covers the
    // body as it came.
    let payload = hex(digest::digest(&digest::SHA256, request.body).as_ref());
    if let Some(claimed) = header(request, "x-amz-content-sha256")
        && claimed != "UNSIGNED-PAYLOAD"
        && !claimed.trim().eq_ignore_ascii_case(&payload)
    {
        return Err(SignatureError::ContentHashMismatch);
    }
    Ok(format!(
        "{}\n{}\n{}\n{}\n{}\n{}",
        request.method,
        canonical_path(request.path),
        // A presigned request signs its query without the signature itself.
        canonical_query(request.query, presigned),
        headers,
        signed.join(";"),
        payload
    ))
}

/// The path, each segment decoded then encoded as SigV4 encodes (services other than S3 sign
/// the path encoded twice: once as sent, once more here).
fn canonical_path(path: &str) -> String {
    if path.is_empty() {
        return "/".into();
    }
    path.split('/').map(encode).collect::<Vec<_>>().join("/")
}

fn canonical_query(query: &str, presigned: bool) -> String {
    let mut pairs: Vec<(String, String)> = query
        .split('&')
        .filter(|p| !p.is_empty())
        .filter(|p| !(presigned && p.starts_with("X-Amz-Signature=")))
        .map(|pair| {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            (encode(&decode(k)), encode(&decode(v)))
        })
        .collect();
    pairs.sort();
    pairs
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join("&")
}

/// URI encoding as SigV4 specifies: unreserved characters kept, everything else `%XX` (a
/// `%` of the path as sent too: its double encoding).
fn encode(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for byte in text.bytes() {
        if byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'_' | b'.' | b'~') {
            out.push(byte as char);
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
}

/// Percent-decoding (`+` is kept: SigV4 query strings encode spaces as `%20`).
pub(crate) fn decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        // Hex digits read as bytes: slicing the text there could split a character, and
        // `from_str_radix` would take a sign (`%+f`).
        if bytes[i] == b'%'
            && let (Some(high), Some(low)) = (
                bytes.get(i + 1).and_then(|b| hex_digit(*b)),
                bytes.get(i + 2).and_then(|b| hex_digit(*b)),
            )
        {
            out.push(high << 4 | low);
            i += 3;
            continue;
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn hex_digit(byte: u8) -> Option<u8> {
    (byte as char).to_digit(16).map(|d| d as u8)
}

/// `YYYYMMDDTHHMMSSZ` as a time (none before 1970: no client signs then).
fn parse_amz_date(text: &str) -> Option<SystemTime> {
    let b = text.as_bytes();
    if b.len() != 16 || b[8] != b'T' || b[15] != b'Z' {
        return None;
    }
    let num = |range: std::ops::Range<usize>| text.get(range)?.parse::<u64>().ok();
    let (year, month, day) = (num(0..4)?, num(4..6)?, num(6..8)?);
    let (hour, minute, second) = (num(9..11)?, num(11..13)?, num(13..15)?);
    if !(1..=12).contains(&month) || !(1..=31).contains(&day) || hour > 23 || minute > 59 {
        return None;
    }
    if second > 60 {
        return None;
    }
    let days = u64::try_from(days_from_civil(year as i64, month as i64, day as i64)).ok()?;
    let seconds = days * 86_400 + hour * 3600 + minute * 60 + second;
    UNIX_EPOCH.checked_add(Duration::from_secs(seconds))
}

/// Signs a request as AWS SDKs do: every header given (which must include `host`) and
/// `x-amz-date` are signed, over the body's SHA-256; answers the `X-Amz-Date` and
/// `Authorization` headers to add. For crest's own clients of the gateway (the load
/// generator, tests).
#[allow(clippy::too_many_arguments)]
pub fn sign(
    method: &str,
    path: &str,
    headers: &[(String, String)],
    body: &[u8],
    key_id: &str,
    secret: &str,
    region: &str,
    now: SystemTime,
) -> (String, String) {
    let amz_date = format_amz_date(now);
    let date = &amz_date[..8];
    let mut all: Vec<(String, String)> = headers
        .iter()
        .map(|(n, v)| (n.to_ascii_lowercase(), v.clone()))
        .collect();
    all.push(("x-amz-date".into(), amz_date.clone()));
    let mut signed: Vec<String> = all.iter().map(|(n, _)| n.clone()).collect();
    signed.sort();
    signed.dedup();
    let request = Signed {
        method,
        path,
        query: "",
        headers: all,
        body,
    };
    let canonical =
        canonical_request(&request, &signed, false).expect("every signed header is given");
    let scope = format!("{date}/{region}/sqs/aws4_request");
    let to_sign = format!(
        "AWS4-HMAC-SHA256\n{amz_date}\n{scope}\n{}",
        hex(digest::digest(&digest::SHA256, canonical.as_bytes()).as_ref())
    );
    let key = signing_key(secret, date, region, "sqs");
    let signature = hex(hmac::sign(&key, to_sign.as_bytes()).as_ref());
    let authorization = format!(
        "AWS4-HMAC-SHA256 Credential={key_id}/{scope}, SignedHeaders={}, Signature={signature}",
        signed.join(";")
    );
    (amz_date, authorization)
}

/// A time as `YYYYMMDDTHHMMSSZ`.
fn format_amz_date(at: SystemTime) -> String {
    let seconds = at.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let (days, rest) = (seconds / 86_400, seconds % 86_400);
    let (year, month, day) = civil_from_days(days as i64);
    format!(
        "{year:04}{month:02}{day:02}T{:02}{:02}{:02}Z",
        rest / 3600,
        rest / 60 % 60,
        rest % 60
    )
}

/// The proleptic Gregorian date of a day since 1970-01-01 (Howard Hinnant's algorithm).
fn civil_from_days(days: i64) -> (i64, i64, i64) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

/// Days since 1970-01-01 of a proleptic Gregorian date (Howard Hinnant's algorithm).
fn days_from_civil(year: i64, month: i64, day: i64) -> i64 {
    let year = if month <= 2 { year - 1 } else { year };
    let era = year.div_euclid(400);
    let yoe = year - era * 400;
    let mp = (month + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

pub(crate) fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// AWS's published example of a derived signing key.
    #[test]
    fn the_signing_key_matches_aws_s_example() {
        let key = {
            let step = |key: &[u8], data: &str| {
                hmac::sign(&hmac::Key::new(hmac::HMAC_SHA256, key), data.as_bytes())
            };
            let secret = "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY";
            let k = step(format!("AWS4{secret}").as_bytes(), "20120215");
            let k = step(k.as_ref(), "us-east-1");
            let k = step(k.as_ref(), "iam");
            step(k.as_ref(), "aws4_request")
        };
        assert_eq!(
            hex(key.as_ref()),
            "f4780e2d9f65fa895f9c67b32ce1baf0b0d8a43505a000a1a9e090d414db404d"
        );
    }

    const SECRET: &str = "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY";

    const VANILLA: &str = "AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20150830/us-east-1/\
                           service/aws4_request, SignedHeaders=host;x-amz-date, Signature=\
                           5fa00fa31553b73ebf1942676e86291e8372ff2a2260956d9b8aae1d763fbf31";

    /// AWS's SigV4 test suite's `get-vanilla` request, with `method` and `body`.
    fn vanilla(method: &'static str, body: &'static [u8]) -> Signed<'static> {
        Signed {
            method,
            path: "/",
            query: "",
            headers: vec![
                ("Host".into(), "example.amazonaws.com".into()),
                ("X-Amz-Date".into(), "20150830T123600Z".into()),
                ("Authorization".into(), VANILLA.into()),
            ],
            body,
        }
    }

    #[test]
    fn aws_s_get_vanilla_request_verifies_and_any_change_breaks_it() {
        let at = parse_amz_date("20150830T123600Z").unwrap();
        let request = vanilla("GET", b"");
        assert_eq!(claimed_key(&request, at).unwrap(), "AKIDEXAMPLE");
        assert_eq!(verify(&request, SECRET, at), Ok(()));
        let mismatch = Err(SignatureError::Mismatch);
        assert_eq!(verify(&request, "another", at), mismatch);
        assert_eq!(verify(&vanilla("POST", b""), SECRET, at), mismatch);
        assert_eq!(verify(&vanilla("GET", b"x"), SECRET, at), mismatch);
        let late = at + SKEW_MAX + Duration::from_secs(1);
        assert!(matches!(
            verify(&request, SECRET, late),
            Err(SignatureError::Expired(_))
        ));
    }

    #[test]
    fn malformed_headers_are_named() {
        for (value, expected) in [
            ("Basic abc", "not AWS4-HMAC-SHA256"),
            (
                "AWS4-HMAC-SHA256 Credential=AK/2015/x, SignedHeaders=host, Signature=00",
                "scope",
            ),
            ("AWS4-HMAC-SHA256 SignedHeaders=host", "no Credential"),
        ] {
            let error = parse_authorization(value).unwrap_err().to_string();
            assert!(error.contains(expected), "{value}: {error}");
        }
    }

    /// A GET of `/` presigned as the SigV4 documentation describes (query authentication),
    /// dated `at`, valid `expires` seconds: its query string.
    fn presign(action: &str, at: SystemTime, expires: u64) -> String {
        let date = format_amz_date(at);
        let scope = format!("{}/us-east-1/sqs/aws4_request", &date[..8]);
        let unsigned = format!(
            "Action={action}&X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Credential=AKIDEXAMPLE%2F{}\
             &X-Amz-Date={date}&X-Amz-Expires={expires}&X-Amz-SignedHeaders=host",
            scope.replace('/', "%2F")
        );
        let canonical = format!(
            "GET\n/\n{}\nhost:example.amazonaws.com\n\nhost\n{}",
            canonical_query(&unsigned, true),
            hex(digest::digest(&digest::SHA256, b"").as_ref())
        );
        let to_sign = format!(
            "AWS4-HMAC-SHA256\n{date}\n{scope}\n{}",
            hex(digest::digest(&digest::SHA256, canonical.as_bytes()).as_ref())
        );
        let key = signing_key(SECRET, &date[..8], "us-east-1", "sqs");
        let signature = hex(hmac::sign(&key, to_sign.as_bytes()).as_ref());
        format!("{unsigned}&X-Amz-Signature={signature}")
    }

    fn get(query: &str) -> Signed<'_> {
        Signed {
            method: "GET",
            path: "/",
            query,
            headers: vec![("Host".into(), "example.amazonaws.com".into())],
            body: b"",
        }
    }

    #[test]
    fn a_presigned_request_holds_from_its_date_until_it_expires_and_covers_its_query() {
        let at = parse_amz_date("20150830T123600Z").unwrap();
        let query = presign("ListQueues", at, 3600);
        let request = get(&query);
        assert_eq!(claimed_key(&request, at), Ok("AKIDEXAMPLE".into()));
        for later in [0, 3599, 3600] {
            let now = at + Duration::from_secs(later);
            assert_eq!(verify(&request, SECRET, now), Ok(()), "{later} s after");
        }
        let late = at + Duration::from_secs(3601);
        assert!(matches!(
            verify(&request, SECRET, late),
            Err(SignatureError::PresignedExpired(_, 3600))
        ));
        // Dated ahead of the clock by more than the skew allowed.
        let early = at - SKEW_MAX - Duration::from_secs(1);
        assert!(matches!(
            verify(&request, SECRET, early),
            Err(SignatureError::Expired(_))
        ));
        assert_eq!(verify(&request, "other", at), Err(SignatureError::Mismatch));
        let changed = query.replace("Action=ListQueues", "Action=DeleteQueue");
        assert_eq!(
            verify(&get(&changed), SECRET, at),
            Err(SignatureError::Mismatch)
        );
        for bad in [0, PRESIGNED_EXPIRES_MAX + 1] {
            let query = presign("ListQueues", at, bad);
            assert!(matches!(
                verify(&get(&query), SECRET, at),
                Err(SignatureError::Malformed(_))
            ));
        }
        let query = presign("ListQueues", at, PRESIGNED_EXPIRES_MAX);
        let week = at + Duration::from_secs(PRESIGNED_EXPIRES_MAX);
        assert_eq!(verify(&get(&query), SECRET, week), Ok(()));
        // Neither a header nor a presigned query: unsigned.
        assert!(matches!(
            verify(&get("Action=ListQueues"), SECRET, at),
            Err(SignatureError::Missing(_))
        ));
    }

    #[test]
    fn a_request_signed_here_verifies_with_its_secret_only() {
        let at = parse_amz_date("20150830T123600Z").unwrap();
        assert_eq!(format_amz_date(at), "20150830T123600Z");
        let headers = vec![("Host".to_string(), "example.amazonaws.com".to_string())];
        let (date, authorization) = sign(
            "POST",
            "/",
            &headers,
            b"{}",
            "AKIDEXAMPLE",
            SECRET,
            "us-east-1",
            at,
        );
        let mut all = headers.clone();
        all.push(("X-Amz-Date".into(), date));
        all.push(("Authorization".into(), authorization));
        let request = Signed {
            method: "POST",
            path: "/",
            query: "",
            headers: all,
            body: b"{}",
        };
        assert_eq!(verify(&request, SECRET, at), Ok(()));
        assert_eq!(verify(&request, "other", at), Err(SignatureError::Mismatch));
        for days in [0, 59, 60, 365, 11_016, 16_677, 20_000] {
            let (y, m, d) = civil_from_days(days);
            assert_eq!(days_from_civil(y, m, d), days);
        }
    }

    #[test]
    fn a_content_hash_header_must_be_the_body_s() {
        let at = parse_amz_date("20150830T123600Z").unwrap();
        let mut request = vanilla("GET", b"");
        let empty = hex(digest::digest(&digest::SHA256, b"").as_ref());
        request
            .headers
            .push(("x-amz-content-sha256".into(), empty.to_uppercase()));
        assert_eq!(verify(&request, SECRET, at), Ok(()));
        request.body = b"another";
        assert_eq!(
            verify(&request, SECRET, at),
            Err(SignatureError::ContentHashMismatch)
        );
    }

    #[test]
    fn percent_decoding_takes_two_hex_digits_only() {
        assert_eq!(decode("%41%2f"), "A/");
        assert_eq!(decode("%a\u{e9}"), "%a\u{e9}");
        assert_eq!(decode("%+f"), "%+f");
        assert_eq!(decode("%4"), "%4");
        assert_eq!(decode("%"), "%");
    }

    #[test]
    fn dates_convert_to_unix_time() {
        assert!(parse_amz_date("19691231T235959Z").is_none());
        assert!(parse_amz_date("00000101T000000Z").is_none());
        let at = parse_amz_date("20150830T123600Z").unwrap();
        assert_eq!(
            at.duration_since(UNIX_EPOCH).unwrap().as_secs(),
            1_440_938_160
        );
        assert!(parse_amz_date("2015-08-30T12:36").is_none());
        assert!(parse_amz_date("20151330T123600Z").is_none());
    }
}
