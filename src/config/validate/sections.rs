//! Which sections are what: `[General]`, the balancer sections, and the sections appbroker
//! ignores (a full AppServer ini has many); a section given twice and a misspelt balancer
//! section are errors. Any section whose name starts with `BALANCE_HTTP` is an HTTP balancer
//! (TOTVS sites name them `[BALANCE_HTTP]`, `[BALANCE_HTTP_2]`...); `[BALANCE_HTML]`, the
//! older name, is one too, with a notice.

use std::collections::BTreeMap;

use super::super::{BalancerKind, ConfigError};
use super::{Section, Validator, suggest};

/// The sections that matter, each once.
pub struct Sections<'a> {
    /// `[General]`, when there is one.
    pub general: Option<&'a Section>,
    /// The balancer sections, in file order.
    pub balancers: Vec<(BalancerKind, &'a Section)>,
}

impl Validator {
    /// Sorts `sections` out, recording the errors and the notice of ignored sections.
    pub(super) fn sections<'a>(&mut self, sections: &'a [Section]) -> Sections<'a> {
        let mut seen: BTreeMap<String, usize> = BTreeMap::new();
        let mut found = Sections {
            general: None,
            balancers: Vec::new(),
        };
        let mut ignored = Vec::new();
        for section in sections {
            if let Some(first) = seen.insert(section.name.clone(), section.line) {
                self.errors.push(ConfigError::new(
                    section.line,
                    &section.written,
                    None,
                    format!(
                        "the section appears twice (first at line {first}); merge them into one"
                    ),
                ));
                continue;
            }
            match section.name.as_str() {
                "GENERAL" => found.general = Some(section),
                name => match BalancerKind::from_section(name) {
                    Some(kind) if name == "BALANCE_HTML" => {
                        self.notices.push(ConfigError::new(
                            section.line,
                            &section.written,
                            None,
                            "is the older name of [BALANCE_HTTP]; it is read as an HTTP \
                             balancer (rename it when convenient)",
                        ));
                        found.balancers.push((kind, section));
                    }
                    Some(kind) => found.balancers.push((kind, section)),
                    None if name.starts_with("BALANCE_") => self.unknown_balancer(section),
                    None => ignored.push(format!("[{}]", section.written)),
                },
            }
        }
        if !ignored.is_empty() {
            self.notices.push(ConfigError {
                line: None,
                section: None,
                key: None,
                message: format!(
                    "ignoring sections appbroker does not use: {}",
                    ignored.join(", ")
                ),
            });
        }
        if found.balancers.is_empty() {
            self.errors.push(ConfigError {
                line: None,
                section: None,
                key: None,
                message: "no balancer section; add [BALANCE_SMART_CLIENT_DESKTOP], \
                          [BALANCE_WEB_SERVICES] or [BALANCE_HTTP] with LOCAL_SERVER_PORT and \
                          REMOTE_SERVER_01"
                    .into(),
            });
        }
        found
    }

    /// A `[BALANCE_...]` section that is none appbroker knows: probably a typo.
    fn unknown_balancer(&mut self, section: &Section) {
        let known = [
            BalancerKind::SmartClientDesktop.section(),
            BalancerKind::WebServices.section(),
            "BALANCE_HTTP",
        ];
        let hint = suggest(&section.name, &known)
            .map(|s| format!("did you mean [{s}]?"))
            .unwrap_or_else(|| {
                "expected [BALANCE_SMART_CLIENT_DESKTOP], [BALANCE_WEB_SERVICES] or \
                 [BALANCE_HTTP...]"
                    .into()
            });
        self.errors.push(ConfigError::new(
            section.line,
            &section.written,
            None,
            format!("unknown balancer section; {hint}"),
        ));
    }
}
