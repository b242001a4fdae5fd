//! How a balancer counts one connection, decided by what it asks rather than when it arrives
//! (on either path: an HTTP connection, a TCP client):
//! nothing until it asks something; a query's place (`QUERY_MAX_CONNECTIONS`) while it asks
//! only the balancer's own queries; a client's place (`MAX_CONNECTIONS`, with the accepted
//! count and the last connection's time) from its first request forwarded to a server on. A
//! monitor polling the status page is never counted as a client, on an HTTP port as on a TCP
//! one. What the connection holds ([`Admission`]) is given back when it is dropped.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use crate::balancer::Balancer;
use crate::balancer::generation::Generation;
use crate::balancer::pick::ClientSlot;
use crate::balancer::rules::places::Place;

/// What a connection holds as its balancer counts it.
#[derive(Debug, Default)]
pub enum Admission {
    /// Nothing yet: it has asked nothing.
    #[default]
    Unknown,
    /// A query connection's place: it has asked only the balancer's own queries.
    Query(Place),
    /// A client's place: it has sent a request on to a server.
    Client(ClientSlot),
    /// A client whose place was given back while its connection waited
    /// ([`Admission::give_back`]): counted in the clients accepted already, never again. Its
    /// queries take a query place meanwhile; its next request to a server, a client's place.
    Counted(Option<Place>),
    /// One stream of a connection that carries several (HTTP/2): what it asks is counted on
    /// the connection's admission, which its streams share, so the connection takes one place
    /// however many streams it carries.
    Stream(Arc<Mutex<Admission>>),
}

impl Admission {
    /// The query place the connection holds, if any.
    fn query_place(&self) -> Option<&Place> {
        match self {
            Admission::Query(place) | Admission::Counted(Some(place)) => Some(place),
            Admission::Unknown
            | Admission::Client(_)
            | Admission::Counted(None)
            | Admission::Stream(_) => None,
        }
    }

    /// Whether the connection's query place went to another query while it idled: it is to
    /// close, unanswered.
    pub fn given_up(&self) -> bool {
        self.query_place().is_some_and(Place::is_given_up)
    }

    /// The client is forwarded: counted in the balancer's clients accepted, with the last
    /// connection's time (an HTTP connection at its first request to a server, a TCP client
    /// once its server is connected). A connection is counted once, whatever it gave back
    /// between its requests.
    pub fn forwarded(&self) {
        if let Admission::Client(slot) = self {
            slot.admit();
        }
    }

    /// The connection waits for its next request: a query connection's place may be given
    /// to a new query meanwhile (it then closes at its next request).
    pub fn waiting(&self) {
        if let Some(place) = self.query_place() {
            place.idle();
        }
    }

    /// A connection with no request in hand is sent one at once (an HTTP/2 stream; an
    /// HTTP/1.1 connection's bytes mark it in [`Balancer::admit_query`]): its query place
    /// is held again, not to be given up. False when it went to another query meanwhile.
    pub fn resumed(&self) -> bool {
        self.query_place().is_none_or(Place::busy)
    }

    /// The connection's place given back while it waits on what must hold none (a throttled
    /// sign-in's delay); a client stays counted as accepted, once.
    pub fn give_back(&mut self) {
        *self = match std::mem::take(self) {
            Admission::Client(_) | Admission::Counted(_) => Admission::Counted(None),
            Admission::Unknown | Admission::Query(_) => Admission::Unknown,
            // A stream's is its connection's: given back when no other stream of it is in
            // hand (the connection's hold and this stream's are all), as another may be
            // using it. Streams are served in their connection's task: none starts meanwhile.
            Admission::Stream(connection) => {
                if Arc::strong_count(&connection) == 2 {
                    connection
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .give_back();
                }
                Admission::Stream(connection)
            }
        };
    }

    /// A query place taken for a connection that holds none.
    fn with_query_place(&mut self, place: Place) {
        *self = match self {
            Admission::Counted(_) => Admission::Counted(Some(place)),
            _ => Admission::Query(place),
        };
    }
}

impl Balancer {
    /// A query on `admission`'s connection: counted in a query place unless the connection is
    /// a client already (its queries ride on its client's place). False when no query place is
    /// free (or the connection's went to another query while it was idle: see
    /// [`Admission::given_up`]): the query is answered 503 and the connection closed.
    pub fn admit_query(&self, admission: &mut Admission) -> bool {
        match admission {
            Admission::Stream(connection) => {
                let mut connection = connection.lock().unwrap_or_else(|p| p.into_inner());
                self.admit_query(&mut connection)
            }
            Admission::Client(_) => true,
            Admission::Query(place) | Admission::Counted(Some(place)) => place.busy(),
            Admission::Unknown | Admission::Counted(None) => match self.take_query_place() {
                Some(place) => {
                    admission.with_query_place(place);
                    true
                }
                None => false,
            },
        }
    }

    /// A connection asks to go to a server (an HTTP request to forward, a TCP client found
    /// to be no query): counted as a client from now on, under `generation`'s
    /// `MAX_CONNECTIONS` (a query place it held is given back). False when the limit is
    /// reached: the refusal counted and logged once per episode, naming `local` (the socket it
    /// came to, when known). The one admission of both paths; the client is counted as
    /// forwarded when its path says ([`Admission::forwarded`]).
    pub fn admit_client(
        self: &Arc<Self>,
        generation: &Generation,
        admission: &mut Admission,
        local: Option<SocketAddr>,
    ) -> bool {
        if matches!(admission, Admission::Client(_)) {
            return true;
        }
        let Some(slot) = self.try_take_slot(generation) else {
            self.refused(local);
            return false;
        };
        self.admitted();
        *admission = match admission {
            Admission::Counted(_) => Admission::Client(slot.counted_already()),
            _ => Admission::Client(slot),
        };
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::balancer::rules::places::QueryPlaces;

    #[test]
    fn a_stream_gives_its_connections_place_back_only_when_no_other_stream_is_in_hand() {
        let places = Arc::new(QueryPlaces::default());
        let place = places.take(1).unwrap_or_else(|| unreachable!());
        let connection = Arc::new(Mutex::new(Admission::Query(place)));
        let mut one = Admission::Stream(Arc::clone(&connection));
        let other = Admission::Stream(Arc::clone(&connection));
        one.give_back();
        assert_eq!(places.taken(), 1, "the other stream may be using it");
        drop(other);
        one.give_back();
        assert_eq!(places.taken(), 0);
        assert!(matches!(
            *connection.lock().unwrap_or_else(|p| p.into_inner()),
            Admission::Unknown
        ));
    }
}
