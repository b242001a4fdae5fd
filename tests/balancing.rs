//! Selection through the real broker: each policy's exact sequence and spread.

mod common;

use common::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn round_robin_follows_the_smooth_weighted_sequence() {
    let a = TestServer::start("a").await;
    let b = TestServer::start("b").await;
    let mut ini = ini_for(&[], "SORT_METHOD=ROUND_ROBIN");
    ini.push_str(&format!(
        "REMOTE_SERVER_01={} 1\nREMOTE_SERVER_02={} 3\n",
        a.ini(),
        b.ini()
    ));
    let broker = Broker::start(&ini).await;
    let mut order = Vec::new();
    for _ in 0..8 {
        order.push(ask(broker.addr()).await.unwrap());
    }
    assert_eq!(order, ["b", "a", "b", "b", "b", "a", "b", "b"]);
}
