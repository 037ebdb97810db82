//! crest's Amazon SQS-compatible HTTP API: a gateway that speaks SQS's AWS JSON 1.0 protocol
//! (what current AWS SDKs, boto3 and the AWS CLI send) and its older query protocol (form
//! parameters, XML answers), and serves both with crest's SDK.
//!
//! A request is checked for its AWS Signature Version 4 against the gateway's access keys
//! ([`AccessKey`]); each key acts as a crest principal, through SDK clients of its own
//! that present the key's crest credential, so the tree applies that principal's permissions
//! exactly as for native clients. A queue is a topic of the key's namespace; a message's
//! `Priority` attribute (a Number, lower is more urgent) is its crest priority. What each
//! operation does, and what is refused: docs/sqs.md.

mod api;
pub mod client;
mod connections;
pub mod digest;
pub mod error;
#[doc(hidden)]
pub mod fuzzing;
pub mod keys;
mod manage;
mod moves;
mod params;
mod permissions;
mod query;
pub mod queues;
pub mod sigv4;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{Request, State as Shared};
use axum::response::{IntoResponse, Response};
use crest_core::config::Settings;
use crest_sdk::Admin;
use crest_sdk::Credential;
use crest_sdk::{Consumer, ConsumerConfig};
use crest_sdk::{Producer, ProducerConfig};
use error::SqsError;
use http_body_util::BodyExt;
use queues::{Queue, QueueName};
use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};
use tokio::sync::{OnceCell, Semaphore};

pub use api::PRIORITY_ATTRIBUTE;

/// An access key: what a client signs with, and the crest principal it acts as.
#[derive(Clone)]
pub struct AccessKey {
    /// The access key id (`AWS_ACCESS_KEY_ID`).
    pub id: String,
    /// The secret access key (`AWS_SECRET_ACCESS_KEY`).
    pub secret: String,
    /// The namespace its queues live in.
    pub namespace: String,
    /// How its clients prove the principal to the tree.
    pub credential: Credential,
}

impl std::fmt::Debug for AccessKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AccessKey")
            .field("id", &self.id)
            .field("namespace", &self.namespace)
            .finish_non_exhaustive()
    }
}

/// How a gateway runs.
#[derive(Clone, Debug)]
pub struct GatewayConfig {
    /// Where it listens for HTTP.
    pub listen: SocketAddr,
    /// The gateway's own region: its queues' URLs and topics carry no region; a request
    /// signed for another region names that region's queues, each region a space of its own.
    pub region: String,
    /// The producer settings its keys' producers start from (their credential replaced).
    pub producer: ProducerConfig,
    /// The consumer settings its keys' consumers and admins start from.
    pub consumer: ConsumerConfig,
    /// The access keys it accepts.
    pub keys: Vec<AccessKey>,
    /// Largest request body, in bytes (`gateway_body_bytes_max`).
    pub body_bytes_max: usize,
    /// Most requests served at once (`gateway_requests_max`).
    pub requests_max: usize,
    /// Most of them one access key's (`gateway_requests_per_key_max`).
    pub requests_per_key_max: u32,
    /// How long a queue's attributes read from the tree are used (`gateway_queue_cache_ms`;
    /// this gateway's own changes show at once).
    pub queue_cache: Duration,
    /// How long a short poll waits for a first message (`gateway_short_poll_ms`).
    pub short_poll: Duration,
    /// Most queues whose attributes each access key's cache holds (`gateway_queue_cache_max`).
    pub queue_cache_max: usize,
    /// Most message move tasks remembered (`gateway_move_tasks_max`).
    pub move_tasks_max: usize,
    /// Most connections open at once (`gateway_connections_max`).
    pub connections_max: u32,
    /// Most connections open at once from one client address
    /// (`gateway_connections_per_address_max`).
    pub connections_per_address_max: u32,
    /// How long a connection may take to send a request's headers, or to start its next
    /// request (`gateway_header_timeout_ms`).
    pub header_timeout: Duration,
    /// How long a request may take to send its body (`gateway_body_timeout_ms`).
    pub body_timeout: Duration,
    /// Most body bytes held of requests not verified yet
    /// (`gateway_unauthenticated_bytes_max`).
    pub unauthenticated_bytes_max: u32,
    /// Most parameters of a query-protocol request (`gateway_query_params_max`).
    pub query_params_max: usize,
}

impl GatewayConfig {
    /// Region `us-east-1` and the bounds of [`Settings::default`] (`gateway_*`).
    pub fn new(
        listen: SocketAddr,
        producer: ProducerConfig,
        consumer: ConsumerConfig,
        keys: Vec<AccessKey>,
    ) -> GatewayConfig {
        GatewayConfig {
            listen,
            region: "us-east-1".into(),
            producer,
            consumer,
            keys,
            body_bytes_max: 0,
            requests_max: 0,
            requests_per_key_max: 0,
            queue_cache: Duration::ZERO,
            short_poll: Duration::ZERO,
            queue_cache_max: 0,
            move_tasks_max: 0,
            connections_max: 0,
            connections_per_address_max: 0,
            header_timeout: Duration::ZERO,
            body_timeout: Duration::ZERO,
            unauthenticated_bytes_max: 0,
            query_params_max: 0,
        }
        .with_settings(&Settings::default())
    }

    /// The bounds of `settings` (`gateway_*`).
    pub fn with_settings(mut self, settings: &Settings) -> GatewayConfig {
        self.body_bytes_max =
            usize::try_from(settings.gateway_body_bytes_max).unwrap_or(usize::MAX);
        self.requests_max = settings.gateway_requests_max as usize;
        // A share above the whole is the whole.
        self.requests_per_key_max = settings
            .gateway_requests_per_key_max
            .min(settings.gateway_requests_max);
        self.queue_cache = Duration::from_millis(settings.gateway_queue_cache_ms);
        self.short_poll = Duration::from_millis(settings.gateway_short_poll_ms);
        self.queue_cache_max = settings.gateway_queue_cache_max as usize;
        self.move_tasks_max = settings.gateway_move_tasks_max as usize;
        self.connections_max = settings.gateway_connections_max;
        self.connections_per_address_max = settings
            .gateway_connections_per_address_max
            .min(settings.gateway_connections_max);
        self.header_timeout = Duration::from_millis(settings.gateway_header_timeout_ms);
        self.body_timeout = Duration::from_millis(settings.gateway_body_timeout_ms);
        self.unauthenticated_bytes_max =
            u32::try_from(settings.gateway_unauthenticated_bytes_max).unwrap_or(u32::MAX);
        self.query_params_max = settings.gateway_query_params_max as usize;
        self
    }
}

/// Queues read from the tree, and when (`None`: no such queue then).
type QueueCache = HashMap<QueueName, (Instant, Option<Queue>)>;

/// The SDK clients of one access key, connected on first use, and the queues it looked up.
struct Clients {
    producer: OnceCell<Producer>,
    consumer: OnceCell<Consumer>,
    admin: OnceCell<Admin>,
    producer_config: ProducerConfig,
    consumer_config: ConsumerConfig,
    /// Queues read from the tree with this key's permissions, and when (`None`: no such
    /// queue then).
    queues: Mutex<QueueCache>,
}

/// The client in `cell`, connected with `connect` on first use.
async fn connected<T, F>(cell: &OnceCell<T>, connect: impl FnOnce() -> F) -> Result<&T, SqsError>
where
    F: Future<Output = Result<T, crest_sdk::ClientError>>,
{
    cell.get_or_try_init(connect)
        .await
        .map_err(error::tree_error)
}

impl Clients {
    async fn producer(&self) -> Result<&Producer, SqsError> {
        let config = self.producer_config.clone();
        connected(&self.producer, || Producer::connect(config)).await
    }

    async fn consumer(&self) -> Result<&Consumer, SqsError> {
        let config = self.consumer_config.clone();
        connected(&self.consumer, || Consumer::connect(config)).await
    }

    async fn admin(&self) -> Result<&Admin, SqsError> {
        let config = self.consumer_config.clone();
        connected(&self.admin, || Admin::connect(config)).await
    }

    /// The queue `name` as the tree keeps it, read again if the cached copy is older than
    /// `config.queue_cache`.
    async fn queue(&self, config: &GatewayConfig, name: &QueueName) -> Result<Queue, SqsError> {
        let cached = self.cached(name, config.queue_cache)?;
        let found = match cached {
            Some(found) => found,
            None => self.fetch(config, name).await?,
        };
        found.ok_or_else(SqsError::no_queue)
    }

    /// The queue `name` read from the tree now, and cached.
    async fn fetch(
        &self,
        config: &GatewayConfig,
        name: &QueueName,
    ) -> Result<Option<Queue>, SqsError> {
        let admin = self.admin().await?;
        let answer = admin
            .config(&name.topic())
            .await
            .map_err(error::tree_error)?;
        let found = answer.value.as_ref().and_then(Queue::from_config);
        self.remember(config, name, found.clone())?;
        Ok(found)
    }

    fn cached(&self, name: &QueueName, ttl: Duration) -> Result<Option<Option<Queue>>, SqsError> {
        let queues = self.lock_queues()?;
        Ok(queues
            .get(name)
            .filter(|(at, _)| at.elapsed() < ttl)
            .map(|(_, queue)| queue.clone()))
    }

    /// Caches what the tree keeps of `name` (`None`: no such queue).
    fn remember(
        &self,
        config: &GatewayConfig,
        name: &QueueName,
        queue: Option<Queue>,
    ) -> Result<(), SqsError> {
        let mut queues = self.lock_queues()?;
        if queues.len() >= config.queue_cache_max && !queues.contains_key(name) {
            queues.retain(|_, (at, _)| at.elapsed() < config.queue_cache);
            if queues.len() >= config.queue_cache_max {
                queues.clear();
            }
        }
        queues.insert(name.clone(), (Instant::now(), queue));
        Ok(())
    }

    fn lock_queues(&self) -> Result<std::sync::MutexGuard<'_, QueueCache>, SqsError> {
        self.queues
            .lock()
            .map_err(|_| SqsError::unavailable("the queue cache is unusable"))
    }
}

/// Who sent a request: its verified access key, and the host it addressed (queue URLs
/// name it).
pub(crate) struct Caller {
    key_id: String,
    /// The key's secret: what the sender of a message it sends is stamped with.
    secret: String,
    namespace: String,
    /// The region the request was signed for, when not the gateway's own: the queues it
    /// names by name are that region's.
    region: Option<String>,
    host: String,
    /// The request's `X-Amzn-Trace-Id` header: a sent message's `AWSTraceHeader` unless the
    /// message gives its own.
    trace: Option<String>,
}

impl Caller {
    /// The queue a request's `QueueUrl` names (its URL, or its bare name in the caller's
    /// namespace and region; `home`: the gateway's region).
    fn addressed(&self, url: &str, home: &str) -> Result<QueueName, SqsError> {
        QueueName::addressed(url, &self.namespace, self.region.as_deref(), home)
    }
}

/// What the handlers share.
pub(crate) struct State {
    config: GatewayConfig,
    keys: HashMap<String, AccessKey>,
    clients: Mutex<HashMap<String, Arc<Clients>>>,
    /// The latest move tasks, oldest first (`move_tasks_max`).
    tasks: Mutex<VecDeque<moves::MoveTask>>,
    requests: Semaphore,
    /// Requests served now, by access key (`requests_per_key_max`).
    by_key: Mutex<HashMap<String, u32>>,
    /// Body bytes of requests not verified yet (`unauthenticated_bytes_max`).
    unauthenticated: Semaphore,
    /// Numbers the query protocol's answers (`RequestId`).
    request_ids: std::sync::atomic::AtomicU64,
}

impl State {
    fn tasks(&self) -> Result<std::sync::MutexGuard<'_, VecDeque<moves::MoveTask>>, SqsError> {
        self.tasks
            .lock()
            .map_err(|_| SqsError::unavailable("the move task list is unusable"))
    }

    fn clients(&self, caller: &Caller) -> Result<Arc<Clients>, SqsError> {
        let mut clients = self
            .clients
            .lock()
            .map_err(|_| SqsError::unavailable("the client table is unusable"))?;
        let key = &self.keys[&caller.key_id];
        let entry = clients.entry(caller.key_id.clone()).or_insert_with(|| {
            let mut producer = self.config.producer.clone();
            producer.tls = producer.tls.clone().with_credential(key.credential.clone());
            let mut consumer = self.config.consumer.clone();
            consumer.tls = consumer.tls.clone().with_credential(key.credential.clone());
            Arc::new(Clients {
                producer: OnceCell::new(),
                consumer: OnceCell::new(),
                admin: OnceCell::new(),
                producer_config: producer,
                consumer_config: consumer,
                queues: Mutex::new(HashMap::new()),
            })
        });
        Ok(entry.clone())
    }
}

/// A running gateway.
pub struct Gateway {
    addr: SocketAddr,
    task: tokio::task::JoinHandle<()>,
}

impl Gateway {
    /// Binds `config.listen` and serves until dropped or [`Gateway::stop`]ped.
    ///
    /// # Errors
    /// The listening socket could not be bound.
    pub async fn start(config: GatewayConfig) -> std::io::Result<Gateway> {
        let listener = tokio::net::TcpListener::bind(config.listen).await?;
        Gateway::serve(config, listener)
    }

    /// Serves on `listener`, bound already (socket activation: a TCP socket the caller
    /// holds), until dropped or stopped.
    ///
    /// # Errors
    /// The socket cannot be used by tokio.
    pub fn start_on(
        config: GatewayConfig,
        listener: std::net::TcpListener,
    ) -> std::io::Result<Gateway> {
        listener.set_nonblocking(true)?;
        Gateway::serve(config, tokio::net::TcpListener::from_std(listener)?)
    }

    fn serve(config: GatewayConfig, listener: tokio::net::TcpListener) -> std::io::Result<Gateway> {
        let addr = listener.local_addr()?;
        let state = Arc::new(State {
            keys: config
                .keys
                .iter()
                .map(|k| (k.id.clone(), k.clone()))
                .collect(),
            clients: Mutex::new(HashMap::new()),
            tasks: Mutex::new(VecDeque::new()),
            requests: Semaphore::new(config.requests_max),
            by_key: Mutex::new(HashMap::new()),
            unauthenticated: Semaphore::new(config.unauthenticated_bytes_max as usize),
            request_ids: std::sync::atomic::AtomicU64::new(1),
            config: config.clone(),
        });
        let app = Router::new().fallback(handle).with_state(state);
        let task = tokio::spawn(connections::accept(listener, app, config));
        Ok(Gateway { addr, task })
    }

    /// Where it listens.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Stops serving.
    pub fn stop(&self) {
        self.task.abort();
    }
}

impl Drop for Gateway {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn handle(Shared(state): Shared<Arc<State>>, request: Request) -> Response {
    // AWS JSON 1.0 names its operation in `X-Amz-Target`; the query protocol in `Action`.
    let json = request.headers().contains_key("x-amz-target");
    // A query-protocol request may ask for its answer as JSON (SQS negotiates on `Accept`).
    let accepts_json = request
        .headers()
        .get("accept")
        .is_some_and(|v| v.as_bytes().starts_with(b"application/json"));
    let result = serve(&state, request).await;
    if json {
        match result {
            Ok((_, value)) => (
                [("content-type", "application/x-amz-json-1.0")],
                value.to_string(),
            )
                .into_response(),
            Err(error) => error.into_response(),
        }
    } else {
        let id = state
            .request_ids
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let id = format!("{id:016x}");
        match result {
            Ok((action, value)) if accepts_json => {
                let answer = serde_json::json!({
                    format!("{action}Response"): {
                        format!("{action}Result"): value,
                        "ResponseMetadata": { "RequestId": id },
                    }
                });
                ([("content-type", "application/json")], answer.to_string()).into_response()
            }
            Ok((action, value)) => query::render(&action, &id, Ok(value)),
            Err(error) => query::render("", &id, Err(error)),
        }
    }
}

/// Verifies `request` and runs its operation: answers the operation's name and output.
///
/// What a request may hold before its signature is verified is bounded: its headers are
/// checked first (a SigV4 `Authorization` of a known key, dated now), then its body is read
/// within `body_timeout`, at most `body_bytes_max`, under the gateway's budget of
/// unauthenticated bytes.
async fn serve(state: &State, request: Request) -> Result<(String, serde_json::Value), SqsError> {
    let (parts, body) = request.into_parts();
    let now = SystemTime::now();
    let mut signed = sigv4::Signed {
        method: parts.method.as_str(),
        path: parts.uri.path(),
        query: parts.uri.query().unwrap_or_default(),
        headers: parts
            .headers
            .iter()
            .map(|(n, v)| {
                (
                    n.as_str().to_string(),
                    String::from_utf8_lossy(v.as_bytes()).into_owned(),
                )
            })
            .collect(),
        body: &[],
    };
    let claimed = sigv4::claimed(&signed, now)
        .map_err(signature_error)
        .and_then(|claim| {
            Ok((
                state
                    .keys
                    .get(&claim.key_id)
                    .ok_or_else(SqsError::unknown_key)?,
                claim,
            ))
        });
    let (key, claim) = match claimed {
        Ok(claimed) => claimed,
        Err(error) => {
            state.discard(body).await;
            return Err(error);
        }
    };
    let (body, unverified) = state.read_body(body).await?;
    signed.body = &body;
    sigv4::verify(&signed, &key.secret, now).map_err(signature_error)?;
    drop(unverified);
    let _permit = state.requests.try_acquire().map_err(|_| {
        SqsError::throttled("the gateway serves its most requests at once (gateway_requests_max)")
    })?;
    let _share = KeyShare::take(state, &key.id)?;
    let (action, input) = match parts.headers.get("x-amz-target") {
        Some(target) => {
            let target = String::from_utf8_lossy(target.as_bytes());
            let action = target
                .strip_prefix("AmazonSQS.")
                .ok_or_else(|| SqsError::unknown_action(&target))?
                .to_string();
            let input: serde_json::Value = if body.is_empty() {
                serde_json::json!({})
            } else {
                serde_json::from_slice(&body)
                    .map_err(|e| SqsError::invalid(format!("the body is not JSON: {e}")))?
            };
            (action, input)
        }
        None => {
            let form = parts.headers.get("content-type").is_some_and(|t| {
                t.as_bytes()
                    .starts_with(b"application/x-www-form-urlencoded")
            });
            let body = if form { &body[..] } else { &[] };
            let mut params = query::params(signed.query, body, state.config.query_params_max)?;
            // A presigned request's signature parameters are not the operation's.
            params.retain(|(name, _)| !name.starts_with("X-Amz-"));
            // The query protocol may address a queue by the request's path, its URL's.
            let at_queue = parts.uri.path().trim_matches('/').contains('/');
            let action = params
                .iter()
                .find(|(name, _)| name == "Action")
                .map(|(_, value)| value.clone())
                .filter(|action| !action.is_empty());
            let action = match action {
                Some(action) if at_queue && !api::served_at_a_queue(&action) => {
                    return Err(SqsError::unknown_action(&action));
                }
                Some(action) => action,
                None if at_queue => return Err(SqsError::unknown_operation()),
                None => return Err(SqsError::missing("Action")),
            };
            let mut input = query::to_input(&params)?;
            if at_queue && input.get("QueueUrl").is_none() {
                input["QueueUrl"] = parts.uri.path().into();
            }
            (action, input)
        }
    };
    if !input.is_object() {
        return Err(SqsError::invalid("the body must be a JSON object"));
    }
    let host = parts
        .headers
        .get("host")
        .map(|h| String::from_utf8_lossy(h.as_bytes()).into_owned())
        .unwrap_or_else(|| state.config.listen.to_string());
    let trace = parts
        .headers
        .get("x-amzn-trace-id")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    let home = &state.config.region;
    let caller = Caller {
        key_id: claim.key_id,
        secret: key.secret.clone(),
        namespace: key.namespace.clone(),
        region: Some(claim.region).filter(|region| region != home),
        host,
        trace,
    };
    let value = api::dispatch(state, &caller, &action, &input).await?;
    Ok((action, value))
}

/// One request's place in its access key's share of the request slots; given back when
/// dropped.
struct KeyShare<'a> {
    state: &'a State,
    key: &'a str,
}

impl<'a> KeyShare<'a> {
    fn take(state: &'a State, key: &'a str) -> Result<KeyShare<'a>, SqsError> {
        let mut by_key = state.lock_by_key();
        let held = by_key.entry(key.to_string()).or_default();
        if *held >= state.config.requests_per_key_max {
            return Err(SqsError::throttled(format!(
                "access key {key} has {held} requests served at once, its most \
                 (gateway_requests_per_key_max)"
            )));
        }
        *held += 1;
        Ok(KeyShare { state, key })
    }
}

impl Drop for KeyShare<'_> {
    fn drop(&mut self) {
        let mut by_key = self.state.lock_by_key();
        if let Some(held) = by_key.get_mut(self.key) {
            *held = held.saturating_sub(1);
            if *held == 0 {
                by_key.remove(self.key);
            }
        }
    }
}

impl State {
    /// The per-key counts; a poisoned lock is taken as it is (plain counters, each change
    /// made whole under the lock, and a drop cannot answer an error).
    fn lock_by_key(&self) -> std::sync::MutexGuard<'_, HashMap<String, u32>> {
        self.by_key.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Reads what comes of a refused request's body and keeps none of it, for at most
    /// `body_timeout`: a client sends its whole body before it reads the answer, and
    /// closing on it would lose the answer.
    async fn discard(&self, mut body: Body) {
        let drain = async { while let Some(Ok(_)) = body.frame().await {} };
        let _ = tokio::time::timeout(self.config.body_timeout, drain).await;
    }

    /// The body of a request whose headers passed, read within the bounds [`serve`] names,
    /// and its share of the unauthenticated budget (held until the signature is verified).
    async fn read_body(
        &self,
        body: Body,
    ) -> Result<(Bytes, tokio::sync::SemaphorePermit<'_>), SqsError> {
        let limit = self.config.body_bytes_max;
        // hyper knows the length from `Content-Length` (or that there is no body); a
        // chunked body's is unknown.
        let declared = axum::body::HttpBody::size_hint(&body).upper();
        if declared.is_some_and(|length| length > limit as u64) {
            self.discard(body).await;
            return Err(SqsError::too_large(limit));
        }
        // A body of unknown length (chunked) reserves the largest it may be.
        let reserve = declared.unwrap_or(limit as u64);
        let permit = u32::try_from(reserve)
            .ok()
            .and_then(|bytes| self.unauthenticated.try_acquire_many(bytes).ok());
        let Some(permit) = permit else {
            self.discard(body).await;
            return Err(SqsError::throttled(
                "the gateway holds its most bytes of requests not verified yet \
                 (gateway_unauthenticated_bytes_max)",
            ));
        };
        let read = http_body_util::Limited::new(body, limit).collect();
        let body = match tokio::time::timeout(self.config.body_timeout, read).await {
            Err(_) => return Err(SqsError::body_timeout(self.config.body_timeout)),
            Ok(Err(error)) if error.is::<http_body_util::LengthLimitError>() => {
                return Err(SqsError::too_large(limit));
            }
            Ok(Err(error)) => {
                return Err(SqsError::invalid(format!(
                    "the body could not be read: {error}"
                )));
            }
            Ok(Ok(collected)) => collected.to_bytes(),
        };
        Ok((body, permit))
    }
}

fn signature_error(error: sigv4::SignatureError) -> SqsError {
    use sigv4::SignatureError as E;
    let message = error.to_string();
    match error {
        E::Missing(_) => SqsError::unsigned(message),
        E::Malformed(_) => SqsError::incomplete_signature(message),
        E::UnknownKey(_) => SqsError::unknown_key(),
        E::Mismatch => SqsError::signature_mismatch(message),
        E::Expired(_) | E::PresignedExpired(..) => SqsError::expired(message),
        E::ContentHashMismatch => SqsError::content_hash_mismatch(message),
    }
}
