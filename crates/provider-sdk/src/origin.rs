//! API origins: the URL rules every provider applies to a configured API
//! URL, and the parsed origin the HTTP layer addresses.

/// A parsed origin: what the HTTP layer needs to address it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Origin {
    /// True for `https`.
    pub https: bool,
    /// `host[:port]` as it goes in the request's authority.
    pub authority: String,
}

impl Origin {
    /// Splits an origin produced by [`normalize_url`].
    pub fn parse(origin: &str) -> Option<Origin> {
        if let Some(rest) = origin.strip_prefix("https://") {
            Some(Origin {
                https: true,
                authority: rest.to_string(),
            })
        } else {
            origin.strip_prefix("http://").map(|rest| Origin {
                https: false,
                authority: rest.to_string(),
            })
        }
    }
}

/// Normalises an API URL to its origin: `https:` only, or `http:` for
/// loopback hosts; no user-info, query or fragment, and a path that is one
/// of `allowed_paths` (for example `["", "/", "/v1", "/v1/"]`).
///
/// Messages never repeat the URL, which may hold credentials.
pub fn normalize_url(url: &str, allowed_paths: &[&str]) -> Result<String, String> {
    let (origin, path) = split_url(url)?;
    let raw_path = url
        .trim()
        .split_once("://")
        .map_or("", |(_, rest)| rest.find('/').map_or("", |i| &rest[i..]));
    if !allowed_paths.contains(&raw_path) && !allowed_paths.contains(&path.as_str()) {
        return Err(match allowed_paths.iter().find(|p| p.len() > 1) {
            Some(p) => format!("must have no path other than {}", p.trim_end_matches('/')),
            None => "must have no path".to_string(),
        });
    }
    Ok(origin)
}

/// Splits an API URL into its normalised origin (the rules of
/// [`normalize_url`]) and its base path: empty, or `/segment[/segment…]`
/// without a trailing slash, each segment of letters, digits, `-`, `.`,
/// `_` or `~` (for example `https://app.daytona.io/api` →
/// `("https://app.daytona.io", "/api")`).
///
/// Messages never repeat the URL, which may hold credentials.
pub fn split_url(url: &str) -> Result<(String, String), String> {
    let url = url.trim();
    let (scheme, rest) = url
        .split_once("://")
        .ok_or_else(|| "must be an absolute https URL".to_string())?;
    let https = match scheme.to_ascii_lowercase().as_str() {
        "https" => true,
        "http" => false,
        _ => return Err("must use https (http only for loopback hosts)".to_string()),
    };
    if rest.contains('?') {
        return Err("must not have a query".to_string());
    }
    if rest.contains('#') {
        return Err("must not have a fragment".to_string());
    }
    let (authority, path) = match rest.find('/') {
        Some(i) => rest.split_at(i),
        None => (rest, ""),
    };
    if authority.contains('@') {
        return Err("must not contain user information".to_string());
    }
    let path = path.trim_end_matches('/');
    let valid_segment = |segment: &str| {
        !segment.is_empty()
            && segment != "."
            && segment != ".."
            && segment
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '.' | '_' | '~'))
    };
    if !path.is_empty() && !path[1..].split('/').all(valid_segment) {
        return Err("has an invalid path".to_string());
    }
    let (host, port) = split_host_port(authority)?;
    let host = host.to_ascii_lowercase();
    let loopback = matches!(host.as_str(), "localhost" | "127.0.0.1" | "[::1]");
    if !https && !loopback {
        return Err("must use https (http only for loopback hosts)".to_string());
    }
    let default_port = if https { 443 } else { 80 };
    let origin = match port {
        Some(port) if port != default_port => format!(
            "{scheme}://{host}:{port}",
            scheme = if https { "https" } else { "http" }
        ),
        _ => format!("{}://{host}", if https { "https" } else { "http" }),
    };
    Ok((origin, path.to_string()))
}

fn split_host_port(authority: &str) -> Result<(&str, Option<u16>), String> {
    let (host, port) = if authority.starts_with('[') {
        let end = authority
            .find(']')
            .ok_or_else(|| "has an invalid IPv6 host".to_string())?;
        let (host, rest) = authority.split_at(end + 1);
        let inner = &host[1..host.len() - 1];
        if inner.is_empty()
            || !inner
                .chars()
                .all(|c| c.is_ascii_hexdigit() || c == ':' || c == '.')
        {
            return Err("has an invalid IPv6 host".to_string());
        }
        match rest {
            "" => (host, None),
            _ => match rest.strip_prefix(':') {
                Some(port) => (host, Some(port)),
                None => return Err("has an invalid host".to_string()),
            },
        }
    } else {
        match authority.rsplit_once(':') {
            Some((host, port)) => (host, Some(port)),
            None => (authority, None),
        }
    };
    if !host.starts_with('[') {
        let valid = !host.is_empty()
            && host.len() <= 253
            && host.split('.').all(|label| {
                !label.is_empty()
                    && label.len() <= 63
                    && label.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')
            });
        if !valid {
            return Err("has an invalid host".to_string());
        }
    }
    let port = match port {
        None => None,
        Some(port) => match port.parse::<u16>() {
            Ok(p) if p > 0 && port.chars().all(|c| c.is_ascii_digit()) => Some(p),
            _ => return Err("has an invalid port".to_string()),
        },
    };
    Ok((host, port))
}

#[cfg(test)]
mod tests {
    use super::*;
    use wasm_bindgen_test::wasm_bindgen_test;

    #[wasm_bindgen_test(unsupported = test)]
    fn urls_split_into_origin_and_base_path() {
        assert_eq!(
            split_url("https://App.Daytona.io:443/api/").unwrap(),
            ("https://app.daytona.io".to_string(), "/api".to_string())
        );
        assert_eq!(
            split_url("http://127.0.0.1:8080/daytona/api").unwrap(),
            (
                "http://127.0.0.1:8080".to_string(),
                "/daytona/api".to_string()
            )
        );
        assert_eq!(split_url("https://proxy.app.daytona.io").unwrap().1, "");
        for bad in [
            "http://app.daytona.io/api",
            "https://u:p@app.daytona.io",
            "https://app.daytona.io/api?x=1",
            "https://app.daytona.io/a/../b",
            "https://app.daytona.io/a%2fb",
            "ftp://app.daytona.io",
        ] {
            assert!(split_url(bad).is_err(), "{bad}");
        }
    }
}
