//! The consumer loop: one per queue and generation (a queue's connection
//! and channel), on its own channel.
//!
//! The loop's state is [`Generation`](generation::Generation); where it is
//! in its life is its [`Phase`](phase::Phase) — consuming, stopping (the
//! drain stopped intake), the cancel answered (the broker answered the
//! drain's `basic.cancel`), or lost — a named state whose transitions are
//! methods (`stop`, `answer_cancel`, `lose`): it only moves forward, and a
//! lost generation stays lost. One hand-written poll drives it, as rounds
//! of named steps. Its rules:
//!
//! - **Intake.** The stream is read eagerly into the generation's buffer
//!   (the broker sends at most `prefetch` ahead), so the end of the stream —
//!   a lost channel or connection, a broker-sent cancel — is seen at once,
//!   not after the buffer has been worked through. A delivery goes into
//!   the stack only while the channel lives and the stack is ready; the
//!   queue's concurrency limit (one limit shared by every generation of
//!   the queue) is taken at the stack's claim point, so a delivery an
//!   outer layer holds takes none.
//! - **Loss.** The moment the channel (or its connection) is known gone,
//!   or the broker cancelled the consumer outside a drain (its unsettled
//!   deliveries are the broker's again), the generation is lost: no new handler starts, the buffer is dropped
//!   (the broker has taken it back), running handlers are cancelled through
//!   their tokens (`abandon_after` applies), and every outcome that arrives
//!   afterwards is an orphan: counted, logged at debug, never settled, never
//!   published (the retry and dead-letter layers read the lifeline too),
//!   so a late outcome never clears a strike. Until a cancelled handler
//!   ends, the queue's next generation does not start its message again.
//! - **Hand-back.** Under `hand_back`, once the drain has stopped intake no
//!   new handler starts; what is buffered is handed back only after the
//!   broker answered `basic.cancel` (a delivery requeued to a still
//!   registered consumer would come straight back). So is every delivery
//!   still held in the stack before its claim (an outer `Buffer`, a key's
//!   turn): its future races the claim and, winning, resolves at once; the
//!   same happens at the drain's deadline and on a loss.
//! - **Settling.** Every outcome goes through the settle ledger, the only path
//!   that settles: acks coalesce into `multiple` runs, nacks and rejects go
//!   singly at their turn; held outcomes are flushed on the count, the time
//!   bound, when the loop is idle with the prefetch window used up (the
//!   broker then sends nothing until a settle), when intake stops, when the broker
//!   answered the cancel, and before the loop ends and closes its channel.
//!   A handler's concurrency permit is released when the stack below the
//!   claim returns, before its settle is sent — or earlier, once a rung or
//!   dead-letter copy is sent and only its confirm is awaited (the delivery
//!   is then confirming: still in flight, settled after the confirm).
//!
//! # Inside
//!
//! - `run`: [`ConsumerLoop`], what a generation's loop is built from, and
//!   its `run`: set-up, the rounds, the close of the channel;
//! - `rounds`: one poll of the loop, as rounds of named steps in a fixed
//!   order (signals, intake, finished handlers, hand-back, starts, flush,
//!   settles);
//! - `generation`: the generation's state and its transitions, and [`End`];
//! - `phase`: where the generation is in its life (consuming, stopping,
//!   the cancel answered, lost) and the transitions between those;
//! - `handler`: one handler's future ([`Released`] says when the pause gate
//!   let it through);
//! - `stats`: the queue's counters ([`QueueStats`]) and metric handles;
//! - `strikes`: which delivery a broker's acknowledgement timeout was
//!   about, and the queue's bounded memory of struck messages;
//! - `taken`: the messages still running in a generation whose
//!   deliveries the broker took back, which the next one does not start
//!   until they end;
//! - `struck`: the wrapper that tells the stack about a message struck
//!   before (dead-lettered as `consumer-timeout` once it has struck out);
//! - `stream_loop`: a stream generation's loop ([`StreamLoop`]): its
//!   partitions' subscriptions read through the stack, credit, offset
//!   stores, and the drain's last store, confirmed before the
//!   subscriptions end;
//! - `stream_sac`: the loop's answers to a single active consumer's
//!   updates (active: read from the stored offset; no longer: store what
//!   settled, leave the rest to the next consumer);
//! - `offsets`: a stream partition's settled and stored offsets;
//! - `stream_delivery`: a stream message as a delivery
//!   ([`StreamOffsetOf`]).

mod generation;
mod handler;
mod offsets;
mod phase;
mod rounds;
mod run;
mod stats;
mod stream_delivery;
mod stream_loop;
mod stream_sac;
mod strikes;
mod struck;
mod taken;
mod watched;

pub(crate) use generation::End;
pub(crate) use handler::Released;
pub(crate) use run::ConsumerLoop;
pub(crate) use stats::QueueStats;
pub use stream_delivery::StreamOffsetOf;
pub(crate) use stream_loop::{Partition, StreamLoop, INITIAL_CREDIT};
