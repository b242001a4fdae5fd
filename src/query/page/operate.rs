//! ADMIN's pages, for a signed-in user: the page of actions (the summary, then a card per
//! server with its state and a row of actions, each a link to its confirmation), and the
//! confirmation of one action (what will happen, and the button that posts it with the
//! anti-forgery token). No JavaScript: a confirmation is a page of its own. The cards wrap to
//! one column on a phone (390 pixels), and their buttons to as many lines as they need.

use std::fmt::Write;

use super::head::{banner, head};
use super::status::summary;
use super::words::esc;
use crate::balancer::ServerState;
use crate::balancer::rules::overrides::Mode;
use crate::query::labels::of;
use crate::query::snapshot::{Snapshot, Standing};

/// Where the page is, for its links and forms.
const PATH: &str = "/TOTVS_BROKER_QUERY/ADMIN";

/// What the page of actions shows besides the snapshot.
#[derive(Debug)]
pub struct Operating<'a> {
    /// The balancer's state now.
    pub snapshot: &'a Snapshot,
    /// The host name the browser used.
    pub host: &'a str,
    /// The signed-in user.
    pub user: &'a str,
    /// The action just done and its server (the redirect after a POST says it).
    pub done: Option<(&'static str, String)>,
    /// Offered over plain HTTP to the network (`ADMIN_PLAIN_HTTP`): warned of.
    pub plain: bool,
    /// `RESTART_COMMAND` is set: restart is offered.
    pub restarts: bool,
}

/// The stylesheet of the actions, after the pages' own.
const STYLE: &str = "<style>\
.ops{display:grid;grid-template-columns:repeat(auto-fill,minmax(300px,1fr));gap:10px;margin-bottom:18px}\
.op{background:var(--card);border:1px solid var(--line);border-radius:8px;padding:10px 12px;min-width:0}\
.op h3{margin:0 0 4px;font-size:15px;overflow-wrap:anywhere}\
.op p{margin:0 0 8px;color:var(--muted)}\
.acts{display:flex;flex-wrap:wrap;gap:6px}\
.acts a,button{display:inline-block;padding:6px 12px;border:1px solid var(--line);border-radius:6px;\
background:#eef2f6;color:var(--ink);text-decoration:none;font:inherit;font-weight:600;cursor:pointer}\
.acts a.danger,button.danger{background:var(--badbg);color:var(--bad);border-color:#f3b8b3}\
.signed{margin:0 0 12px;color:var(--muted)}\
.done{background:var(--goodbg);color:var(--good);border:1px solid #b6dfc2;padding:8px 12px;border-radius:6px;margin-bottom:14px;font-weight:600}\
form label{display:block;margin:8px 0}\
form input[type=number]{font:inherit;padding:6px;width:8em}\
</style>";

/// The page of actions.
pub fn operate(o: &Operating<'_>) -> String {
    let snap = o.snapshot;
    let l = of(snap.language);
    let mut out = String::with_capacity(16 * 1024 + snap.state.servers.len() * 800);
    let title = format!("appbroker ADMIN [{}]", snap.state.kind.section());
    head(&mut out, l, &title, Some(30));
    out.push_str(STYLE);
    banner(&mut out, l, snap, o.host);
    if o.plain {
        out.push_str(
            "<div class='banner'>ADMIN_PLAIN_HTTP: this page is offered over plain HTTP, and \
             your password crosses the network in the clear. Use the balancer's TLS port.</div>",
        );
    }
    if let Some((action, server)) = &o.done {
        let _ = write!(
            out,
            "<div class='done'>{action} {}: done</div>",
            esc(server)
        );
    }
    let _ = write!(
        out,
        "<p class='signed'>Signed in as <b>{}</b>. Actions change this broker only (its state \
         file); on a pair, act on each (docs/high-availability.md). To sign out, close the \
         browser.</p>",
        esc(o.user)
    );
    summary(&mut out, l, snap);
    out.push_str("<section class='ops'>");
    for server in &snap.state.servers {
        card(&mut out, server, o.restarts);
    }
    out.push_str("</section></main></body></html>");
    out
}

/// A server's card: what it is, how it stands, and its actions.
fn card(out: &mut String, s: &ServerState, restarts: bool) {
    let held = s.overrides.hold.as_ref().map(|h| h.mode);
    let state = match (s.state, held) {
        (Standing::Disabled, Some(Mode::Drain)) | (Standing::Draining, _) => {
            format!("draining: {} left", connections(s.active))
        }
        (Standing::Disabled, _) => "disabled".to_string(),
        (Standing::Quarantined, _) => "in quarantine".to_string(),
        (Standing::Available, _) => "available".to_string(),
    };
    let weight = if s.weight == s.file_weight {
        format!("weight {}", s.weight)
    } else {
        format!("weight {} (file {})", s.weight, s.file_weight)
    };
    let _ = write!(
        out,
        "<div class='op'><h3>{} · {}</h3><p>{} · {} · {}</p><div class='acts'>",
        esc(&s.id),
        esc(&s.address),
        esc(&state),
        connections(s.active),
        weight
    );
    let offered = [
        ("disable", held != Some(Mode::Disabled)),
        ("drain", held != Some(Mode::Drain)),
        ("enable", held.is_some()),
        ("weight", true),
        ("release", s.quarantine.is_some()),
        ("restart", restarts),
        ("cut", s.active > 0),
    ];
    for (action, shown) in offered {
        if shown {
            let class = if matches!(action, "cut" | "restart") {
                " class='danger'"
            } else {
                ""
            };
            let _ = write!(
                out,
                "<a{class} href='{PATH}?action={action}&amp;server={}'>{action}</a>",
                esc(&s.id)
            );
        }
    }
    out.push_str("</div></div>");
}

/// `3 connections`.
fn connections(n: u64) -> String {
    if n == 1 {
        "1 connection".into()
    } else {
        format!("{n} connections")
    }
}

/// What `action` will do to `s`, in words.
fn consequence(action: &str, s: &ServerState) -> String {
    let open = connections(s.active);
    match action {
        "disable" => format!("No new clients go to it; its {open} stay."),
        "drain" => format!(
            "No new clients go to it; its {open} stay until they end, and the page shows them \
             leave."
        ),
        "enable" => "It takes new clients again.".into(),
        "weight" => format!(
            "Its share of new clients changes (now {}; the file says {}). Leave it empty to \
             give the file's back.",
            s.weight, s.file_weight
        ),
        "release" => "Its quarantine ends now, and it takes new clients at once.".into(),
        "restart" => {
            "RESTART_COMMAND runs for it now, unless RESTART_COOLDOWN holds it back.".into()
        }
        _ => format!("Its {open} are closed now: their users lose them."),
    }
}

/// The confirmation of `action` on `server`: what will happen, and the button.
pub fn confirm(snap: &Snapshot, s: &ServerState, action: &str, token: &str, host: &str) -> String {
    let l = of(snap.language);
    let mut out = String::with_capacity(12 * 1024);
    let title = format!("appbroker ADMIN: {action} {}", s.address);
    head(&mut out, l, &title, None);
    out.push_str(STYLE);
    banner(&mut out, l, snap, host);
    let _ = write!(
        out,
        "<div class='card'><h2>{action} {} · {} of [{}]?</h2><p>{}</p><p class='muted'>This \
         changes this broker only.</p><form method='post' action='{PATH}'>\
         <input type='hidden' name='action' value='{action}'>\
         <input type='hidden' name='server' value='{}'>\
         <input type='hidden' name='token' value='{}'>",
        esc(&s.id),
        esc(&s.address),
        snap.state.kind.section(),
        esc(&consequence(action, s)),
        esc(&s.id),
        esc(token)
    );
    if action == "weight" {
        let _ = write!(
            out,
            "<label>Weight (0 to 1000) <input type='number' name='weight' min='0' max='1000' \
             value='{}'></label>",
            s.weight
        );
    }
    let class = if matches!(action, "cut" | "restart") {
        " class='danger'"
    } else {
        ""
    };
    let _ = write!(
        out,
        "<div class='acts'><button type='submit'{class}>{action}</button><a href='{PATH}'>cancel</a>\
         </div></form></div></main></body></html>"
    );
    out
}
