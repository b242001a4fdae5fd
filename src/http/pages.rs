//! The broker's own answers (no server available, a server that failed, a refused request):
//! a short HTML page in the balancer's language that says what happened, what was wrong with
//! the request when it was refused, and what to do.

use bytes::Bytes;
use hyper::StatusCode;

use super::refusal::{HeadFault, Refusal};
use crate::config::Language;

/// The title and the sentence of the page for `status`, when the server side failed.
fn words(status: StatusCode, language: Language) -> (&'static str, &'static str) {
    match (status.as_u16(), language) {
        (503, Language::English) => (
            "No server available",
            "No server of this service can take the request now. Try again in a few seconds.",
        ),
        (503, Language::Portuguese) => (
            "Nenhum servidor disponível",
            "Nenhum servidor deste serviço pode atender agora. Tente novamente em alguns segundos.",
        ),
        (502, Language::English) => (
            "Server failed",
            "The server failed while answering this request. Try again.",
        ),
        (502, Language::Portuguese) => (
            "Falha no servidor",
            "O servidor falhou ao responder esta requisição. Tente novamente.",
        ),
        (504, Language::English) => (
            "Server timed out",
            "The server did not answer this request in time. Try again.",
        ),
        (504, Language::Portuguese) => (
            "Tempo esgotado",
            "O servidor não respondeu esta requisição a tempo. Tente novamente.",
        ),
        (408, Language::English) => (
            "Request timed out",
            "The request's body stopped arriving before it was complete. Check the network and \
             try again.",
        ),
        (408, Language::Portuguese) => (
            "Tempo da requisição esgotado",
            "O corpo da requisição parou de chegar antes de completo. Verifique a rede e tente \
             novamente.",
        ),
        (_, Language::English) => (
            "Error",
            "The broker could not serve this request. Try again.",
        ),
        (_, Language::Portuguese) => (
            "Erro",
            "O broker não pôde atender esta requisição. Tente novamente.",
        ),
    }
}

/// The title of a request the broker refused as malformed, English then Portuguese.
const BAD: [&str; 2] = ["Bad request", "Requisição inválida"];
/// The title of a head refused for its size.
const LARGE: [&str; 2] = ["Headers too large", "Cabeçalhos grandes demais"];
/// The title of a request for what the broker does not do.
const NOT_IMPLEMENTED: [&str; 2] = ["Not implemented", "Não implementado"];

/// The title and the sentence of the page for `refusal`, English first, then Portuguese:
/// what was wrong with the request, and what to do where the client can do something.
fn refusal_words(refusal: Refusal) -> [(&'static str, &'static str); 2] {
    let ([en, pt], said) = match refusal {
        Refusal::Connect => (NOT_IMPLEMENTED, sentences::CONNECT),
        Refusal::TransferCoding => (NOT_IMPLEMENTED, sentences::TRANSFER_CODING),
        Refusal::Trace => (
            ["Method not allowed", "Método não permitido"],
            sentences::TRACE,
        ),
        Refusal::NoHost => (BAD, sentences::NO_HOST),
        Refusal::ManyHosts => (BAD, sentences::MANY_HOSTS),
        Refusal::BadHost => (BAD, sentences::BAD_HOST),
        Refusal::UserInfo => (BAD, sentences::USER_INFO),
        Refusal::AuthorityForm => (BAD, sentences::AUTHORITY_FORM),
        Refusal::TargetTooLong => (
            ["Address too long", "Endereço longo demais"],
            sentences::TARGET_TOO_LONG,
        ),
        Refusal::Version => (
            ["HTTP version not supported", "Versão HTTP não suportada"],
            sentences::VERSION,
        ),
        Refusal::Body => (BAD, sentences::BODY),
        Refusal::FrontCheck => (["Forbidden", "Proibido"], sentences::FRONT_CHECK),
        Refusal::Head(fault) => head_words(fault),
    };
    [(en, said[0]), (pt, said[1])]
}

/// The titles and sentences of a head that is not HTTP/1.1.
fn head_words(fault: HeadFault) -> ([&'static str; 2], [&'static str; 2]) {
    match fault {
        HeadFault::RequestLine => (BAD, sentences::REQUEST_LINE),
        HeadFault::Folded => (BAD, sentences::FOLDED),
        HeadFault::HeaderLine => (BAD, sentences::HEADER_LINE),
        HeadFault::ContentLength => (BAD, sentences::CONTENT_LENGTH),
        HeadFault::TransferEncoding => (BAD, sentences::TRANSFER_ENCODING),
        HeadFault::TooManyHeaders => (LARGE, sentences::TOO_MANY_HEADERS),
        HeadFault::TooLarge => (LARGE, sentences::TOO_LARGE),
        HeadFault::Malformed => (BAD, sentences::MALFORMED),
    }
}

/// What each refusal's page says, English then Portuguese: what was wrong with the request,
/// and what to do where the client can do something.
mod sentences {
    pub(super) const CONNECT: [&str; 2] = [
        "The broker does not pass CONNECT on: it forwards requests to its servers, it is \
         no tunnel to other addresses.",
        "O broker não repassa CONNECT: ele encaminha requisições aos seus servidores, não \
         é um túnel para outros endereços.",
    ];

    pub(super) const TRANSFER_CODING: [&str; 2] = [
        "The request's Transfer-Encoding names a coding other than chunked (or chunked \
         twice), which the broker cannot pass on: send the body with Content-Length, or \
         chunked only.",
        "O Transfer-Encoding da requisição traz uma codificação além de chunked (ou \
         chunked duas vezes), que o broker não repassa: envie o corpo com Content-Length, \
         ou só chunked.",
    ];

    pub(super) const TRACE: [&str; 2] = [
        "The broker does not pass TRACE on: the server would echo the whole request \
         back, cookies included.",
        "O broker não repassa TRACE: o servidor devolveria a requisição inteira, cookies \
         inclusive.",
    ];

    pub(super) const NO_HOST: [&str; 2] = [
        "An HTTP/1.1 request needs a Host header, and this one has none.",
        "Uma requisição HTTP/1.1 precisa do cabeçalho Host, e esta não o tem.",
    ];

    pub(super) const MANY_HOSTS: [&str; 2] = [
        "The request has more than one Host header; it must have exactly one.",
        "A requisição tem mais de um cabeçalho Host; deve ter exatamente um.",
    ];

    pub(super) const BAD_HOST: [&str; 2] = [
        "The request's Host (or the host in its address) is not a valid host: a name, an \
         IPv4 address or an IPv6 one in brackets, then :port if any, without blanks, \
         slashes or @.",
        "O Host da requisição (ou o host do seu endereço) não é um host válido: um nome, \
         um endereço IPv4 ou um IPv6 entre colchetes, e :porta se houver, sem espaços, \
         barras ou @.",
    ];

    pub(super) const USER_INFO: [&str; 2] = [
        "The request's address carries a user name (http://user@host/), which the broker \
         does not pass on.",
        "O endereço da requisição traz um nome de usuário (http://usuario@host/), que o \
         broker não repassa.",
    ];

    pub(super) const AUTHORITY_FORM: [&str; 2] = [
        "The request asks for a bare host:port, a form only CONNECT may use: ask for a \
         path, such as /.",
        "A requisição pede só host:porta, forma que apenas CONNECT pode usar: peça um \
         caminho, como /.",
    ];

    pub(super) const TARGET_TOO_LONG: [&str; 2] = [
        "The requested address is longer than the broker accepts (16 KiB).",
        "O endereço pedido é mais longo do que o broker aceita (16 KiB).",
    ];

    pub(super) const VERSION: [&str; 2] = [
        "The request speaks another HTTP version than 1.0 or 1.1, which this port does not \
         speak: send it as HTTP/1.1.",
        "A requisição fala outra versão de HTTP que não 1.0 ou 1.1, que esta porta não fala: \
         envie-a como HTTP/1.1.",
    ];

    pub(super) const BODY: [&str; 2] = [
        "The request's body could not be read: a chunk of its chunked encoding is \
         malformed, or the body ended before it was whole.",
        "O corpo da requisição não pôde ser lido: um trecho da codificação chunked está \
         malformado, ou o corpo terminou antes de vir inteiro.",
    ];

    pub(super) const REQUEST_LINE: [&str; 2] = [
        "The request's first line is not METHOD address HTTP/1.1, with one space \
         between them.",
        "A primeira linha da requisição não é MÉTODO endereço HTTP/1.1, com um espaço \
         entre eles.",
    ];

    pub(super) const FOLDED: [&str; 2] = [
        "A header of the request goes on over the next line (obsolete line folding), \
         which the broker refuses: write each header on one line.",
        "Um cabeçalho da requisição continua na linha seguinte (dobra de linha \
         obsoleta), que o broker recusa: escreva cada cabeçalho em uma só linha.",
    ];

    pub(super) const FRONT_CHECK: [&str; 2] = [
        "This connection is a front balancer's own health check (PROXY protocol LOCAL): \
         only /TOTVS_BROKER_QUERY/ is answered on it (READY, PING...), and no request is \
         forwarded to a server. Check an application path through a connection that names \
         a client.",
        "Esta conexão é a verificação de saúde do próprio balanceador à frente (PROXY \
         protocol LOCAL): nela só /TOTVS_BROKER_QUERY/ é respondido (READY, PING...), e \
         nenhuma requisição é encaminhada a um servidor. Verifique um caminho da aplicação \
         por uma conexão que nomeie um cliente.",
    ];

    pub(super) const HEADER_LINE: [&str; 2] = [
        "A header line of the request is not name: value (a blank before the colon, no \
         colon, or a control character).",
        "Uma linha de cabeçalho da requisição não é nome: valor (um espaço antes dos \
         dois-pontos, sem dois-pontos, ou um caractere de controle).",
    ];

    pub(super) const CONTENT_LENGTH: [&str; 2] = [
        "The request's Content-Length is not one number (a sign, a list, or two that \
         differ).",
        "O Content-Length da requisição não é um número só (um sinal, uma lista, ou dois \
         diferentes).",
    ];

    pub(super) const TRANSFER_ENCODING: [&str; 2] = [
        "The request's Transfer-Encoding is not allowed: in HTTP/1.0, or with a last \
         coding other than chunked.",
        "O Transfer-Encoding da requisição não é aceito: em HTTP/1.0, ou com a última \
         codificação diferente de chunked.",
    ];

    pub(super) const TOO_MANY_HEADERS: [&str; 2] = [
        "The request has more than 100 header lines.",
        "A requisição tem mais de 100 linhas de cabeçalho.",
    ];

    pub(super) const TOO_LARGE: [&str; 2] = [
        "The request's head (its first line and headers) is larger than 64 KiB, often \
         for too many cookies: clear this site's cookies and try again.",
        "O cabeçalho da requisição (primeira linha e cabeçalhos) passa de 64 KiB, muitas \
         vezes por cookies demais: apague os cookies deste site e tente novamente.",
    ];

    pub(super) const MALFORMED: [&str; 2] = [
        "The request's head is not valid HTTP/1.1: its first line or a header is \
         malformed.",
        "O cabeçalho da requisição não é HTTP/1.1 válido: a primeira linha ou um \
         cabeçalho está malformado.",
    ];
}

/// The title and sentence of `refusal` in `language`.
fn refused_words(refusal: Refusal, language: Language) -> (&'static str, &'static str) {
    let [en, pt] = refusal_words(refusal);
    match language {
        Language::English => en,
        Language::Portuguese => pt,
    }
}

/// The page for `refusal` in `language`.
pub(crate) fn refused(refusal: Refusal, language: Language) -> Bytes {
    let (title, sentence) = refused_words(refusal, language);
    Bytes::from(html(refusal.status().as_u16(), title, sentence, language))
}

/// The page for `status` in `language`.
pub(crate) fn page(status: StatusCode, language: Language) -> Bytes {
    let (title, sentence) = words(status, language);
    Bytes::from(html(status.as_u16(), title, sentence, language))
}

/// The short HTML page every answer of the broker's own uses.
fn html(code: u16, title: &str, sentence: &str, language: Language) -> String {
    format!(
        "<!DOCTYPE html>\n<html lang=\"{lang}\"><head><meta charset=\"utf-8\">\
         <title>{code} {title}</title></head>\n<body><h1>{code} {title}</h1>\n\
         <p>{sentence}</p>\n<p><small>appbroker</small></p></body></html>\n",
        lang = language.as_str(),
    )
}

/// The page of a plain HTTP request that reached a port speaking only TLS (400), saying to use
/// https; the engine's formatter makes it an answer (`engine::plain_http_to_tls_port`).
pub(crate) fn plain_http_to_tls_port(language: Language) -> Bytes {
    let (title, sentence) = match language {
        Language::English => (
            "Use https",
            "This port speaks HTTPS only: open the same address with https:// instead of http://.",
        ),
        Language::Portuguese => (
            "Use https",
            "Esta porta aceita somente HTTPS: abra o mesmo endereço com https:// em vez de http://.",
        ),
    };
    Bytes::from(html(400, title, sentence, language))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::http::h1::{MAX_FIELDS as MAX_HEADERS, MAX_HEAD, MAX_TARGET as MAX_REQUEST_LINE};

    #[test]
    fn every_page_is_in_its_language() {
        for code in [408, 502, 503, 504] {
            let Ok(status) = StatusCode::from_u16(code) else {
                panic!("status")
            };
            let en = String::from_utf8_lossy(&page(status, Language::English)).into_owned();
            let pt = String::from_utf8_lossy(&page(status, Language::Portuguese)).into_owned();
            assert!(en.contains(&format!("<h1>{code} ")), "{en}");
            assert!(en.contains("lang=\"en\""));
            assert!(pt.contains("lang=\"pt-BR\""));
            assert_ne!(
                words(status, Language::English).1,
                words(status, Language::Portuguese).1
            );
        }
        let pt = page(StatusCode::SERVICE_UNAVAILABLE, Language::Portuguese);
        assert!(String::from_utf8_lossy(&pt).contains("Nenhum servidor disponível"));
    }

    const REFUSALS: [Refusal; 20] = [
        Refusal::Connect,
        Refusal::Trace,
        Refusal::TransferCoding,
        Refusal::NoHost,
        Refusal::ManyHosts,
        Refusal::BadHost,
        Refusal::UserInfo,
        Refusal::AuthorityForm,
        Refusal::TargetTooLong,
        Refusal::Version,
        Refusal::Body,
        Refusal::FrontCheck,
        Refusal::Head(HeadFault::RequestLine),
        Refusal::Head(HeadFault::Folded),
        Refusal::Head(HeadFault::HeaderLine),
        Refusal::Head(HeadFault::ContentLength),
        Refusal::Head(HeadFault::TransferEncoding),
        Refusal::Head(HeadFault::TooManyHeaders),
        Refusal::Head(HeadFault::TooLarge),
        Refusal::Head(HeadFault::Malformed),
    ];

    #[test]
    fn every_refusal_says_what_was_wrong_in_each_language() {
        for (i, refusal) in REFUSALS.into_iter().enumerate() {
            let code = refusal.status().as_u16();
            for language in [Language::English, Language::Portuguese] {
                let (title, sentence) = refused_words(refusal, language);
                let page = String::from_utf8_lossy(&refused(refusal, language)).into_owned();
                assert!(page.contains(&format!("<h1>{code} {title}</h1>")), "{page}");
                assert!(page.contains(sentence), "{page}");
                assert!(page.contains(&format!("lang=\"{}\"", language.as_str())));
                for other in &REFUSALS[..i] {
                    assert_ne!(
                        refused_words(*other, language).1,
                        sentence,
                        "{refusal:?} says what {other:?} says"
                    );
                }
            }
            assert_ne!(
                refused_words(refusal, Language::English).1,
                refused_words(refusal, Language::Portuguese).1
            );
        }
        // The figures the pages give are the limits in force.
        let sentence = |r, l| refused_words(r, l).1;
        for language in [Language::English, Language::Portuguese] {
            let many = sentence(Refusal::Head(HeadFault::TooManyHeaders), language);
            assert!(many.contains(&format!(" {MAX_HEADERS} ")), "{many}");
            let large = sentence(Refusal::Head(HeadFault::TooLarge), language);
            assert!(
                large.contains(&format!(" {} KiB", MAX_HEAD / 1024)),
                "{large}"
            );
            let long = sentence(Refusal::TargetTooLong, language);
            assert!(
                long.contains(&format!("({} KiB)", MAX_REQUEST_LINE / 1024)),
                "{long}"
            );
        }
    }
}
