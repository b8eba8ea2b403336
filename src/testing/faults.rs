//! Deterministic fault injection between a client and a server.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use http::Extensions;
use reqwest_middleware::{Middleware, Next};
use tokio::io::AsyncReadExt;
use tokio::net::TcpListener;
use tokio::sync::OnceCell;

/// What happens to one attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// The attempt goes through untouched.
    None,
    /// The request reaches the server and is processed completely (the response body
    /// is read), then the response is dropped and the caller gets a connection error:
    /// the case idempotency keys exist for.
    LoseResponse,
    /// The request waits this long before it is sent.
    Delay(Duration),
    /// The connection is reset before the request reaches the server: nothing is
    /// processed, the caller gets a connection error.
    Reset,
}

impl Fault {
    /// A plan that cycles through `faults`, one per attempt overall (no faults when
    /// empty).
    pub fn cycle(faults: Vec<Fault>) -> impl Fn(Shot) -> Fault + Send + Sync + 'static {
        move |shot| {
            let len = faults.len() as u64;
            if len == 0 {
                return Fault::None;
            }
            usize::try_from(shot.attempt % len)
                .ok()
                .and_then(|i| faults.get(i).copied())
                .unwrap_or(Fault::None)
        }
    }

    /// A plan that draws each attempt's fault at `rates`, from a pseudo-random sequence
    /// fixed by `seed` and the attempt's overall number: the same seed and the same
    /// order of attempts give the same faults in every run.
    ///
    /// ```
    /// use idemkey::testing::{Fault, FaultRates, Shot};
    /// let plan = Fault::seeded(7, FaultRates { lose: 0.5, ..FaultRates::default() });
    /// let again = Fault::seeded(7, FaultRates { lose: 0.5, ..FaultRates::default() });
    /// let shot = |attempt| Shot { attempt, key_attempt: 0, key_index: 0 };
    /// assert!((0..100).all(|n| plan(shot(n)) == again(shot(n))));
    /// let lost = (0..1000).filter(|&n| plan(shot(n)) == Fault::LoseResponse).count();
    /// assert!((400..600).contains(&lost), "{lost}");
    /// ```
    pub fn seeded(seed: u64, rates: FaultRates) -> impl Fn(Shot) -> Fault + Send + Sync + 'static {
        move |shot| {
            // splitmix64: a well-mixed u64 per (seed, attempt), mapped into [0, 1).
            let mut z = seed ^ shot.attempt.wrapping_mul(0x9e37_79b9_7f4a_7c15);
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            z ^= z >> 31;
            let x = (z >> 11) as f64 / (1u64 << 53) as f64;
            if x < rates.lose {
                Fault::LoseResponse
            } else if x < rates.lose + rates.reset {
                Fault::Reset
            } else if x < rates.lose + rates.reset + rates.delay {
                Fault::Delay(rates.delay_by)
            } else {
                Fault::None
            }
        }
    }
}

/// How often [`Fault::seeded`] injects each fault: fractions of attempts in `[0, 1]`
/// (their sum at most 1).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct FaultRates {
    /// Responses lost after the server processed the request.
    pub lose: f64,
    /// Connections reset before the request reaches the server.
    pub reset: f64,
    /// Attempts delayed by `delay_by`.
    pub delay: f64,
    /// How long a delayed attempt waits.
    pub delay_by: Duration,
}

impl Default for FaultRates {
    /// No faults; delays of 50 ms when a delay rate is set.
    fn default() -> Self {
        Self {
            lose: 0.0,
            reset: 0.0,
            delay: 0.0,
            delay_by: Duration::from_millis(50),
        }
    }
}

/// Which attempt the plan decides for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shot {
    /// The attempt's number across every request through the injector (from 0).
    pub attempt: u64,
    /// The attempt's number among the attempts carrying the same idempotency key
    /// (from 0; requests without a key count as one key).
    pub key_attempt: u32,
    /// The key's number in the order the injector first saw each key (from 0).
    pub key_index: u64,
}

/// What a [`FaultInjector`] did so far.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct FaultStats {
    /// Attempts that passed through the injector.
    pub attempts: u64,
    /// Responses lost after the server processed the request.
    pub lost_responses: u64,
    /// Attempts delayed.
    pub delays: u64,
    /// Connections reset before the request reached the server.
    pub resets: u64,
}

/// A `reqwest_middleware` middleware that injects [`Fault`]s by a deterministic plan: a
/// function of the [`Shot`], the attempt's number overall and per idempotency key
/// (counted by the `Idempotency-Key` header, across this injector and its clones).
///
/// Errors it injects are genuine `reqwest::Error`s from a connection that a loopback
/// listener closes without answering, so retry strategies classify them like real
/// network failures (transient).
#[derive(Clone)]
pub struct FaultInjector {
    inner: Arc<Inner>,
}

struct Inner {
    plan: FaultPlan,
    dead_end: OnceCell<SocketAddr>,
    client: reqwest::Client,
}

/// A plan and its bookkeeping: numbers each attempt overall and per key, decides its
/// fault, and counts what was done. [`FaultInjector`] and
/// [`FaultProxy`](super::FaultProxy) are built on it; use it for a fault injector of
/// your own (the `idemkey proxy --faults` command line is one), with
/// [`FaultPlan::apply`] around the forwarding of a request.
///
/// ```
/// use idemkey::testing::{Fault, FaultPlan};
/// let plan = FaultPlan::new(Fault::cycle(vec![Fault::Reset, Fault::None]));
/// assert_eq!(plan.decide(Some(b"k-1")), Fault::Reset);
/// assert_eq!(plan.decide(Some(b"k-1")), Fault::None);
/// assert_eq!((plan.stats().attempts, plan.stats().resets), (2, 1));
/// ```
pub struct FaultPlan {
    plan: Box<dyn Fn(Shot) -> Fault + Send + Sync>,
    per_key: Mutex<HashMap<Vec<u8>, (u64, u32)>>,
    attempts: AtomicU64,
    lost: AtomicU64,
    delays: AtomicU64,
    resets: AtomicU64,
}

impl std::fmt::Debug for FaultPlan {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FaultPlan")
            .field("stats", &self.stats())
            .finish_non_exhaustive()
    }
}

impl FaultPlan {
    /// Decides each attempt's fault with `plan`.
    pub fn new(plan: impl Fn(Shot) -> Fault + Send + Sync + 'static) -> Self {
        Self {
            plan: Box::new(plan),
            per_key: Mutex::new(HashMap::new()),
            attempts: AtomicU64::new(0),
            lost: AtomicU64::new(0),
            delays: AtomicU64::new(0),
            resets: AtomicU64::new(0),
        }
    }

    /// The fault for the next attempt, which carries `key` (`None`: no key header).
    /// Counts a delay or a reset as decided; a lost response is counted by
    /// [`FaultPlan::lost`] once it was lost.
    pub fn decide(&self, key: Option<&[u8]>) -> Fault {
        let attempt = self.attempts.fetch_add(1, Ordering::SeqCst);
        let (key_index, key_attempt) = {
            let mut per_key = self
                .per_key
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            let next_index = per_key.len() as u64;
            let (index, n) = per_key
                .entry(key.unwrap_or_default().to_vec())
                .or_insert((next_index, 0));
            *n += 1;
            (*index, *n - 1)
        };
        let fault = (self.plan)(Shot {
            attempt,
            key_attempt,
            key_index,
        });
        match fault {
            Fault::Delay(_) => {
                self.delays.fetch_add(1, Ordering::SeqCst);
            }
            Fault::Reset => {
                self.resets.fetch_add(1, Ordering::SeqCst);
            }
            Fault::None | Fault::LoseResponse => {}
        }
        fault
    }

    /// Counts a response lost on purpose (after a [`Fault::LoseResponse`]).
    pub fn lost(&self) {
        self.lost.fetch_add(1, Ordering::SeqCst);
    }

    /// What the plan decided so far.
    #[must_use]
    pub fn stats(&self) -> FaultStats {
        FaultStats {
            attempts: self.attempts.load(Ordering::SeqCst),
            lost_responses: self.lost.load(Ordering::SeqCst),
            delays: self.delays.load(Ordering::SeqCst),
            resets: self.resets.load(Ordering::SeqCst),
        }
    }
}

impl std::fmt::Debug for FaultInjector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FaultInjector")
            .field("stats", &self.stats())
            .finish_non_exhaustive()
    }
}

impl FaultInjector {
    /// Injects `plan(shot)` into each attempt.
    ///
    /// ```
    /// use idemkey::testing::{Fault, FaultInjector};
    /// // Lose the response of every key's first attempt.
    /// let f = FaultInjector::new(|s| if s.key_attempt == 0 { Fault::LoseResponse } else { Fault::None });
    /// # let _ = f;
    /// ```
    pub fn new(plan: impl Fn(Shot) -> Fault + Send + Sync + 'static) -> Self {
        Self {
            inner: Arc::new(Inner {
                plan: FaultPlan::new(plan),
                dead_end: OnceCell::new(),
                client: reqwest::Client::new(),
            }),
        }
    }

    /// Cycles through `faults`, one per attempt overall (no faults when empty).
    #[must_use]
    pub fn sequence(faults: Vec<Fault>) -> Self {
        Self::new(Fault::cycle(faults))
    }

    /// Faults drawn at the given rates, deterministically from `seed` (see
    /// [`Fault::seeded`]).
    #[must_use]
    pub fn seeded(seed: u64, rates: FaultRates) -> Self {
        Self::new(Fault::seeded(seed, rates))
    }

    /// What the injector did so far.
    #[must_use]
    pub fn stats(&self) -> FaultStats {
        self.inner.plan.stats()
    }

    /// A connection error, made by a loopback listener that closes every connection
    /// after reading the request head.
    async fn connection_error(&self) -> reqwest_middleware::Error {
        let addr = self
            .inner
            .dead_end
            .get_or_try_init(|| async {
                let listener = TcpListener::bind(("127.0.0.1", 0)).await?;
                let addr = listener.local_addr()?;
                tokio::spawn(async move {
                    while let Ok((mut conn, _)) = listener.accept().await {
                        tokio::spawn(async move {
                            let mut buf = [0u8; 4096];
                            let mut seen = Vec::new();
                            while let Ok(n) = conn.read(&mut buf).await {
                                if n == 0 {
                                    break;
                                }
                                seen.extend_from_slice(&buf[..n]);
                                if seen.windows(4).any(|w| w == b"\r\n\r\n") {
                                    break;
                                }
                            }
                            // Dropped without an answer.
                        });
                    }
                });
                Ok::<_, std::io::Error>(addr)
            })
            .await;
        let addr = match addr {
            Ok(a) => *a,
            Err(e) => return reqwest_middleware::Error::middleware(e),
        };
        match self
            .inner
            .client
            .post(format!("http://{addr}/lost"))
            .send()
            .await
        {
            Err(e) => reqwest_middleware::Error::Reqwest(e),
            Ok(_) => reqwest_middleware::Error::middleware(std::io::Error::other(
                "fault injector: the dead-end listener answered",
            )),
        }
    }
}

#[async_trait::async_trait]
impl Middleware for FaultInjector {
    async fn handle(
        &self,
        req: reqwest::Request,
        extensions: &mut Extensions,
        next: Next<'_>,
    ) -> reqwest_middleware::Result<reqwest::Response> {
        let key = req
            .headers()
            .get(crate::protocol::headers::IDEMPOTENCY_KEY)
            .map(http::HeaderValue::as_bytes);
        match self.inner.plan.decide(key) {
            Fault::None => next.run(req, extensions).await,
            Fault::Delay(d) => {
                tokio::time::sleep(d).await;
                next.run(req, extensions).await
            }
            Fault::Reset => Err(self.connection_error().await),
            Fault::LoseResponse => {
                let resp = next.run(req, extensions).await?;
                // Read it all: the server has finished with this request.
                let _ = resp.bytes().await;
                self.inner.plan.lost();
                Err(self.connection_error().await)
            }
        }
    }
}
