//! A TigerBeetle replica stops accepting connections, for every client, while
//! all its connection slots are held by peers that send nothing, and never
//! frees them by itself: no `ratelimiterd` involved, only bare TCP
//! connections and the client library, on a real replica.
//!
//! A replica serves at most `replicas − 1 + clients_limit` connections
//! (TigerBeetle 0.16, `src/message_bus.zig`, `connections_max`;
//! `clients_limit` = 8 + `--limit-pipeline-requests`, 32 for the local
//! cluster) and calls `accept` only while one is free. A connection on which
//! nothing arrives keeps its slot until its peer closes it (the bus has no
//! idle timeout, and TCP keepalive is answered by any live peer). A proxy
//! that accepts a server's connections during a black hole and opens one to
//! the replica for each, passing no byte, makes such connections; so does any
//! client that opens connections and sends nothing. Meanwhile a client whose
//! connection waits in the accept queue sees it established, sends its
//! registration into it, and is never answered. The write-up for upstream is
//! docs/tigerbeetle-backend.md, "A replica's connection slots".

#![cfg(feature = "tigerbeetle")]

use std::net::TcpStream;
use std::time::{Duration, Instant};

use ratelimiter::tigerbeetle::{client as tb, LocalCluster};

/// The connections a replica of the local cluster serves at once:
/// 1 replica − 1 + 8 + `--limit-pipeline-requests=24` (the harness's flag).
const REPLICA_CONNECTIONS_MAX: usize = 32;
/// How long a client is given to be answered by a replica that has a free
/// slot: a fresh client is first answered when it resends, about 650 ms
/// after it registers; this is ten times that, for a loaded machine.
const ANSWER_WAIT: Duration = Duration::from_secs(7);
/// How long the test waits for an answer that must not come.
const NO_ANSWER_WAIT: Duration = Duration::from_secs(5);

/// Whether a fresh client's lookup is answered within `wait`.
async fn answered_within(client: &tb::Client, wait: Duration) -> bool {
    tokio::time::timeout(wait, client.lookup_accounts(vec![1u128]))
        .await
        .is_ok_and(|answer| answer.is_ok())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_whose_connection_slots_are_held_by_silent_peers_answers_no_new_client() {
    let cluster = LocalCluster::start().expect("a local TigerBeetle replica");
    let address = cluster.address().to_owned();
    let before = tb::Client::new(0, address.as_str()).expect("a client");
    assert!(answered_within(&before, ANSWER_WAIT).await, "the replica answers");
    drop(before);

    // Bare connections that send nothing: the replica accepts each (one per
    // 10 ms tick) and then has no slot left.
    let silent: Vec<TcpStream> = (0..REPLICA_CONNECTIONS_MAX)
        .map(|_| TcpStream::connect(address.as_str()).expect("the port accepts"))
        .collect();
    tokio::time::sleep(Duration::from_millis(500)).await;

    let started = Instant::now();
    let stranded = tb::Client::new(0, address.as_str()).expect("a client");
    assert!(
        !answered_within(&stranded, NO_ANSWER_WAIT).await,
        "a client was answered while {REPLICA_CONNECTIONS_MAX} silent connections held the replica's slots"
    );
    println!(
        "{REPLICA_CONNECTIONS_MAX} silent connections: a fresh client unanswered after {:?}",
        started.elapsed()
    );

    // The slots come free only when the silent peers close: the waiting
    // client's connection is accepted then, and its registration answered.
    drop(silent);
    let freed = Instant::now();
    assert!(
        answered_within(&stranded, ANSWER_WAIT).await,
        "the client is answered once the silent connections closed"
    );
    println!(
        "silent connections closed: the client answered after {:?}",
        freed.elapsed()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_with_one_slot_free_still_answers_a_new_client() {
    let cluster = LocalCluster::start().expect("a local TigerBeetle replica");
    let address = cluster.address().to_owned();
    // One fewer than the slots: the replica still accepts.
    let silent: Vec<TcpStream> = (0..REPLICA_CONNECTIONS_MAX - 1)
        .map(|_| TcpStream::connect(address.as_str()).expect("the port accepts"))
        .collect();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let client = tb::Client::new(0, address.as_str()).expect("a client");
    assert!(
        answered_within(&client, ANSWER_WAIT).await,
        "a client is answered while a slot is free"
    );
    drop(silent);
}
