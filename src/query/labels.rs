//! The pages' words in English and Brazilian Portuguese (`LANGUAGE` in `[General]`). The
//! Portuguese ones follow the TOTVS broker's page (`conexões ativas`, `Quarentena`, ...), which
//! TOTVS operators know. The broker's own messages (a connect's or a check's error, why a
//! quarantine ended) are English where they are made; [`Labels::words`] puts them in the
//! page's language.

use std::borrow::Cow;

use crate::config::Language;

/// Every label a page uses.
#[cfg_attr(test, derive(serde::Serialize))]
pub struct Labels {
    pub lang: &'static str,
    pub on: &'static str,
    pub option: &'static str,
    pub version: &'static str,
    pub started: &'static str,
    pub now: &'static str,
    pub instance: &'static str,
    pub queried_by: &'static str,
    pub certificate: &'static str,
    pub certificate_issuer: &'static str,
    pub certificate_expires: &'static str,
    pub upstream_unverified: &'static str,
    pub active_connections: &'static str,
    pub active_connection: &'static str,
    /// `1 of 1 server available`, `2 of 3 servers available`: by the count of servers.
    pub servers_available: (&'static str, &'static str),
    pub of: &'static str,
    pub in_quarantine: &'static str,
    /// `1 disabled`, `2 disabled` (by an operator).
    pub disabled_count: (&'static str, &'static str),
    /// `1 draining` (weight 0, or drained by an operator).
    pub draining_count: (&'static str, &'static str),
    pub total: &'static str,
    pub last_connection: &'static str,
    pub max_simultaneous: &'static str,
    pub peak: &'static str,
    pub refused: &'static str,
    pub unserved: &'static str,
    pub policy: &'static str,
    pub monitor: &'static str,
    pub every: &'static str,
    pub quarantine_time: &'static str,
    pub server: &'static str,
    pub connections: &'static str,
    pub quarantine: &'static str,
    pub sessions: &'static str,
    pub active_sessions: &'static str,
    /// `1 session moved` (to another server: its own could not take it).
    pub session_moved: &'static str,
    /// `3 sessions moved`.
    pub sessions_moved: &'static str,
    pub quarantine_since: &'static str,
    pub reasons: &'static str,
    pub requests: &'static str,
    pub answers_5xx: &'static str,
    pub upgrades: &'static str,
    pub http2_now: &'static str,
    pub streams: &'static str,
    pub id: &'static str,
    pub weight: &'static str,
    pub state: &'static str,
    pub total_short: &'static str,
    pub failed_connects: &'static str,
    pub bytes_in: &'static str,
    pub bytes_out: &'static str,
    pub last_check: &'static str,
    pub available: &'static str,
    pub quarantined: &'static str,
    pub draining_server: &'static str,
    pub disabled_server: &'static str,
    /// `disabled by uid 0`.
    pub by: &'static str,
    /// A weight an operator set (`ctl weight`), and the file's.
    pub weight_set: &'static str,
    pub weight_file: &'static str,
    /// `Error at 12:03:04`.
    pub at: &'static str,
    pub chart: &'static str,
    pub chart_note: &'static str,
    pub chart_now: &'static str,
    pub until: &'static str,
    pub by_monitor: &'static str,
    pub by_connect: &'static str,
    pub by_timeout: &'static str,
    pub by_operator: &'static str,
    /// Beside a server `RESTART_COMMAND` ran for: `restarted 18:04:05, exit 0`.
    pub restarted: &'static str,
    pub draining: &'static str,
    pub refresh: &'static str,
    pub off: &'static str,
    pub other_balancers: &'static str,
    pub configuration: &'static str,
    pub key: &'static str,
    pub value: &'static str,
    pub origin: &'static str,
    pub line: &'static str,
    pub default: &'static str,
    pub history: &'static str,
    pub start: &'static str,
    pub end: &'static str,
    pub duration: &'static str,
    pub reason: &'static str,
    pub error: &'static str,
    pub released: &'static str,
    pub ongoing: &'static str,
    pub none: &'static str,
    pub never: &'static str,
    pub failed: &'static str,
    pub back: &'static str,
    /// `Sessions (3, max 5)`.
    pub max: &'static str,
    /// `… 12 more` (sessions not listed).
    pub more: &'static str,
    pub hidden: &'static str,
    pub ready_accepting: &'static str,
    pub ready_no_server: &'static str,
    pub ready_full: &'static str,
    pub ready_shutting_down: &'static str,
    /// ADMIN's pages (the page of actions and its confirmations).
    pub operate: &'static OperateLabels,
}

const EN: Labels = Labels {
    lang: "en",
    on: "on",
    option: "Option",
    version: "Version",
    started: "Started",
    now: "Now",
    instance: "Instance id",
    queried_by: "Queried by",
    certificate: "TLS certificate",
    certificate_issuer: "Issued by",
    certificate_expires: "Valid until",
    upstream_unverified: "SSL_UPSTREAM_VERIFY=0: the servers' certificates are not verified; \
                          the connections to them are encrypted but not authenticated",
    active_connections: "active connections",
    active_connection: "active connection",
    servers_available: ("server available", "servers available"),
    of: "of",
    in_quarantine: "in quarantine",
    disabled_count: ("disabled", "disabled"),
    draining_count: ("draining", "draining"),
    total: "Connections since start",
    last_connection: "Last connection",
    max_simultaneous: "Maximum simultaneous connections",
    peak: "peak",
    refused: "Refused at MAX_CONNECTIONS",
    unserved: "Closed, no server available",
    policy: "Balancing method",
    monitor: "Monitor",
    every: "every",
    quarantine_time: "Quarantine time",
    server: "Server",
    connections: "Connections",
    quarantine: "Quarantine",
    sessions: "Sessions",
    active_sessions: "active sessions",
    session_moved: "session moved",
    sessions_moved: "sessions moved",
    quarantine_since: "Quarantine since",
    reasons: "Reasons",
    requests: "HTTP requests since start",
    answers_5xx: "5xx answers (the servers' and the broker's)",
    upgrades: "WebSockets opened since start",
    http2_now: "HTTP/2 connections now",
    streams: "requests in hand",
    id: "Id",
    weight: "Weight",
    state: "State",
    total_short: "Total",
    failed_connects: "Failed connects",
    bytes_in: "Bytes from clients",
    bytes_out: "Bytes to clients",
    last_check: "Last check",
    available: "available",
    quarantined: "quarantined",
    draining_server: "draining (weight 0)",
    disabled_server: "disabled by an operator",
    by: "by",
    weight_set: "set by an operator",
    weight_file: "file",
    at: "at",
    chart: "Active connections per server, sampled each minute (up to an hour)",
    chart_note: "a dot is a sample; a line holds its value until the next one",
    chart_now: "now",
    until: "until",
    by_monitor: "monitor",
    by_connect: "client connect",
    by_timeout: "response timeout",
    by_operator: "operator",
    restarted: "restarted",
    draining: "Shutting down: PING answers 503 while clients are still served",
    refresh: "Auto-refresh",
    off: "off",
    other_balancers: "Other balancers",
    configuration: "Configuration",
    key: "Key",
    value: "Value",
    origin: "From",
    line: "line",
    default: "default",
    history: "Quarantine history",
    start: "Start",
    end: "End",
    duration: "Duration",
    reason: "Reason",
    error: "Error",
    released: "Released because",
    ongoing: "ongoing",
    none: "none",
    never: "never",
    failed: "failed",
    back: "Back to the status page",
    max: "max",
    more: "more",
    hidden: "(not shown: only to clients every balancer's QUERY_ALLOW admits)",
    ready_accepting: "accepting clients",
    ready_no_server: "no server available",
    ready_full: "reached: new clients are closed at once",
    ready_shutting_down: "shutting down (SHUTDOWN_GRACE): new clients will soon be refused",
    operate: &EN_OPERATE,
};

const PT_BR: Labels = Labels {
    lang: "pt-BR",
    on: "em",
    option: "Opção",
    version: "Versão",
    started: "Iniciou operação",
    now: "Agora",
    instance: "Instância de execução com id",
    queried_by: "Consulta efetuada pelo client",
    certificate: "Certificado TLS",
    certificate_issuer: "Emitido por",
    certificate_expires: "Válido até",
    upstream_unverified: "SSL_UPSTREAM_VERIFY=0: os certificados dos servidores não são \
                          verificados; as conexões com eles são cifradas mas não autenticadas",
    active_connections: "conexões ativas",
    active_connection: "conexão ativa",
    servers_available: ("servidor disponível", "servidores disponíveis"),
    of: "de",
    in_quarantine: "em quarentena",
    disabled_count: ("desabilitado", "desabilitados"),
    draining_count: ("drenando", "drenando"),
    total: "Conexões desde o início da operação",
    last_connection: "Última conexão",
    max_simultaneous: "Número máximo de conexões simultâneas",
    peak: "pico",
    refused: "Recusadas em MAX_CONNECTIONS",
    unserved: "Encerradas sem servidor disponível",
    policy: "Método de balanceamento",
    monitor: "Monitoramento",
    every: "a cada",
    quarantine_time: "Tempo de quarentena",
    server: "Server",
    connections: "Conexões",
    quarantine: "Quarentena",
    sessions: "Sessões",
    active_sessions: "sessões ativas",
    session_moved: "sessão movida",
    sessions_moved: "sessões movidas",
    quarantine_since: "Início ocorrência",
    reasons: "Motivos",
    requests: "Requisições HTTP desde o início",
    answers_5xx: "Respostas 5xx (dos servidores e do broker)",
    upgrades: "WebSockets abertos desde o início",
    http2_now: "Conexões HTTP/2 agora",
    streams: "requisições em andamento",
    id: "Id",
    weight: "Peso",
    state: "Estado",
    total_short: "Total",
    failed_connects: "Conexões com falha",
    bytes_in: "Bytes dos clientes",
    bytes_out: "Bytes para os clientes",
    last_check: "Última verificação",
    available: "disponível",
    quarantined: "em quarentena",
    draining_server: "drenando (peso 0)",
    disabled_server: "desabilitado por um operador",
    by: "por",
    weight_set: "definido por um operador",
    weight_file: "arquivo",
    at: "às",
    chart: "Conexões ativas por servidor, amostradas a cada minuto (até uma hora)",
    chart_note: "cada ponto é uma amostra; a linha mantém o valor até a seguinte",
    chart_now: "agora",
    until: "até",
    by_monitor: "monitor",
    by_connect: "conexão de cliente",
    by_timeout: "tempo de resposta",
    by_operator: "operador",
    restarted: "reiniciado",
    draining: "Encerrando: PING responde 503 enquanto os clientes ainda são atendidos",
    refresh: "Atualização automática",
    off: "desligada",
    other_balancers: "Outros balanceadores",
    configuration: "Configuração",
    key: "Chave",
    value: "Valor",
    origin: "Origem",
    line: "linha",
    default: "padrão",
    history: "Histórico de quarentena",
    start: "Início",
    end: "Fim",
    duration: "Duração",
    reason: "Motivo",
    error: "Erro",
    released: "Liberado porque",
    ongoing: "em andamento",
    none: "nenhuma",
    never: "nunca",
    failed: "falhou",
    back: "Voltar à página de status",
    max: "máx.",
    more: "a mais",
    hidden: "(oculto: só para clientes admitidos pelo QUERY_ALLOW de todos os balanceadores)",
    ready_accepting: "aceitando conexões",
    ready_no_server: "nenhum servidor disponível",
    ready_full: "atingido: novas conexões são encerradas de imediato",
    ready_shutting_down: "encerrando (SHUTDOWN_GRACE): novas conexões serão recusadas em breve",
    operate: &PT_BR_OPERATE,
};

/// ADMIN's words. A consequence's `{open}` is the server's open connections in words
/// (`3 connections`), `{weight}` and `{file}` its weights.
#[cfg_attr(test, derive(serde::Serialize))]
pub struct OperateLabels {
    pub signed_in: &'static str,
    pub this_broker: &'static str,
    pub this_broker_short: &'static str,
    pub plain: &'static str,
    pub done: &'static str,
    pub available: &'static str,
    pub disabled: &'static str,
    pub quarantined: &'static str,
    /// `draining: {open} left`.
    pub draining: &'static str,
    /// `1 connection`, `3 connections`.
    pub connections: (&'static str, &'static str),
    pub weight: &'static str,
    pub file: &'static str,
    pub cancel: &'static str,
    pub weight_field: &'static str,
    /// Each action's button, in the order of [`ACTION_NAMES`].
    pub actions: [&'static str; 7],
    /// What each action will do, in the same order.
    pub consequences: [&'static str; 7],
    /// A restart the cooldown holds back: `{cooldown}`, and from when (`{at}`) the page can
    /// restart the server again (it cannot force one, as `ctl restart --force` does).
    pub cooling: &'static str,
    /// A restart refused while the server's runs.
    pub restarting: &'static str,
    /// A restart refused without `RESTART_COMMAND`.
    pub no_command: &'static str,
    /// A restart refused at `RESTART_MAX_PARALLEL` (`{n}` running).
    pub busy: &'static str,
}

/// The actions' names in forms and links, in the order of [`OperateLabels::actions`].
const ACTION_NAMES: [&str; 7] = [
    "disable", "drain", "enable", "weight", "release", "restart", "cut",
];

const EN_OPERATE: OperateLabels = OperateLabels {
    signed_in: "Signed in as",
    this_broker: "Actions change this broker only (its state file); on a pair, act on each \
                  (docs/high-availability.md). To sign out, close the browser.",
    this_broker_short: "This changes this broker only.",
    plain: "ADMIN_PLAIN_HTTP: this page is offered over plain HTTP, and your password crosses \
            the network in the clear. Use the balancer's TLS port.",
    done: "done",
    available: "available",
    disabled: "disabled",
    quarantined: "in quarantine",
    draining: "draining: {open} left",
    connections: ("connection", "connections"),
    weight: "weight",
    file: "file",
    cancel: "cancel",
    weight_field: "Weight (0 to 1000)",
    actions: [
        "disable", "drain", "enable", "weight", "release", "restart", "cut",
    ],
    consequences: [
        "No new clients go to it; its {open} stay.",
        "No new clients go to it; its {open} stay until they end, and the page shows them leave.",
        "It takes new clients again.",
        "Its share of new clients changes (now {weight}; the file says {file}). Leave it empty to give the file's back.",
        "Its quarantine ends now, and it takes new clients at once.",
        "RESTART_COMMAND runs for it now, unless RESTART_COOLDOWN holds it back.",
        "Its {open} are closed now: their users lose them.",
    ],
    cooling: "it was restarted less than RESTART_COOLDOWN ({cooldown}) ago; this page can \
              restart it again from {at}",
    restarting: "it is being restarted now",
    no_command: "RESTART_COMMAND is not set for this balancer",
    busy: "restarts running now: {n}, as many as RESTART_MAX_PARALLEL allows",
};

const PT_BR_OPERATE: OperateLabels = OperateLabels {
    signed_in: "Conectado como",
    this_broker: "As ações mudam só este broker (o seu arquivo de estado); num par, aja em cada \
                  um (docs/high-availability.md). Para sair, feche o navegador.",
    this_broker_short: "Isto muda só este broker.",
    plain: "ADMIN_PLAIN_HTTP: esta página é oferecida em HTTP sem criptografia, e a sua senha \
            atravessa a rede às claras. Use a porta TLS do balanceador.",
    done: "feito",
    available: "disponível",
    disabled: "desabilitado",
    quarantined: "em quarentena",
    draining: "drenando: {open} restantes",
    connections: ("conexão", "conexões"),
    weight: "peso",
    file: "arquivo",
    cancel: "cancelar",
    weight_field: "Peso (0 a 1000)",
    actions: [
        "desabilitar",
        "drenar",
        "habilitar",
        "peso",
        "liberar",
        "reiniciar",
        "cortar",
    ],
    consequences: [
        "Nenhum cliente novo vai para ele; as suas {open} ficam.",
        "Nenhum cliente novo vai para ele; as suas {open} ficam até terminarem, e a página as mostra saindo.",
        "Ele volta a receber clientes novos.",
        "A sua parte dos clientes novos muda (agora {weight}; o arquivo diz {file}). Deixe vazio para voltar ao do arquivo.",
        "A sua quarentena termina agora, e ele recebe clientes novos de imediato.",
        "O RESTART_COMMAND roda para ele agora, a menos que o RESTART_COOLDOWN o impeça.",
        "As suas {open} são fechadas agora: os seus usuários as perdem.",
    ],
    cooling: "ele foi reiniciado há menos do RESTART_COOLDOWN ({cooldown}); esta página pode \
              reiniciá-lo de novo a partir de {at}",
    restarting: "ele está sendo reiniciado agora",
    no_command: "o RESTART_COMMAND não está definido para este balanceador",
    busy: "reinícios rodando agora: {n}, tantos quanto o RESTART_MAX_PARALLEL permite",
};

impl OperateLabels {
    /// The button of `action`.
    pub fn action(&self, action: &str) -> &'static str {
        ACTION_NAMES
            .iter()
            .position(|name| *name == action)
            .map_or("?", |at| self.actions[at])
    }

    /// What `action` will do, its placeholders still in.
    pub fn consequence(&self, action: &str) -> &'static str {
        ACTION_NAMES
            .iter()
            .position(|name| *name == action)
            .map_or("", |at| self.consequences[at])
    }

    /// `1 connection`, `3 conexões`.
    pub fn count(&self, n: u64) -> String {
        let (one, many) = self.connections;
        format!("{n} {}", if n == 1 { one } else { many })
    }
}

/// The labels of `language`.
pub fn of(language: Language) -> &'static Labels {
    match language {
        Language::English => &EN,
        Language::Portuguese => &PT_BR,
    }
}

impl Labels {
    /// `text`, a message of the broker's (an error in words, a reason), in this language.
    /// Text the broker did not write itself (an operating system's words it has no
    /// translation for) stays as it came.
    pub fn words<'a>(&self, text: &'a str) -> Cow<'a, str> {
        if self.lang == EN.lang {
            Cow::Borrowed(text)
        } else {
            portuguese(text)
        }
    }
}

/// Messages whose whole text is known, in Portuguese. Operating-system words are matched in
/// any case (`Connection reset by peer` as `connection reset by peer`).
const PT_PHRASES: &[(&str, &str)] = &[
    ("connection refused", "conexão recusada"),
    ("timed out", "tempo esgotado"),
    ("connection timed out", "tempo de conexão esgotado"),
    ("network is unreachable", "rede inacessível"),
    ("network unreachable", "rede inacessível"),
    ("no route to host", "sem rota para o host"),
    ("host is unreachable", "host inacessível"),
    ("host unreachable", "host inacessível"),
    ("network is down", "rede fora do ar"),
    ("network down", "rede fora do ar"),
    (
        "connection reset by peer",
        "conexão reiniciada pelo outro lado",
    ),
    ("connection reset", "conexão reiniciada"),
    ("connection aborted", "conexão abortada"),
    ("software caused connection abort", "conexão abortada"),
    ("permission denied", "permissão negada"),
    ("too many open files", "arquivos abertos demais"),
    (
        "cannot assign requested address",
        "endereço local indisponível",
    ),
    ("address not available", "endereço local indisponível"),
    ("no buffer space available", "sem espaço de buffer"),
    ("out of memory", "sem memória"),
    ("name or service not known", "nome ou serviço desconhecido"),
    (
        "temporary failure in name resolution",
        "falha temporária na resolução de nomes",
    ),
    (
        "no address associated with hostname",
        "nome sem endereço associado",
    ),
    (
        "no reply: the port accepts but the application does not answer",
        "sem resposta: a porta aceita conexões, mas a aplicação não responde",
    ),
    ("closed without replying", "fechou a conexão sem responder"),
    ("the check task failed", "a verificação falhou internamente"),
    ("monitor check passed", "passou na verificação do monitor"),
    ("quarantine time is up", "o tempo de quarentena acabou"),
    (
        "a client connected to it",
        "um cliente conseguiu conectar-se a ele",
    ),
];

/// Messages that start with known words and go on with a name, a duration or quoted bytes:
/// (English start, Portuguese start).
const PT_STARTS: &[(&str, &str)] = &[
    ("timed out after ", "tempo esgotado após "),
    ("incomplete reply ", "resposta incompleta "),
    ("unexpected reply ", "resposta inesperada "),
    ("closed after ", "fechou a conexão após "),
    ("failed to lookup address information: ", ""),
    // An operator's quarantine (health::OperatorAsk::words); who and why stay as they came.
    ("asked by ", "pedida por "),
];

fn portuguese(text: &str) -> Cow<'_, str> {
    if let Some((_, pt)) = PT_PHRASES
        .iter()
        .find(|(en, _)| en.eq_ignore_ascii_case(text))
    {
        return Cow::Borrowed(pt);
    }
    for (en, pt) in PT_STARTS {
        if let Some(rest) = strip_prefix_ignore_case(text, en) {
            return Cow::Owned(format!("{pt}{}", portuguese(rest)));
        }
    }
    // `cannot resolve NAME: why` and `NAME resolves to no address` (forward::connect).
    if let Some(rest) = strip_prefix_ignore_case(text, "cannot resolve ") {
        return Cow::Owned(match rest.split_once(": ") {
            Some((name, why)) => format!("não foi possível resolver {name}: {}", portuguese(why)),
            None => format!("não foi possível resolver {rest}"),
        });
    }
    // `did not answer N requests within T` (an HTTP balancer's timeout quarantine).
    if let Some((count, within)) = strip_prefix_ignore_case(text, "did not answer ")
        .and_then(|rest| rest.split_once(" requests within "))
    {
        return Cow::Owned(format!("não respondeu a {count} requisições em {within}"));
    }
    if let Some(name) = text.strip_suffix(" resolves to no address") {
        return Cow::Owned(format!("{name} não resolve para nenhum endereço"));
    }
    Cow::Borrowed(text)
}

fn strip_prefix_ignore_case<'a>(text: &'a str, prefix: &str) -> Option<&'a str> {
    let head = text.get(..prefix.len())?;
    head.eq_ignore_ascii_case(prefix)
        .then(|| &text[prefix.len()..])
}

#[cfg(test)]
mod tests {
    use serde_json::Value;

    use super::*;

    /// Every label but `lang` (a pair's two as two), by its field's name: read through serde,
    /// so a label added is a label the test below checks.
    fn all(labels: &Labels) -> Vec<String> {
        let Value::Object(fields) = serde_json::to_value(labels).expect("labels serialize") else {
            panic!("labels serialize as a map");
        };
        let mut words = Vec::new();
        for (_, value) in fields.into_iter().filter(|(name, _)| name != "lang") {
            flatten(value, &mut words);
        }
        words
    }

    /// The words of `value`: a label, a pair or list of them, or a group of labels (ADMIN's).
    fn flatten(value: Value, words: &mut Vec<String>) {
        match value {
            Value::Array(list) => list.into_iter().for_each(|v| flatten(v, words)),
            Value::Object(group) => group.into_iter().for_each(|(_, v)| flatten(v, words)),
            word => words.push(word.as_str().expect("a label is words").to_string()),
        }
    }

    #[test]
    fn the_broker_s_messages_are_put_in_portuguese() {
        let pt = of(Language::Portuguese);
        for (en, wanted) in [
            ("connection refused", "conexão recusada"),
            (
                "Connection reset by peer",
                "conexão reiniciada pelo outro lado",
            ),
            ("timed out after 1s", "tempo esgotado após 1s"),
            (
                "unexpected reply `HTTP/1.1`",
                "resposta inesperada `HTTP/1.1`",
            ),
            (
                "cannot resolve app01.example: failed to lookup address information: Name or \
                 service not known",
                "não foi possível resolver app01.example: nome ou serviço desconhecido",
            ),
            (
                "app01 resolves to no address",
                "app01 não resolve para nenhum endereço",
            ),
            ("quarantine time is up", "o tempo de quarentena acabou"),
            (
                "did not answer 3 requests within 600s",
                "não respondeu a 3 requisições em 600s",
            ),
        ] {
            assert_eq!(pt.words(en), wanted);
        }
        assert_eq!(
            of(Language::English).words("connection refused"),
            "connection refused"
        );
        assert_eq!(
            pt.words("something new"),
            "something new",
            "unknown: as it came"
        );
    }

    #[test]
    fn every_label_differs_between_the_languages_or_is_the_same_word_in_both() {
        // Words spelled alike in both languages (TOTVS's own page says `Servers`, `Server`).
        const SHARED: &[&str] = &["Id", "Total", "Servers", "Server", "monitor", "OK"];
        let (en, pt) = (of(Language::English), of(Language::Portuguese));
        for (a, b) in all(en).into_iter().zip(all(pt)) {
            assert!(
                a != b || SHARED.contains(&a.as_str()),
                "{a:?} is not translated"
            );
        }
    }
}
