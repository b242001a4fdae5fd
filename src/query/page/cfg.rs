//! The CFG page: every key of the effective configuration, by section, defaults marked.

use std::fmt::Write;

use super::head::{banner, head};
use super::words::esc;
use crate::config::{Config, ValueOrigin};
use crate::query::labels::of;
use crate::query::snapshot::Snapshot;

/// The CFG page: every key of the effective configuration, defaults marked.
pub fn config(snap: &Snapshot, config: &Config, host: &str) -> String {
    let l = of(snap.language);
    let mut out = String::with_capacity(16 * 1024);
    head(
        &mut out,
        l,
        &format!("appbroker CFG {}", config.source.display()),
        None,
    );
    banner(&mut out, l, snap, host);
    let _ = write!(
        out,
        "<div class='card'><h2>{} <small>{}</small></h2></div>",
        l.configuration,
        esc(&config.source.display().to_string())
    );
    for section in config.effective() {
        let _ = write!(
            out,
            "<div class='card'><h2>[{}]</h2><table><tr><th>{}</th><th>{}</th><th>{}</th></tr>",
            esc(&section.name),
            l.key,
            l.value,
            l.origin
        );
        for (key, value, origin) in &section.keys {
            let (class, from) = match origin {
                ValueOrigin::Section(line) => ("", format!("{} {line}", l.line)),
                ValueOrigin::General(line) => ("", format!("[General] {} {line}", l.line)),
                ValueOrigin::Default => (" class='muted'", l.default.to_string()),
            };
            let _ = write!(
                out,
                "<tr{class}><td>{}</td><td>{}</td><td>{from}</td></tr>",
                esc(key),
                esc(value)
            );
        }
        out.push_str("</table></div>");
    }
    out.push_str("</main></body></html>");
    out
}
