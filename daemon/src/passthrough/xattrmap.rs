//! `--xattrmap`: virtiofsd's rule language for translating extended attribute names
//! between the guest and the host.
//!
//! A map is a whitespace-separated list of rules. Each rule starts with a delimiter
//! character of its choice, which also separates and ends its fields:
//!
//! - `:TYPE:SCOPE:KEY:PREPEND:` with TYPE `prefix`, `ok`, `bad` or `unsupported`, SCOPE
//!   `client` (names the guest sends: get/set/removexattr), `server` (names the host lists)
//!   or `all`.
//! - `:map:KEY:PREPEND:`, shorthand for `:prefix:all:KEY:PREPEND:` followed (for a non-empty
//!   KEY) by `:bad:all:PREPEND:KEY:` and `:ok:all:::`, or (empty KEY) by `:bad:all:::`. At
//!   most one, and only as the last rule.
//!
//! The first rule that matches decides: a guest name matches when it starts with KEY, a host
//! name when it starts with PREPEND. `prefix` puts PREPEND before a guest name and strips it
//! from a host name; `ok` passes the name unchanged; `bad` refuses a guest name with EPERM
//! and hides a host name; `unsupported` refuses with ENOTSUP and hides.
//!
//! Unlike virtiofsd (which stops on a name no rule matches), a map must end both scopes with
//! a rule that matches every name, and is rejected at start otherwise; so is any malformed
//! rule, quoted in the error.

use std::ffi::{CStr, CString};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Prefix,
    Ok,
    Bad,
    Unsupported,
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct Rule {
    kind: Kind,
    client: bool,
    server: bool,
    key: Vec<u8>,
    prepend: Vec<u8>,
}

/// A parsed, terminated map.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct XattrMap {
    rules: Vec<Rule>,
}

/// What to do with a name the guest sent.
#[derive(Debug, PartialEq, Eq)]
pub enum ClientName {
    /// Use this host name.
    Host(CString),
    /// Refuse with this errno.
    Refuse(i32),
}

impl XattrMap {
    /// Parses `spec`; errors name the rule (1-based) and quote it.
    pub fn parse(spec: &str) -> Result<Self, String> {
        let chars: Vec<char> = spec.chars().collect();
        let mut i = 0;
        let mut rules = Vec::new();
        let mut n = 0;
        let mut saw_map = false;
        loop {
            while i < chars.len() && chars[i].is_whitespace() {
                i += 1;
            }
            if i >= chars.len() {
                break;
            }
            n += 1;
            let start = i;
            let delim = chars[i];
            i += 1;
            let mut fields: Vec<String> = Vec::new();
            let mut cur = String::new();
            let quote = |end: usize| {
                chars[start..end.min(chars.len())]
                    .iter()
                    .collect::<String>()
            };
            let want = |fields: &[String]| match fields.first().map(String::as_str) {
                Some("map") => 3,
                _ => 4,
            };
            loop {
                let Some(&c) = chars.get(i) else {
                    return Err(format!(
                        "--xattrmap rule {n} \"{}\": incomplete (every field, the last one too, ends with the rule's delimiter '{delim}')",
                        quote(i)
                    ));
                };
                i += 1;
                if c == delim {
                    fields.push(std::mem::take(&mut cur));
                    if fields.len() == want(&fields) {
                        break;
                    }
                } else {
                    cur.push(c);
                }
            }
            let text = quote(i);
            if saw_map {
                return Err(format!(
                    "--xattrmap rule {n} \"{text}\": a 'map' rule must be the last rule"
                ));
            }
            let bytes = |s: &str| s.as_bytes().to_vec();
            let kind = match fields[0].as_str() {
                "map" => {
                    saw_map = true;
                    let (key, prepend) = (bytes(&fields[1]), bytes(&fields[2]));
                    let all = |kind, key: &[u8], prepend: &[u8]| Rule {
                        kind,
                        client: true,
                        server: true,
                        key: key.to_vec(),
                        prepend: prepend.to_vec(),
                    };
                    rules.push(all(Kind::Prefix, &key, &prepend));
                    if key.is_empty() {
                        rules.push(all(Kind::Bad, b"", b""));
                    } else {
                        rules.push(all(Kind::Bad, &prepend, &key));
                        rules.push(all(Kind::Ok, b"", b""));
                    }
                    continue;
                }
                "prefix" => Kind::Prefix,
                "ok" => Kind::Ok,
                "bad" => Kind::Bad,
                "unsupported" => Kind::Unsupported,
                other => {
                    return Err(format!(
                        "--xattrmap rule {n} \"{text}\": unknown type '{other}' (prefix, ok, bad, unsupported or map)"
                    ))
                }
            };
            let (client, server) = match fields[1].as_str() {
                "all" => (true, true),
                "client" => (true, false),
                "server" => (false, true),
                other => {
                    return Err(format!(
                        "--xattrmap rule {n} \"{text}\": unknown scope '{other}' (all, client or server)"
                    ))
                }
            };
            rules.push(Rule {
                kind,
                client,
                server,
                key: bytes(&fields[2]),
                prepend: bytes(&fields[3]),
            });
        }
        if rules.is_empty() {
            return Err("--xattrmap: no rules (e.g. ':map::user.virtiofs.:')".into());
        }
        let catches_client = rules.iter().any(|r| r.client && r.key.is_empty());
        let catches_server = rules.iter().any(|r| r.server && r.prepend.is_empty());
        if !catches_client || !catches_server {
            return Err(format!(
                "--xattrmap: no rule matches every {} name; end the map with a terminator such as ':ok:all:::' or ':bad:all:::'",
                if catches_client { "host" } else { "guest" }
            ));
        }
        Ok(XattrMap { rules })
    }

    /// The host name for a name the guest sent, or the errno to refuse it with.
    pub fn client(&self, name: &CStr) -> ClientName {
        let b = name.to_bytes();
        let Some(r) = self
            .rules
            .iter()
            .find(|r| r.client && b.starts_with(&r.key))
        else {
            return ClientName::Refuse(libc::EPERM);
        };
        match r.kind {
            Kind::Ok => ClientName::Host(name.to_owned()),
            Kind::Bad => ClientName::Refuse(libc::EPERM),
            Kind::Unsupported => ClientName::Refuse(libc::ENOTSUP),
            Kind::Prefix => {
                let mut v = r.prepend.clone();
                v.extend_from_slice(b);
                // Neither part has a NUL (a CStr and a command-line string).
                CString::new(v).map_or(ClientName::Refuse(libc::EINVAL), ClientName::Host)
            }
        }
    }

    /// The guest's view of a host `listxattr` list (NUL-terminated names).
    pub fn server_list(&self, list: &[u8]) -> Vec<u8> {
        let mut out = Vec::with_capacity(list.len());
        for name in list.split(|&c| c == 0).filter(|n| !n.is_empty()) {
            let Some(r) = self
                .rules
                .iter()
                .find(|r| r.server && name.starts_with(&r.prepend))
            else {
                continue;
            };
            let shown = match r.kind {
                Kind::Bad | Kind::Unsupported => continue,
                Kind::Ok => name,
                Kind::Prefix => &name[r.prepend.len()..],
            };
            if shown.is_empty() {
                continue;
            }
            out.extend_from_slice(shown);
            out.push(0);
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn host(m: &XattrMap, n: &str) -> Result<String, i32> {
        match m.client(&CString::new(n).unwrap()) {
            ClientName::Host(h) => Ok(h.into_string().unwrap()),
            ClientName::Refuse(e) => Err(e),
        }
    }

    fn list(m: &XattrMap, names: &[&str]) -> Vec<String> {
        let mut raw = Vec::new();
        for n in names {
            raw.extend_from_slice(n.as_bytes());
            raw.push(0);
        }
        m.server_list(&raw)
            .split(|&c| c == 0)
            .filter(|n| !n.is_empty())
            .map(|n| String::from_utf8(n.to_vec()).unwrap())
            .collect()
    }

    #[test]
    fn map_with_empty_key_puts_every_guest_name_under_a_prefix() {
        let m = XattrMap::parse(":map::user.virtiofs.:").unwrap();
        assert_eq!(
            host(&m, "security.selinux").unwrap(),
            "user.virtiofs.security.selinux"
        );
        assert_eq!(host(&m, "user.x").unwrap(), "user.virtiofs.user.x");
        assert_eq!(
            list(
                &m,
                &["user.virtiofs.trusted.a", "user.other", "security.selinux"]
            ),
            ["trusted.a"]
        );
    }

    #[test]
    fn map_with_a_key_maps_that_namespace_only() {
        let m = XattrMap::parse(":map:trusted.:user.virtiofs.:").unwrap();
        assert_eq!(host(&m, "trusted.a").unwrap(), "user.virtiofs.trusted.a");
        assert_eq!(
            host(&m, "user.virtiofs.x"),
            Err(libc::EPERM),
            "no direct access"
        );
        assert_eq!(host(&m, "user.plain").unwrap(), "user.plain");
        assert_eq!(
            list(
                &m,
                &["user.virtiofs.trusted.a", "trusted.host", "user.plain"]
            ),
            ["trusted.a", "user.plain"]
        );
    }

    #[test]
    fn explicit_rules_with_any_delimiter() {
        let m = XattrMap::parse(
            "/prefix/all/trusted./user.virtiofs./ /bad/server//trusted./\n\
             /bad/client/user.virtiofs.// ,unsupported,client,security.capability,, /ok/all///",
        )
        .unwrap();
        assert_eq!(host(&m, "trusted.a").unwrap(), "user.virtiofs.trusted.a");
        assert_eq!(host(&m, "user.virtiofs.a"), Err(libc::EPERM));
        assert_eq!(host(&m, "security.capability"), Err(libc::ENOTSUP));
        assert_eq!(host(&m, "user.a").unwrap(), "user.a");
        assert_eq!(
            list(&m, &["user.virtiofs.trusted.a", "trusted.h", "user.a"]),
            ["trusted.a", "user.a"]
        );
    }

    #[test]
    fn bad_maps_are_rejected_quoting_the_rule() {
        for (spec, want) in [
            (
                ":prefix:client:hi",
                "rule 1 \":prefix:client:hi\": incomplete",
            ),
            (
                ":ok:all::: :tomato:all:::",
                "rule 2 \":tomato:all:::\": unknown type",
            ),
            (":ok:everywhere:::", "unknown scope 'everywhere'"),
            (
                ":map::a.: :ok:all:::",
                "rule 2 \":ok:all:::\": a 'map' rule must be the last",
            ),
            (":prefix:all:trusted.:user.:", "no rule matches every"),
            (":ok:client::: ", "every host name"),
            ("   ", "no rules"),
        ] {
            let e = XattrMap::parse(spec).unwrap_err();
            assert!(e.contains(want), "{spec}: {e}");
        }
    }
}
