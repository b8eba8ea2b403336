//! Single flight per key: concurrent calls of one client with the same key and the same
//! request share one in-flight request and its answer.

use std::collections::HashMap;
use std::collections::hash_map::Entry;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use bytes::Bytes;
use http::{HeaderMap, Method};
use reqwest::{Request, Response};
use tokio::sync::watch;
use tokio::time::Instant;

use super::buffered::Buffered;
use super::error::{Error, Kind};
use super::outcome::error_chain;
use super::response::IdempotencyInfo;
use crate::IdempotencyKey;

/// The flights in the air, by key. Shared by the clones of one retry middleware.
#[derive(Debug, Default)]
pub(crate) struct Flights {
    in_air: Mutex<HashMap<IdempotencyKey, Arc<Flight>>>,
}

#[derive(Debug)]
struct Flight {
    request: Identity,
    followers: AtomicUsize,
    answer: watch::Sender<Option<Shared>>,
}

/// What makes two calls the same call: method, URL, headers and body.
#[derive(Debug, PartialEq)]
pub(crate) struct Identity {
    method: Method,
    url: reqwest::Url,
    headers: HeaderMap,
    body: Option<Bytes>,
}

impl Identity {
    pub(crate) fn of(req: &Request) -> Self {
        Self {
            method: req.method().clone(),
            url: req.url().clone(),
            headers: req.headers().clone(),
            body: req
                .body()
                .and_then(reqwest::Body::as_bytes)
                .map(Bytes::copy_from_slice),
        }
    }
}

/// One answer, in a form every caller can get a copy of.
#[derive(Debug, Clone)]
enum Shared {
    Response(Buffered),
    Error {
        kind: Kind,
        attempts: u32,
        response: Option<Buffered>,
    },
}

enum Role<'a> {
    Lead(Lead<'a>),
    Follow(watch::Receiver<Option<Shared>>),
    /// Another request with the same key is in the air: wait for it to land.
    Wait(watch::Receiver<Option<Shared>>),
}

impl Flights {
    /// Runs `go` as the one flight of `key`, or waits for the flight already in the air
    /// with an equal request and returns a copy of its answer. A call whose request
    /// differs waits for that flight to land, then flies itself (the server judges it).
    /// A follower gives up at `deadline` (outcome unknown) and flies itself when the
    /// leader was dropped before landing.
    pub(crate) async fn run<F, Fut>(
        &self,
        key: IdempotencyKey,
        request: Identity,
        deadline: Option<Instant>,
        go: F,
    ) -> reqwest_middleware::Result<Response>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = reqwest_middleware::Result<Response>>,
    {
        let mut request = Some(request);
        let mut go = Some(go);
        loop {
            let (mut rx, follow) = match self.join(&key, &mut request) {
                Role::Lead(lead) => {
                    #[allow(clippy::expect_used)]
                    let go = go
                        .take()
                        .expect("a call leads once: it returns after landing");
                    let result = go().await;
                    return lead.land(result).await;
                }
                Role::Follow(rx) => (rx, true),
                Role::Wait(rx) => (rx, false),
            };
            let landed = async {
                rx.wait_for(Option::is_some)
                    .await
                    .ok()
                    .and_then(|answer| answer.clone())
            };
            let landed = match deadline {
                Some(at) => match Box::pin(tokio::time::timeout_at(at, landed)).await {
                    Ok(landed) => landed,
                    Err(_) => return Err(deadline_passed(&key)),
                },
                None => Box::pin(landed).await,
            };
            if let (Some(answer), true) = (landed, follow) {
                return answer.copy();
            }
            // Landed for another request, or abandoned by its leader: try again.
        }
    }

    /// Joins the flight of `key`, or starts it (taking `request`).
    fn join(&self, key: &IdempotencyKey, request: &mut Option<Identity>) -> Role<'_> {
        let mut in_air = self.in_air.lock().unwrap_or_else(PoisonError::into_inner);
        match in_air.entry(key.clone()) {
            Entry::Occupied(flight) => {
                let flight = flight.get();
                let rx = flight.answer.subscribe();
                if request.as_ref() == Some(&flight.request) {
                    flight.followers.fetch_add(1, Ordering::Relaxed);
                    Role::Follow(rx)
                } else {
                    Role::Wait(rx)
                }
            }
            Entry::Vacant(slot) => {
                #[allow(clippy::expect_used)]
                let request = request
                    .take()
                    .expect("only a leader takes the request, and a leader returns");
                let flight = Arc::new(Flight {
                    request,
                    followers: AtomicUsize::new(0),
                    answer: watch::Sender::new(None),
                });
                slot.insert(Arc::clone(&flight));
                Role::Lead(Lead {
                    flights: self,
                    key: key.clone(),
                    flight,
                    landed: false,
                })
            }
        }
    }

    /// Takes `flight` out of the air (if it is still there) and says how many calls
    /// joined it.
    fn land(&self, key: &IdempotencyKey, flight: &Arc<Flight>) -> usize {
        let mut in_air = self.in_air.lock().unwrap_or_else(PoisonError::into_inner);
        if in_air.get(key).is_some_and(|f| Arc::ptr_eq(f, flight)) {
            in_air.remove(key);
        }
        flight.followers.load(Ordering::Relaxed)
    }
}

fn deadline_passed(key: &IdempotencyKey) -> reqwest_middleware::Error {
    Error::new(
        Kind::OutcomeUnknown {
            key: key.clone(),
            cause: "the overall deadline passed while a concurrent call with the same key was \
                    in flight"
                .into(),
            source: None,
        },
        0,
        None,
    )
    .into()
}

/// The leading call of a flight. Dropped before it lands (the caller went away), it
/// takes the flight out of the air, and the followers fly themselves.
struct Lead<'a> {
    flights: &'a Flights,
    key: IdempotencyKey,
    flight: Arc<Flight>,
    landed: bool,
}

impl Lead<'_> {
    /// Hands the answer to the followers (buffered, when there are any) and returns the
    /// leader's own.
    async fn land(
        mut self,
        result: reqwest_middleware::Result<Response>,
    ) -> reqwest_middleware::Result<Response> {
        self.landed = true;
        if self.flights.land(&self.key, &self.flight) == 0 {
            return result;
        }
        let shared = Shared::capture(&self.key, result).await;
        let mine = shared.own();
        self.flight.answer.send_replace(Some(shared));
        mine
    }
}

impl Drop for Lead<'_> {
    fn drop(&mut self) {
        if !self.landed {
            self.flights.land(&self.key, &self.flight);
        }
    }
}

impl Shared {
    /// The leader's answer, read to its end.
    async fn capture(key: &IdempotencyKey, result: reqwest_middleware::Result<Response>) -> Self {
        let (kind, attempts, response) = match result {
            Ok(response) => {
                let attempts = response
                    .extensions()
                    .get::<IdempotencyInfo>()
                    .map_or(1, IdempotencyInfo::attempts);
                match Buffered::read(response).await {
                    Ok(buffered) => return Self::Response(buffered),
                    Err(e) => (read_failed(key, e), attempts, None),
                }
            }
            Err(err) => match Error::try_from_middleware(err) {
                Ok(ours) => {
                    let (kind, attempts, response) = ours.into_parts();
                    let response = match response {
                        Some(r) => Buffered::read(r).await.ok(),
                        None => None,
                    };
                    (kind, attempts, response)
                }
                Err(other) => (
                    Kind::OutcomeUnknown {
                        key: key.clone(),
                        cause: error_chain(&other),
                        source: Some(Arc::new(other)),
                    },
                    0,
                    None,
                ),
            },
        };
        Self::Error {
            kind,
            attempts,
            response,
        }
    }

    /// The leader's copy.
    fn own(&self) -> reqwest_middleware::Result<Response> {
        self.answer(false)
    }

    /// A follower's copy: the same answer, marked as shared.
    fn copy(&self) -> reqwest_middleware::Result<Response> {
        self.answer(true)
    }

    fn answer(&self, shared: bool) -> reqwest_middleware::Result<Response> {
        let respond = |b: &Buffered| {
            let mut b = b.clone();
            if let Some(info) = b.extensions_mut().get_mut::<IdempotencyInfo>() {
                info.set_shared(shared);
            }
            b.into_response()
        };
        match self {
            Self::Response(b) => Ok(respond(b)),
            Self::Error {
                kind,
                attempts,
                response,
            } => Err(Error::new(kind.clone(), *attempts, response.as_ref().map(respond)).into()),
        }
    }
}

fn read_failed(key: &IdempotencyKey, e: reqwest::Error) -> Kind {
    let e = reqwest_middleware::Error::Reqwest(e);
    Kind::OutcomeUnknown {
        key: key.clone(),
        cause: format!("reading the answer's body failed: {}", error_chain(&e)),
        source: Some(Arc::new(e)),
    }
}
