//! `/etc/os-release` (os-release(5)).

use std::collections::BTreeMap;

/// Parses an os-release(5) file into `KEY → value`.
///
/// Each line is `KEY=VALUE`; blank lines and lines starting with `#` are skipped. Values use
/// shell quoting as systemd's env-file parser reads it: `"…"` (where `\"`, `\\`, `\$` and
/// `` \` `` are escapes and any other backslash is kept), `'…'` (literal) and unquoted text
/// (where `\x` is `x`); quoted and unquoted pieces may be concatenated. Lines with an invalid
/// key, an unterminated quote or a trailing backslash (line continuation is not supported)
/// are skipped. A later assignment wins.
pub fn parse_os_release(text: &str) -> BTreeMap<String, String> {
    let mut vars = BTreeMap::new();
    for line in text.lines() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let Some((key, raw)) = line.split_once('=') else {
            continue;
        };
        let key_ok = !key.is_empty()
            && key.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
            && !key.as_bytes().first().is_some_and(u8::is_ascii_digit);
        if !key_ok {
            continue;
        }
        if let Some(value) = unquote(raw) {
            vars.insert(key.to_owned(), value);
        }
    }
    vars
}

/// Shell-style unquoting of one value; `None` when it is malformed.
fn unquote(raw: &str) -> Option<String> {
    #[derive(PartialEq)]
    enum State {
        Bare,
        Single,
        Double,
    }
    let mut out = String::with_capacity(raw.len());
    let mut state = State::Bare;
    let mut chars = raw.chars();
    while let Some(c) = chars.next() {
        match (&state, c) {
            (State::Bare, '\\') => out.push(chars.next()?),
            (State::Bare, '\'') => state = State::Single,
            (State::Bare, '"') => state = State::Double,
            (State::Single, '\'') | (State::Double, '"') => state = State::Bare,
            (State::Double, '\\') => match chars.next()? {
                escaped @ ('"' | '\\' | '$' | '`') => out.push(escaped),
                other => {
                    out.push('\\');
                    out.push(other);
                }
            },
            (_, c) => out.push(c),
        }
    }
    (state == State::Bare).then_some(out)
}

/// The node's `osImage` from the contents of the first readable of `/etc/os-release` and
/// `/usr/lib/os-release` (cadvisor `machine/operatingsystem_unix.go`): its `PRETTY_NAME`,
/// `"Linux"` if the key is missing or empty, `"Unknown"` if neither file was readable
/// (`text` is `None`).
pub fn os_image(text: Option<&str>) -> String {
    let Some(text) = text else {
        return "Unknown".to_owned();
    };
    parse_os_release(text)
        .remove("PRETTY_NAME")
        .filter(|name| !name.is_empty())
        .unwrap_or_else(|| "Linux".to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unquote_table() {
        let cases: &[(&str, Option<&str>)] = &[
            (
                r#""Debian GNU/Linux 12 (bookworm)""#,
                Some("Debian GNU/Linux 12 (bookworm)"),
            ),
            ("bookworm", Some("bookworm")),
            ("'single $quoted \\n'", Some("single $quoted \\n")),
            (
                r#""a \"b\" \\ \$HOME \`x\` \n""#,
                Some(r#"a "b" \ $HOME `x` \n"#),
            ),
            (r#"foo\ bar"#, Some("foo bar")),
            (r#""con"'cat'enated"#, Some("concatenated")),
            ("", Some("")),
            ("\"\"", Some("")),
            ("Foo Bar", Some("Foo Bar")),
            ("\"unterminated", None),
            ("'unterminated", None),
            ("trailing\\", None),
            ("\"trailing\\", None),
        ];
        for (input, want) in cases {
            assert_eq!(unquote(input).as_deref(), *want, "{input:?}");
        }
    }

    #[test]
    fn parse_table() {
        let text = "# comment\n\nPRETTY_NAME=\"Ubuntu 22.04.4 LTS\"\nNAME=\"Ubuntu\"\nVERSION_ID=\"22.04\"\nID=ubuntu\n  ID_LIKE=debian  \nbad key=x\n1X=y\nBROKEN=\"oops\nnovalue\nID=ubuntu2\n";
        let got = parse_os_release(text);
        let want: BTreeMap<String, String> = [
            ("PRETTY_NAME", "Ubuntu 22.04.4 LTS"),
            ("NAME", "Ubuntu"),
            ("VERSION_ID", "22.04"),
            ("ID", "ubuntu2"),
            ("ID_LIKE", "debian"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect();
        assert_eq!(got, want);
    }

    #[test]
    fn os_image_table() {
        let cases: &[(Option<&str>, &str)] = &[
            (
                Some("PRETTY_NAME=\"Debian GNU/Linux 11 (bullseye)\"\nID=debian\n"),
                "Debian GNU/Linux 11 (bullseye)",
            ),
            (
                Some("PRETTY_NAME='Alpine Linux v3.19'\n"),
                "Alpine Linux v3.19",
            ),
            (Some("PRETTY_NAME=Gentoo\n"), "Gentoo"),
            (Some("NAME=Foo\nID=foo\n"), "Linux"),
            (Some("PRETTY_NAME=\"\"\n"), "Linux"),
            (Some("PRETTY_NAME=\"broken\n"), "Linux"),
            (Some(""), "Linux"),
            (None, "Unknown"),
        ];
        for (input, want) in cases {
            assert_eq!(os_image(*input), *want, "{input:?}");
        }
    }
}
