//! An action's form (`application/x-www-form-urlencoded`: `action`, `server`, `weight`,
//! `token`), the query strings of the page's links (an action to confirm, one done), and
//! whether a request came from another site: an `Origin` other than the scheme, host and port
//! the request was sent to, or `Sec-Fetch-Site: cross-site`.

use crate::http::{LocalBody, LocalRequest};
use crate::query::asking::percent_decode;

/// An action on a server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Action {
    Disable,
    Enable,
    Drain,
    Release,
    Weight,
    Restart,
    Cut,
}

/// Every action, in the order the page offers them.
pub(super) const ACTIONS: [Action; 7] = [
    Action::Disable,
    Action::Drain,
    Action::Enable,
    Action::Weight,
    Action::Release,
    Action::Restart,
    Action::Cut,
];

impl Action {
    /// Its name in forms and links.
    pub(super) fn name(self) -> &'static str {
        match self {
            Action::Disable => "disable",
            Action::Enable => "enable",
            Action::Drain => "drain",
            Action::Release => "release",
            Action::Weight => "weight",
            Action::Restart => "restart",
            Action::Cut => "cut",
        }
    }

    fn named(name: &str) -> Option<Action> {
        ACTIONS.into_iter().find(|a| a.name() == name)
    }
}

/// An action's form, read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Form {
    pub(super) action: Action,
    /// The server's id or `host:port`.
    pub(super) server: String,
    /// `weight`'s: `None` gives the file's back (an empty field).
    pub(super) weight: Option<u32>,
}

/// The anti-forgery token of a form's `body`: empty when missing (or the body unreadable),
/// refused as such. Read apart from the other fields, as it is checked before them (a 403
/// before any 400).
pub(super) fn token(body: &LocalBody) -> String {
    let LocalBody::Whole(bytes) = body else {
        return String::new();
    };
    let text = std::str::from_utf8(bytes).unwrap_or_default();
    pairs(text)
        .find(|(key, _)| key == "token")
        .map(|(_, value)| value)
        .unwrap_or_default()
}

impl Form {
    /// The form of `body`, or what is wrong with it (a 400's words).
    pub(super) fn read(body: &LocalBody) -> Result<Form, String> {
        let LocalBody::Whole(bytes) = body else {
            return Err("the form is too large".into());
        };
        let text = std::str::from_utf8(bytes).map_err(|_| "the form is not UTF-8".to_string())?;
        let (mut action, mut server, mut weight) = (None, None, None);
        for (key, value) in pairs(text) {
            match key.as_str() {
                "action" => action = Some(value),
                "server" => server = Some(value),
                "weight" => weight = Some(value),
                _ => {}
            }
        }
        let action = action.ok_or("the form names no action")?;
        let action = Action::named(&action).ok_or_else(|| {
            let names: Vec<&str> = ACTIONS.iter().map(|a| a.name()).collect();
            format!("no action `{action}`; the actions are {}", names.join(", "))
        })?;
        let server = server
            .filter(|s| !s.is_empty())
            .ok_or("the form names no server")?;
        let weight = match (action, weight.as_deref().map(str::trim)) {
            (Action::Weight, None | Some("")) => None,
            (Action::Weight, Some(w)) => Some(
                w.parse::<u32>()
                    .map_err(|_| format!("weight `{w}` is not a whole number"))?,
            ),
            _ => None,
        };
        Ok(Form {
            action,
            server,
            weight,
        })
    }
}

/// The action and server a confirmation's link names (`?action=disable&server=01`).
pub(super) fn asked(query: &[u8]) -> Option<(Action, String)> {
    let text = std::str::from_utf8(query).ok()?;
    let mut action = None;
    let mut server = None;
    for (key, value) in pairs(text) {
        match key.as_str() {
            "action" => action = Action::named(&value),
            "server" => server = Some(value),
            _ => {}
        }
    }
    Some((action?, server?))
}

/// The action and server a redirect after an action names (`?done=disable&server=01`).
pub(super) fn done(query: &[u8]) -> Option<(&'static str, String)> {
    let text = std::str::from_utf8(query).ok()?;
    let mut action = None;
    let mut server = None;
    for (key, value) in pairs(text) {
        match key.as_str() {
            "done" => action = Action::named(&value).map(Action::name),
            "server" => server = Some(value),
            _ => {}
        }
    }
    Some((action?, server?))
}

/// The `key=value` pairs of a form or query, decoded (`+` a space, `%XX` a byte).
fn pairs(text: &str) -> impl Iterator<Item = (String, String)> + '_ {
    text.split('&').filter(|p| !p.is_empty()).map(|pair| {
        let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
        (decode(key), decode(value))
    })
}

/// A form's value decoded: `+` a space, then its `%XX` escapes as a path's are.
fn decode(text: &str) -> String {
    percent_decode(&text.replace('+', " "))
}

/// `text` for a query string: unreserved characters as they are, the rest `%XX`.
pub(super) fn encode(text: &str) -> String {
    text.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' | b':' => {
                (b as char).to_string()
            }
            b => format!("%{b:02X}"),
        })
        .collect()
}

/// Why `request` is refused as coming from another site (a 403's words), or `None`: an
/// `Origin` that is not the scheme, host and port it was sent to (`null` included), or
/// `Sec-Fetch-Site: cross-site`. A request with neither (a script, an old browser) is left
/// to its token.
pub(super) fn cross_site(request: &LocalRequest) -> Option<String> {
    let site = request
        .value("sec-fetch-site")
        .map(|v| String::from_utf8_lossy(v).trim().to_ascii_lowercase());
    if site.as_deref() == Some("cross-site") {
        return Some("403 Forbidden: the form was sent from another site\n".into());
    }
    let origin = request.value("origin")?;
    let origin = String::from_utf8_lossy(origin).trim().to_ascii_lowercase();
    let host = request
        .value("host")
        .map(|h| String::from_utf8_lossy(h).trim().to_ascii_lowercase())
        .unwrap_or_default();
    let scheme = if request.tls { "https" } else { "http" };
    if same_origin(&origin, scheme, &host) {
        return None;
    }
    Some(format!(
        "403 Forbidden: the form was sent from {origin}, not from this page's {scheme}://{host}\n"
    ))
}

/// Whether `origin` (`https://broker:8443`) is `scheme` and `host` (the `Host` header), a
/// port left out counting as the scheme's own.
fn same_origin(origin: &str, scheme: &str, host: &str) -> bool {
    let Some(rest) = origin
        .strip_prefix(scheme)
        .and_then(|r| r.strip_prefix("://"))
    else {
        return false;
    };
    let default = if scheme == "https" { ":443" } else { ":80" };
    let with_port = |h: &str| {
        let bare = h.rsplit_once(']').map_or(h, |(_, after)| after);
        if bare.contains(':') {
            h.to_string()
        } else {
            format!("{h}{default}")
        }
    };
    !host.is_empty() && with_port(rest) == with_port(host)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::http::ClientAddr;

    #[test]
    fn forms_are_read_and_bad_fields_said() {
        let body = |t: &str| LocalBody::Whole(t.as_bytes().to_vec());
        let form = Form::read(&body(
            "action=weight&server=10.0.0.1%3A1234&weight=+5&token=t",
        ))
        .expect("reads");
        assert_eq!(form.action, Action::Weight);
        assert_eq!(form.server, "10.0.0.1:1234");
        assert_eq!(form.weight, Some(5));
        assert_eq!(token(&body("action=weight&token=t%2Bu&server=01")), "t+u");
        let again = Form::read(&body("action=weight&server=01&weight=")).expect("reads");
        assert_eq!(
            (again.weight, token(&body("action=weight"))),
            (None, String::new())
        );
        assert_eq!(token(&LocalBody::TooLarge), "");
        // An escape is two hex digits, as in a path: `%+f` is no escape.
        assert_eq!(token(&body("token=%2B%+f%4")), "+% f%4");
        for (text, says) in [
            ("server=01", "no action"),
            ("action=explode&server=01", "no action `explode`"),
            ("action=disable", "no server"),
            ("action=weight&server=01&weight=x", "not a whole number"),
        ] {
            assert!(
                Form::read(&body(text)).expect_err(text).contains(says),
                "{text}"
            );
        }
        assert!(Form::read(&LocalBody::TooLarge).is_err());
    }

    #[test]
    fn links_name_an_action_and_a_server() {
        assert_eq!(
            asked(b"action=cut&server=02"),
            Some((Action::Cut, "02".into()))
        );
        assert_eq!(asked(b"action=nuke&server=02"), None);
        assert_eq!(done(b"done=drain&server=01"), Some(("drain", "01".into())));
        assert_eq!(encode("a b:1"), "a%20b:1");
    }

    #[test]
    fn only_the_pages_own_origin_may_post() {
        let request = |tls: bool, lines: &[(&str, &str)]| {
            let mut r = LocalRequest::new(
                b"POST",
                b"/TOTVS_BROKER_QUERY/ADMIN",
                ClientAddr::Unknown,
                tls,
            );
            for (name, value) in lines {
                r.push_field(name.as_bytes(), value.as_bytes());
            }
            r
        };
        let host = ("Host", "broker:8443");
        for (tls, lines, refused) in [
            (true, vec![host, ("Origin", "https://broker:8443")], false),
            (
                true,
                vec![("Host", "broker"), ("Origin", "https://broker:443")],
                false,
            ),
            (true, vec![host], false),
            (true, vec![host, ("Origin", "http://broker:8443")], true),
            (true, vec![host, ("Origin", "https://evil:8443")], true),
            (true, vec![host, ("Origin", "null")], true),
            (true, vec![host, ("Sec-Fetch-Site", "cross-site")], true),
            (
                false,
                vec![("Host", "[::1]:5000"), ("Origin", "http://[::1]:5000")],
                false,
            ),
        ] {
            let r = request(tls, &lines);
            assert_eq!(cross_site(&r).is_some(), refused, "{lines:?}");
        }
    }
}
